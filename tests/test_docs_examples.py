"""Every shell example of every page under docs/ runs, in the order written, in a fresh
folder (issue 20, item 6): a page's examples must not depend on a file that a later
example creates, nor overwrite what an earlier one wrote, and each documented error line
is what moesim prints. Examples that need torch or DeepSeek's profile are marked on the
page and listed here as skipped, saying why. What counts as an example:
tests/doc_examples.py (shared with tests/test_readme_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_examples import (
    ROOT,
    fresh_folder,
    hidden_commands,
    page_examples,
    run_example,
)

PAGES = sorted((ROOT / "docs").rglob("*.md"))
# pages whose examples run benchmarks or several simulations (tens of seconds on 2 cores)
SLOW = {"collectives.md", "network.md", "validation.md", "sweeps.md", "scenarios.md", "what-ifs.md",
        "serving.md", "deepep.md", "timeline.md", "schedules.md"}


def _param(p: Path):
    marks = [pytest.mark.slow] if p.name in SLOW else []
    return pytest.param(p, id=str(p.relative_to(ROOT / "docs")), marks=marks)


def _not_run() -> list:
    out = []
    for p in [ROOT / "README.md", *PAGES]:
        for ex in page_examples(p):
            why = ex.skip_reason()
            if why and not why.startswith(("installs", "runs the test")):
                out.append(pytest.param(f"{ex.where()} {why}", id=ex.where()))
    return out


@pytest.mark.parametrize("page", [_param(p) for p in PAGES if page_examples(p)])
def test_page_examples_run_in_order_in_a_fresh_folder(page, tmp_path, monkeypatch, capsys):
    folder = fresh_folder(tmp_path)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for ex in page_examples(page):
        if ex.skip_reason() is None:
            run_example(ex, folder, capsys)


@pytest.mark.parametrize("why", _not_run())
def test_examples_not_run_say_why(why):
    pytest.skip(why)


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_example_is_found_and_marked(page):
    # a command in a plain block without a `$ ` prompt would silently not be run
    assert hidden_commands(page) == [], f"{page.name}: put these lines in a ```bash block " \
        "or prefix them with '$ ' (or write a synopsis with FILE-style placeholders)"
    unmarked = [(ex.where(), ex.unmarked()) for ex in page_examples(page) if ex.unmarked()]
    assert unmarked == [], f"mark these examples: {unmarked}"


def test_the_parser_reads_prompts_loops_outputs_and_files(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("\n".join([
        "```yaml file=bad.yaml", "model: {preset: toyy}", "```", "",
        "```bash", "moesim run a \\", "    -o out/a", "for t in x y; do",
        "  moesim validate traces/$t", "done", "```", "",
        "```", "$ moesim memory bad.yaml", "moesim memory: error: bad.yaml: nope",
        "$ moesim topology fat-tree", "fat-tree: 16 GPUs", "moesim record t  # not prompted",
        "```", "", "    $ moesim plot hot", "    wrote zoom.png", ""]))
    exs = page_examples(page)
    assert [(e.line, e.file, e.command, e.expect_error) for e in exs] == [
        (1, "bad.yaml", "model: {preset: toyy}\n", None),
        (6, None, "moesim run a -o out/a", None),
        (9, None, "moesim validate traces/x", None),
        (9, None, "moesim validate traces/y", None),
        (14, None, "moesim memory bad.yaml", "moesim memory: error: bad.yaml: nope"),
        (16, None, "moesim topology fat-tree", None),
        (21, None, "moesim plot hot", None)]
    assert hidden_commands(page) == [18]
