"""Suite-wide settings. Hypothesis's per-example deadline (200 ms by default) is a
wall-clock assertion: on a loaded machine it fails tests that are right, so it is off
for every property test (issue 20, item 5; tests/test_suite_rules.py checks)."""

from hypothesis import settings

settings.register_profile("moesim", deadline=None)
settings.load_profile("moesim")

# Step-cost surfaces (moesim.load.surface) are cached on disk: the suite keeps its cache in
# a folder of its own, never in the user's ~/.cache (subprocesses inherit the variable).
import os  # noqa: E402
import tempfile  # noqa: E402

os.environ.setdefault("MOESIM_CACHE", tempfile.mkdtemp(prefix="moesim-test-cache-"))
