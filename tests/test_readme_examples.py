"""Every `moesim ...` example in the README's code blocks runs, in the order written, in
a fresh folder (issue 12, item 2): the what-ifs of one scenario each get a folder of
their own instead of refusing the previous one's.

The examples run as tests/doc_examples.py runs every page's (tests/test_docs_examples.py
does docs/); here also: each `run` prints the folder it wrote, and no two share one."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.doc_examples import fresh_folder, page_examples, run_example

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands() -> list[list[str]]:
    """argv lists (without ``moesim``) of the moesim commands among the README's examples,
    in order (tests/doc_examples.py finds them: ``bash`` blocks and ``$ `` prompts)."""
    cmds = []
    for ex in page_examples(README):
        for part in ex.command.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0] == "moesim":
                cmds.append(words[1:])
    return cmds


def test_readme_commands_are_found():
    cmds = readme_commands()
    runs = [c for c in cmds if c[0] == "run"]
    assert runs[0] == ["run", "scenarios/hot-expert.yaml", "-o", "out/hot"]
    assert len(runs) >= 6
    assert ["calibrate", "traces/uniform", "traces/uniform-repeat", "-o", "calib.json"] in cmds
    # what-ifs of one scenario, no -o: each gets a folder of its own
    assert sum(1 for c in runs if c[1] == "hot-expert" and "--no-files" not in c) >= 3
    # the memory example shows a difference: the shipped recipe, then without it
    mem = [c for c in cmds if c[0] == "memory"]
    assert len(mem) >= 2 and mem[0] != mem[1], mem
    # every other command of the table is reached from the README or a guide it links
    assert {c[0] for c in cmds} >= {"run", "serve", "rl", "memory", "calibrate", "validate"}


@pytest.mark.slow
def test_readme_examples_run_in_order_in_a_fresh_folder(tmp_path, monkeypatch, capsys):
    folder = fresh_folder(tmp_path)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    folders = []
    for ex in page_examples(README):
        if ex.skip_reason():
            continue
        for r in run_example(ex, folder, capsys):
            argv = r.argv[1:]
            if r.argv[0] == "moesim" and argv[0] == "run" and "--no-files" not in argv:
                m = re.search(r"wrote (\S+)/ \(summary\.md", r.out) or re.search(
                    r"^moesim run: wrote (\S+)/$", r.err, re.M)
                assert m, (r.out[-300:], r.err[-300:])   # the folder is printed
                folders.append(m.group(1))
                assert (folder / m.group(1) / "summary.json").is_file()
    assert len(folders) == len(set(folders)), folders   # each what-if has its own folder
    assert "out/hot" in folders
    assert (folder / "calib.json").is_file() and (folder / "out/val/overlay.png").is_file()


def test_readme_memory_example_fits_as_shipped_and_not_without_the_recipe(capsys):
    """The README's memory example: the shipped scenario fits; the same layout without
    DeepSeek's recompute and FP8-activation recipe is over capacity, as the README says."""
    from moesim.cli import main

    mem = [c for c in readme_commands() if c[0] == "memory"][:2]
    verdicts = []
    for argv in mem:
        assert main(argv) == 0, argv
        rows = [ln.split() for ln in capsys.readouterr().out.splitlines()
                if ln.split() and ln.split()[0].isdigit()]     # one row per stage
        verdicts.append({r[-1] for r in rows})
    assert verdicts == [{"ok"}, {"OOM"}], verdicts
