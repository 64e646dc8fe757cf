"""Install weight: the test extra does not pull torch, the simulator runs without it,
the tests that need torch are marked and say why they skip, and CI runs the README's
test command and then the torch tests (issue 12, items 1 and 3)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def _expand(extra: str, seen: set[str] | None = None) -> list[str]:
    """The requirements of ``extra``, following ``moesim[...]`` references."""
    seen = set() if seen is None else seen
    out = []
    for req in EXTRAS[extra]:
        m = re.fullmatch(r"moesim\[([\w,\s-]+)\]", req)
        if m:
            for sub in m.group(1).split(","):
                if sub.strip() not in seen:
                    seen.add(sub.strip())
                    out += _expand(sub.strip(), seen)
        else:
            out.append(req)
    return out


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in reqs}


def test_test_and_dev_extras_do_not_pull_torch():
    assert "torch" not in _names(_expand("test"))
    assert "torch" not in _names(_expand("dev"))
    assert _names(_expand("torch")) == {"torch"}
    assert "torch" not in _names(PYPROJECT["project"]["dependencies"])


def test_notebooks_extra_installs_jupyterlab():
    """The README opens the notebooks with `jupyter lab notebooks/`."""
    assert "jupyterlab" in _names(_expand("notebooks"))
    readme = (ROOT / "README.md").read_text()
    assert "jupyter lab notebooks/" in readme and "'.[notebooks]'" in readme


def _imports_torch(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in tree.body:    # module level only: imports inside functions run on demand
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            return True
    return False


def test_tests_needing_torch_are_marked_and_skip_with_a_reason():
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        if path.name == Path(__file__).name:
            continue
        needs = _imports_torch(path) or 'importorskip("torch"' in text
        if not needs:
            continue
        # the whole module, or (a module with a few torch tests) each test that skips
        tests_marked = re.findall(r'@pytest\.mark\.torch\s*\n(?:@[^\n]*\n)*def (\w+)', text)
        assert "pytestmark = pytest.mark.torch" in text or tests_marked, \
            f"{path.name}: not marked torch"
        assert re.search(r'importorskip\("torch",\s*reason=', text), \
            f"{path.name}: skips without saying why"
        if "pytestmark = pytest.mark.torch" not in text:   # every skipping test is marked
            for name in re.findall(r'def (test_\w+)\([^)]*\):(?:(?!\ndef ).)*?importorskip\("torch"',
                                   text, flags=re.S):
                assert name in tests_marked, f"{path.name}::{name}: not marked torch"


def test_only_the_recorder_imports_torch_at_module_level():
    allowed = {"moesim/validation/recorder/moe_layer.py"}   # imported by `moesim record` only
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "moesim").rglob("*.py")
             if _imports_torch(p)}
    assert found <= allowed


def test_simulator_imports_and_runs_without_torch(tmp_path):
    """Every module but the recorder's layer imports with torch made unimportable, and
    `moesim run` completes."""
    code = "\n".join([
        "import importlib, pkgutil, sys",
        "sys.modules['torch'] = None",          # `import torch` now raises ImportError
        "import moesim",
        "skip = {'moesim.validation.recorder.moe_layer', 'moesim.__main__'}",
        "for m in pkgutil.walk_packages(moesim.__path__, 'moesim.'):",
        "    if m.name not in skip:",
        "        importlib.import_module(m.name)",
        "from moesim.cli import main",
        "assert main(['run', 'toy-cpu', '--no-files', '--quiet']) == 0",
    ])
    env = {"PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "toy-cpu: step" in r.stdout


def test_ci_runs_the_readme_test_command_then_the_torch_tests():
    readme = (ROOT / "README.md").read_text().splitlines()
    block = readme[readme.index("```bash") + 1:]
    test_line = block[1]
    assert test_line == "pip install -e '.[test]' && python -m pytest -q -rs"   # -rs: skip reasons
    ci = [c.strip() for c in (ROOT / ".ci" / "run").read_text().splitlines()
          if c.strip() and not c.lstrip().startswith("#")]
    i = next(i for i, c in enumerate(ci) if c.startswith(test_line))
    assert ci[i] in (test_line, test_line + " || exit $?")   # verbatim, failure ends CI
    rest = "\n".join(ci[i + 1:])
    assert "pip install -q -e '.[torch]'" in rest
    assert "pytest -q -m torch" in rest
    assert "-ne 5" in rest     # "no tests collected" is not a failure
