"""Suite-wide settings. Hypothesis's per-example deadline (200 ms by default) is a
wall-clock assertion: on a loaded machine it fails tests that are right, so it is off
for every property test (issue 20, item 5; tests/test_suite_rules.py checks)."""

from hypothesis import settings

settings.register_profile("moesim", deadline=None)
settings.load_profile("moesim")

# Step-cost surfaces (moesim.traffic.surface) are cached on disk: the suite keeps its cache in
# a folder of its own, never in the user's ~/.cache (subprocesses inherit the variable).
import os  # noqa: E402
import tempfile  # noqa: E402

os.environ.setdefault("MOESIM_CACHE", tempfile.mkdtemp(prefix="moesim-test-cache-"))


# The suite writes nothing into the checkout (issue 36, item 8): a test writes under its
# tmp_path (and `-o` into it), never into the working directory it was started from.
# Checked once per session from `git status` (about 10 ms): a path the run left that git
# ignores (out/, build/, ...) or an untracked file at the checkout's top level fails the
# session's last test. Caches are not outputs. Outside a git checkout nothing is checked.
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

_ROOT = Path(__file__).resolve().parent.parent
_CACHES = ("__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".egg-info",
           ".ipynb_checkpoints", ".venv")


# what moesim and its tests write: a folder, or a file of one of these kinds
_OUTPUTS = (".json", ".png", ".csv", ".parquet", ".txt", ".svg", ".html", ".gz", ".pdf")


def left_in_checkout(before: set[str], after: set[str]) -> list[str]:
    """Entries of ``git status --porcelain --ignored`` new in ``after`` that a test run
    made: ignored paths other than caches (out/, build/, ...), and untracked folders or
    output files (``_OUTPUTS``) at the top level. A source file or a page being written
    beside the run, or a download, is not a test's output."""
    out = []
    for entry in sorted(after - before):
        code, path = entry[:2], entry[3:].strip('"')
        if any(c in path for c in _CACHES):
            continue
        top_level = "/" not in path.rstrip("/")
        output = path.endswith("/") or path.endswith(_OUTPUTS)
        if code == "!!" or (code == "??" and top_level and output):
            out.append(path)
    return sorted(out)


def _git_status() -> set[str] | None:
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=_ROOT,
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(r.stdout.splitlines()) if r.returncode == 0 else None


@pytest.fixture(scope="session", autouse=True)
def _nothing_written_into_the_checkout():
    before = _git_status()
    yield
    after = _git_status() if before is not None else None
    if after is not None:
        left = left_in_checkout(before, after)
        assert not left, ("the tests wrote into the checkout (write under tmp_path, "
                          f"-o into it): {left}")
