"""Every notebook in notebooks/ runs top to bottom on small settings (MOESIM_NB_SMALL=1);
a failing cell fails the test with the cell's error."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))


def test_there_are_at_least_three_studies_with_question_setup_and_reading():
    assert len(NOTEBOOKS) >= 3
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        assert "**Question.**" in text and "**Setup.**" in text, path.name
        assert "What the" in text, f"{path.name}: no explanation of what the plots show"
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "MOESIM_NB_SMALL" in code, f"{path.name}: no small-settings switch"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom_on_small_settings(path: Path, monkeypatch):
    monkeypatch.setenv("MOESIM_NB_SMALL", "1")      # the kernel inherits this environment
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()     # raises CellExecutionError naming the failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    if '"full settings"' in "".join(c.source for c in nb.cells):
        assert "small settings" in text, "the kernel did not see MOESIM_NB_SMALL=1"
