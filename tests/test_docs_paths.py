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
    assert main(["memory", "hot-expert", "--set", "parallel.ep=3"]) == 2
    err = capsys.readouterr().err
    assert "error: scenarios/hot-expert.yaml: parallel.ep:" in err, err
    assert main(["topology", "dgx-h100", "--set", "nvlink_efficiency=1.2"]) == 2
    err = capsys.readouterr().err
    assert "error: topologies/dgx-h100.yaml: params.nvlink_efficiency:" in err, err
    assert main(["topology", "dgx-h100"]) == 0
    assert "source: topologies/dgx-h100.yaml" in capsys.readouterr().out
