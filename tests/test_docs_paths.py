"""The docs' example outputs show paths relative to the checkout, never this machine's
absolute folders; a shipped scenario or topology is named relative to the working
directory in messages (issue 12, item 4)."""

from __future__ import annotations

import re
from pathlib import Path

from moesim.cli import main

ROOT = Path(__file__).resolve().parent.parent
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|root|home)/")


def test_docs_readme_and_notebooks_show_no_absolute_machine_paths():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
           for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
           if MACHINE_PATH.search(line)]
    assert not bad, "\n".join(bad)


def test_shipped_scenario_and_topology_named_relative_to_the_working_directory(
        capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    # a value from --set is blamed on the command line; the file's own problems name the
    # file by its path relative to the working directory
    assert main(["memory", "hot-expert", "--set", "parallel.ep=3"]) == 2
    err = capsys.readouterr().err
    assert "error: command line: --set parallel.ep:" in err and str(ROOT) not in err, err
    assert main(["run", "hot-expert", "--no-files", "--set", "schedule.microbatches=100000"]) == 2
    err = capsys.readouterr().err
    assert str(ROOT) not in err and "scenarios/hot-expert.yaml" in err or "command line" in err, err
    assert main(["topology", "dgx-h100", "--set", "nvlink_efficiency=1.2"]) == 2
    err = capsys.readouterr().err
    assert "nvlink_efficiency" in err and str(ROOT) not in err, err
    assert main(["topology", "dgx-h100"]) == 0
    assert "source: topologies/dgx-h100.yaml" in capsys.readouterr().out
