"""Issue 20 item 15: paths a user gives. An error in a file that another file names
(a sweep's scenario, a scenario's topology) names both; every command that takes a path
survives the operating system refusing it (a name too long); `plot -o` refuses an
extension it cannot write before drawing, and `plot -o DIR` writes into the folder,
never over a user's DIR.png."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.cli import main
from tests.test_checks_before_work import _one_line

ROOT = Path(__file__).resolve().parent.parent
LONG = "n" * 300          # longer than any file system's 255-byte name limit

BAD_SCENARIO = """\
name: bad
cluster: {topology: dgx-h100, nodes: 1, device: H100, network: flow}
model: {preset: mixtral-8x7b, layers: 2}
parallel: {tp: 1, pp: 1, ep: 8, bogus: 3}
schedule: {kind: 1f1b, microbatches: 2, micro_batch_size: 1, seq_len: 512}
compute: {kind: roofline}
"""


def test_an_error_in_a_named_file_names_the_file_the_user_gave(tmp_path, monkeypatch,
                                                               capsys):
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text(BAD_SCENARIO)
    Path("sw.yaml").write_text("name: sw\nscenario: bad.yaml\naxes:\n"
                               "  routing.zipf_s: [1, 2]\n")
    assert main(["sweep", "sw.yaml", "-o", "o"]) == 2
    _one_line(capsys, "error: bad.yaml (scenario of sw.yaml): parallel.bogus:")
    # a scenario naming a broken topology file
    Path("topo.yaml").write_text("name: t\nnodes: [{id: g0, kind: gpu}]\n"
                                 "links: [{src: g0, dst: nope}]\n")
    Path("s.yaml").write_text(BAD_SCENARIO.replace("topology: dgx-h100, nodes: 1",
                                                   "topology: topo.yaml")
                              .replace(", bogus: 3", ""))
    assert main(["memory", "s.yaml"]) == 2
    _one_line(capsys, "error: topo.yaml (named by s.yaml): links[0]")
    # the file's own errors name only it
    assert main(["memory", "bad.yaml"]) == 2
    assert "(named by" not in _one_line(capsys, "error: bad.yaml: parallel.bogus")


@pytest.mark.parametrize("argv", [
    ["run", LONG], ["memory", LONG], ["layout", LONG, "--rank", "0"], ["topology", LONG],
    ["sweep", LONG], ["compare", LONG, LONG], ["ingest", LONG], ["validate", LONG],
    ["calibrate", LONG, "-o", "x.json"], ["plot", LONG],
    ["collective", "--topology", LONG, "--op", "all_reduce", "--bytes", "1MB"],
    ["run", "toy-cpu", "--no-files", "--set", f"cluster.topology={LONG}"],
])
def test_every_path_taking_command_survives_a_name_too_long(tmp_path, monkeypatch, capsys,
                                                            argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    _one_line(capsys, f"moesim {argv[0]}: error:", "name too long")


def test_plot_output_extension_and_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "toy-cpu", "--quiet", "-o", "r"]) == 0
    capsys.readouterr()
    import moesim.trace.plots as plots  # moesim plot imports it when it draws

    real = plots.plot_timeline
    drawn: list[int] = []
    monkeypatch.setattr(plots, "plot_timeline",
                        lambda *a, **k: drawn.append(1) or real(*a, **k))
    assert main(["plot", "r", "-o", "zoom.xyz"]) == 2       # was a traceback after drawing
    _one_line(capsys, "zoom.xyz: -o: expected a picture file ending in one of", ".png",
              ".svg", "got '.xyz'")
    assert drawn == [] and not Path("zoom.xyz").exists()
    Path("d").mkdir()
    Path("d.png").write_text("mine")
    assert main(["plot", "r", "-o", "d", "--force"]) == 0   # into the folder
    assert "wrote d/zoom.png" in capsys.readouterr().out
    assert Path("d.png").read_text() == "mine" and Path("d/zoom.png").stat().st_size > 0
    assert main(["plot", "r", "-o", "new"]) == 0            # no such folder: new.png
    assert Path("new.png").exists()
