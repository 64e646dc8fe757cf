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


# ---------------------------------------------------------------- the output convention

OOMY = """\
name: oomy
scenario: hot-expert
set: [model.layers=1, schedule.microbatches=1]
axes:
  schedule.micro_batch_size: [1, 64]
"""


def test_summary_files_and_memory_verdicts(tmp_path: Path, capsys):
    """summary.md and summary.json beside the data; each point's memory verdict counted:
    one warning line on stderr with the count, --strict exit 2 in one line. The verdict
    is the point's own: peak bytes over the device's, as results.parquet has them."""
    import json

    from moesim.outputs import run_manifest
    from moesim.sweep.results import load_results

    f = tmp_path / "oomy.yaml"
    f.write_text(OOMY)
    out = tmp_path / "o"
    assert main(["sweep", str(f), "-o", str(out), "--threads", "--quiet", "--no-plots"]) == 0
    cap = capsys.readouterr()
    warn = [ln for ln in cap.err.splitlines() if "warning" in ln]
    assert warn == ["moesim sweep: warning: 1 of 2 points do not fit in device memory (oom in "
                    "summary.json and results.parquet; --strict makes this exit 2)"]
    df = load_results(out)
    over = df["memory.peak_bytes_max"] > df["memory.capacity_bytes"]
    assert list(over) == [False, True] and list(df["oom"]) == [False, True]
    s = json.loads((out / "summary.json").read_text())
    assert (s["oom"], s["oom_points"], s["memory_checked"]) == (True, 1, 2)
    assert s["oom_at"] == [{"schedule.micro_batch_size": 64, "seed": 1}]   # default seeds [1]
    assert [m["step_time_s_mean"] for m in s["means"]] == list(df["step_time_s"])
    assert run_manifest(out)["command"] == "sweep"
    assert set(run_manifest(out)["files"]) == {"summary.json", "summary.md", "points.jsonl",
                                               "sweep.json", "results.parquet", "means.csv"}
    md = (out / "summary.md").read_text()
    assert "**1 of 2 points do not fit in device memory**" in md
    assert "- schedule.micro_batch_size=64, seed=1" in md
    # the same sweep again resumes into its own folder; --strict: exit 2, one line
    assert main(["sweep", str(f), "-o", str(out), "--quiet", "--strict", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim sweep: error: command line: --strict")
    assert "1 of 2 points do not fit" in err[0]


def test_no_files_and_json(tmp_path: Path, capsys, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    f = tmp_path / "s.yaml"
    f.write_text(GOOD)
    assert main(["sweep", str(f), "--threads", "--no-files", "--json"]) == 0
    cap = capsys.readouterr()
    s = json.loads(cap.out)
    assert s["sweep"] == "cli" and s["counts"] == {"ok": 2, "skipped": 2}
    assert sorted(tmp_path.iterdir()) == [f]          # nothing written, out/ not made
    assert cap.err == ""                             # --json: quiet on stderr too
    assert main(["sweep", str(f), "--no-files", "-o", str(tmp_path / "x")]) == 2
    assert "--no-files" in one_error_line(capsys)


def test_another_sweeps_or_commands_folder_is_refused(tmp_path: Path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(GOOD)
    out = tmp_path / "o"
    assert main(["run", "toy-cpu", "--quiet", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["sweep", str(f), "-o", str(out), "--threads", "--quiet"]) == 2
    assert "the outputs of `moesim run`" in one_error_line(capsys)
    g = tmp_path / "t.yaml"
    g.write_text(OOMY)
    assert main(["sweep", str(g), "-o", str(tmp_path / "p"), "--threads", "--quiet",
                 "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["sweep", str(f), "-o", str(tmp_path / "p"), "--threads", "--quiet"]) == 2
    assert "another scenario or settings" in one_error_line(capsys)


def test_an_interrupted_sweeps_folder_resumes_only_the_same_sweep(tmp_path: Path, capsys):
    """A folder a sweep was killed in (sweep.json and points.jsonl, no summary yet) is
    that sweep's: the same sweep resumes there, another is refused in one line."""
    import json

    from moesim.sweep.runner import check_sweep_folder
    from moesim.sweep.spec import load_sweep

    f, g = tmp_path / "s.yaml", tmp_path / "t.yaml"
    f.write_text(GOOD)
    g.write_text(OOMY)
    out = tmp_path / "killed"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"name": "cli"}))
    (out / "points.jsonl").write_text("")
    assert check_sweep_folder(load_sweep(f), out) == out
    assert main(["sweep", str(g), "-o", str(out), "--threads", "--quiet"]) == 2
    assert "the folder of sweep 'cli'" in one_error_line(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["points.jsonl", "sweep.json"]
