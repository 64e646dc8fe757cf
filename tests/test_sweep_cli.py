"""``moesim sweep``: bad input is one line and exit 2; an existing scheduler; --plot-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.cli import main

GOOD = """\
name: cli
scenario: hot-expert
set: [model.layers=1, schedule.microbatches=1]
axes:
  routing.hot_fraction: [0.125, 0.5]
  parallel.ep: [8, 16]
"""


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("moesim sweep: error: ")
    return err[0]


@pytest.mark.parametrize("text,needle", [
    ("axes: [\n", "line 2"),
    ("scenario: hot-expert\naxes:\n  routing.nosuch: [1, 2]\n", "axes.routing.nosuch"),
    ("scenario: nope\naxes:\n  parallel.ep: [8]\n", "nope"),
    ("scenario: hot-expert\nmode: cross\naxes:\n  parallel.ep: [8]\n", "mode"),
])
def test_bad_sweep_file_is_one_line_exit_2(tmp_path: Path, capsys, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    assert main(["sweep", str(f), "-o", str(tmp_path / "o"), "--threads"]) == 2
    line = one_error_line(capsys)
    assert needle in line
    assert not (tmp_path / "o").exists()


def test_bad_flags_and_missing_results(tmp_path: Path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(GOOD)
    assert main(["sweep", str(f), "-o", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert "--workers" in one_error_line(capsys)
    assert main(["sweep", str(f), "-o", str(tmp_path / "o"), "--plot-only"]) == 2
    assert "results.parquet" in one_error_line(capsys)
    assert main(["sweep", str(f), "--scheduler", "tcp://x:1", "--workers", "2"]) == 2
    assert "--scheduler" in one_error_line(capsys)


def test_existing_scheduler_then_plot_only(tmp_path: Path, capsys):
    from distributed import LocalCluster

    f = tmp_path / "s.yaml"
    f.write_text(GOOD)
    out = tmp_path / "o"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                      dashboard_address=":0") as cluster:
        assert cluster.scheduler_address.startswith("tcp://")
        rc = main(["sweep", str(f), "-o", str(out), "--scheduler", cluster.scheduler_address,
                   "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "4 points (ok 2, skipped 2); ran 4, 0 already done" in text
    assert "skipped 2: " in text and "to divide tp*cp*dp = 8" in text
    for name in ("results.parquet", "means.csv", "points.jsonl", "sweep.json", "step_time.png",
                 "heatmap.png"):
        assert (out / name).exists(), name
    (out / "step_time.png").unlink()
    assert main(["sweep", str(f), "-o", str(out), "--plot-only"]) == 0
    assert "redrew" in capsys.readouterr().out and (out / "step_time.png").exists()
