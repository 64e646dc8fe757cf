"""The suite writes nothing into the checkout (issue 36, item 8): tests/conftest.py
compares `git status --porcelain --ignored` before and after the session. What its
filter counts as a test's output, worked by hand."""

from tests.conftest import left_in_checkout


def test_outputs_are_found_and_caches_and_sources_are_not():
    before = {"!! .hypothesis/", "!! moesim/__pycache__/", " M README.md"}
    after = before | {
        "!! out/",                          # a run's default folder: ignored, an output
        "?? calib.json",                    # a file written at the top level
        "!! moesim/traffic/__pycache__/",      # a cache
        "!! .pytest_cache/",                # a cache
        "?? moesim/traffic/window.py",         # a module being written beside the run
        "?? CHANGELOG.md",                  # a page being written beside the run
        "?? my-traces/",                    # a folder written at the top level
        "?? zoom.png",                      # a plot written at the top level
        "?? ruff-0.17.6-py3-none-any.whl",  # a download beside the run
    }
    assert left_in_checkout(before, after) == ["calib.json", "my-traces/", "out/", "zoom.png"]
    assert left_in_checkout(after, after) == []
