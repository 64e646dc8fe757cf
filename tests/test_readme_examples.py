"""Every `moesim ...` example in the README's code blocks runs, in the order written, in
a fresh folder (issue 12, item 2): the what-ifs of one scenario each get a folder of
their own instead of refusing the previous one's.

The exact-engine runs of mixtral-8x7b-64gpu take 15-30 s each here; nothing in the
README's code blocks takes over a minute, so none is skipped (the deepseek-v3-2048 run
of the benchmark table, ~55 s on the fast path, is in a table, not a code block)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from moesim.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def readme_commands(text: str) -> list[list[str]]:
    """argv lists (without ``moesim``) of the moesim commands in the README's fenced code
    blocks, in order: lines of a ``bash`` block, or ``$ ``-prompted lines of an output
    block; a ``pip install ... && moesim ...`` line gives its moesim part."""
    cmds = []
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0] == "moesim":
                cmds.append(words[1:])
    return cmds


def test_readme_commands_are_found():
    cmds = readme_commands(README.read_text())
    runs = [c for c in cmds if c[0] == "run"]
    assert runs[0] == ["run", "scenarios/hot-expert.yaml", "-o", "out/hot"]
    assert len(runs) >= 9
    assert ["calibrate", "traces/uniform", "traces/uniform-repeat", "-o", "calib.json"] in cmds
    # two what-ifs of one scenario, no -o: the case that used to be refused
    assert sum(1 for c in runs if c[1] == "hot-expert" and "--no-files" not in c) >= 3


@pytest.mark.slow
def test_readme_examples_run_in_order_in_a_fresh_folder(tmp_path, monkeypatch, capsys):
    for d in ("scenarios", "topologies", "traces"):
        (tmp_path / d).symlink_to(ROOT / d, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    folders = []
    for argv in readme_commands(README.read_text()):
        rc = main([*argv, "--quiet"] if argv[0] == "run" else argv)
        out, err = capsys.readouterr()
        assert rc == 0, f"moesim {shlex.join(argv)} -> exit {rc}: {err.strip()[-500:]}"
        if argv[0] == "run" and "--no-files" not in argv:
            m = re.search(r"wrote (\S+)/ \(summary\.md", out) or re.search(
                r"^moesim run: wrote (\S+)/$", err, re.M)
            assert m, (out[-300:], err[-300:])   # the folder is printed
            folders.append(m.group(1))
            assert (tmp_path / m.group(1) / "summary.json").is_file()
    assert len(folders) == len(set(folders)), folders   # each what-if has its own folder
    assert "out/hot" in folders
    assert (tmp_path / "calib.json").is_file() and (tmp_path / "out/val/overlay.png").is_file()
