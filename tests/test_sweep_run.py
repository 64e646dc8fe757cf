"""Sweeps on a local Dask cluster: streaming records, skipped and failed points,
resume after a kill, and every point equal to a direct run of that point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import moesim.sweep.runner as runner
from moesim.cli import main
from moesim.sweep.results import POINTS_FILE, load_results, read_records
from moesim.sweep.runner import point_metrics, run_point, run_sweep
from moesim.sweep.spec import expand, load_sweep
from moesim.wiring import simulate

# one layer, one micro-batch: a point takes ~0.2 s
TINY = """\
name: tiny
scenario: hot-expert
set: [model.layers=1, schedule.microbatches=1]
axes:
  routing.hot_fraction: {hf}
  parallel.ep: {ep}
seeds: {seeds}
"""


def sweep_file(tmp_path: Path, hf="[0.125, 0.5]", ep="[8]", seeds="[1, 2]") -> Path:
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY.format(hf=hf, ep=ep, seeds=seeds))
    return f


@pytest.fixture(scope="module")
def client():
    """One in-process Dask cluster (2 worker threads) shared by this module's tests."""
    c = runner.make_client(workers=2, processes=False)
    yield c
    runner._close(c, own=True)


def test_run_point_records_ok_skipped_failed(monkeypatch):
    pts = {"ok": ["model.layers=1", "schedule.microbatches=1", "seed=1"],
           "skip": ["model.layers=1", "parallel.ep=16", "seed=1"]}
    base = {"point_id": "x", "index": 0, "values": {}, "seed": 1, "scenario": "hot-expert"}
    ok = run_point({**base, "overrides": pts["ok"]})
    assert ok["status"] == "ok"
    direct = simulate("hot-expert", pts["ok"])
    assert ok["metrics"] == point_metrics(direct.summary)
    assert ok["metrics"]["stall_fraction"] == pytest.approx(
        direct.summary["breakdown_s"]["stall"] / direct.summary["step_time_s"])
    skip = run_point({**base, "overrides": pts["skip"]})
    assert skip["status"] == "skipped" and "parallel.ep" in skip["reason"]
    assert "metrics" not in skip

    def boom(*a, **k):
        raise ZeroDivisionError("modelled failure")
    monkeypatch.setattr(runner, "simulate", boom)
    bad = run_point({**base, "overrides": pts["ok"]})
    assert bad["status"] == "failed" and bad["error"] == "ZeroDivisionError: modelled failure"
    assert "boom" in bad["traceback"]


def test_sweep_records_skipped_with_reason_and_failed_with_error(tmp_path, client, monkeypatch):
    spec = load_sweep(sweep_file(tmp_path, hf="[0.125, 0.5]", ep="[8, 16]", seeds="[1]"))
    real = runner.simulate

    def flaky(target, overrides, **kw):
        if "routing.hot_fraction=0.5" in overrides:
            raise RuntimeError("injected")
        return real(target, overrides, **kw)
    monkeypatch.setattr(runner, "simulate", flaky)   # in-process workers see the patch
    seen = []
    rep = run_sweep(spec, tmp_path / "out", client=client, quiet=True, on_record=seen.append)
    # (0.125, 8) ok; (0.125, 16) skipped: ep must divide tp*cp*dp = 8; (0.5, *) failed (the
    # injected error comes before the scenario is even read)
    assert rep.counts == {"ok": 1, "skipped": 1, "failed": 2}
    assert rep.ran == 4 and len(seen) == 4
    df = load_results(tmp_path / "out")
    assert list(df["parallel.ep"]) == [8, 16, 8, 16]
    assert list(df["status"]) == ["ok", "skipped", "failed", "failed"]
    assert df.loc[1, "reason"].endswith(
        "parallel.ep: expected etp*ep (etp=1, ep=16) to divide tp*cp*dp = 8, the ranks of a "
        "pipeline stage (Megatron-Core parallel folding: etp*ep*edp = tp*cp*dp), got 16")
    assert df.loc[2, "error"] == "RuntimeError: injected"
    assert pd.isna(df.loc[2, "step_time_s"]) and df.loc[0, "step_time_s"] > 0
    # a rerun retries only the failed points (now fine or skipped), the rest are reused
    monkeypatch.setattr(runner, "simulate", real)
    rep2 = run_sweep(spec, tmp_path / "out", client=client, quiet=True)
    assert (rep2.ran, rep2.reused) == (2, 2)
    assert rep2.counts == {"ok": 2, "skipped": 2}


def test_same_seed_same_bytes_and_seed_spread(tmp_path, client):
    spec = load_sweep(sweep_file(tmp_path, hf="[0.3]", seeds="[1, 2, 3]"))
    for d in ("a", "b"):
        run_sweep(spec, tmp_path / d, client=client, quiet=True)
    # means.csv holds no wall-clock column: two runs give the same bytes
    assert (tmp_path / "a/means.csv").read_bytes() == (tmp_path / "b/means.csv").read_bytes()
    df = load_results(tmp_path / "a")
    steps = df["step_time_s"].to_numpy()
    means = pd.read_csv(tmp_path / "a/means.csv")
    assert means.loc[0, "n_seeds"] == 3
    assert means.loc[0, "step_time_s_mean"] == pytest.approx(steps.mean(), rel=1e-12)
    assert means.loc[0, "step_time_s_std"] == pytest.approx(steps.std(ddof=1), rel=1e-9)
    assert means.loc[0, "step_time_s_min"] == steps.min()
    assert len(set(steps)) > 1   # sampled routing: seeds do differ


def test_outdir_with_other_files_is_refused(tmp_path, capsys):
    f = sweep_file(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["sweep", str(f), "-o", str(out), "--threads", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0] and str(out) in err[0]
    assert (out / "notes.txt").read_text() == "mine" and len(list(out.iterdir())) == 1


def _wait_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists():
            k = path.read_bytes().count(b"\n")
            if k >= n:
                return k
        if proc.poll() is not None:
            return -1
        time.sleep(0.02)
    return -2


@pytest.mark.slow
def test_kill_half_way_then_resume_every_point_once_and_equal_to_direct_run(tmp_path, capsys):
    # 5 skew levels x 2 seeds = 10 points on one worker process (default: processes)
    f = sweep_file(tmp_path, hf="[0.125, 0.2, 0.3, 0.4, 0.5]", seeds="[1, 2]")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moesim", "sweep", str(f), "-o", str(out), "--workers", "1",
         "--quiet", "--no-plots"], start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        k = _wait_lines(out / POINTS_FILE, 3, proc, timeout=900)  # catches a hang only
        os.killpg(proc.pid, signal.SIGKILL)   # the sweep, its nanny and worker: a crash
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert k >= 3, f"sweep ended early or too slowly ({k}): {proc.stderr.read()[-2000:]!r}"
    before = read_records(out)
    assert 3 <= len(before) < 10, "killed half-way, not after the end"
    assert not (out / "results.parquet").exists()

    spec = load_sweep(f)
    assert main(["sweep", str(f), "-o", str(out), "--threads", "--workers", "2", "--quiet",
                 "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert f"ran {10 - len(before)}, {len(before)} already done" in text
    lines = (out / POINTS_FILE).read_text().splitlines()
    ids = [json.loads(x)["point_id"] for x in lines]
    assert len(ids) == 10 == len(set(ids)), "every point ran exactly once"
    df = load_results(out)
    assert sorted(df["point_id"]) == sorted(p.point_id for p in expand(spec))
    assert (df["status"] == "ok").all()
    for p in expand(spec):
        row = df[df["point_id"] == p.point_id].iloc[0]
        assert main(["run", "hot-expert", *sum((["--set", o] for o in p.overrides), []),
                     "--json", "--no-files", "--quiet"]) == 0
        ref = json.loads(capsys.readouterr().out)
        assert row["step_time_s"] == ref["step_time_s"]
        assert row["tokens_per_s"] == ref["tokens_per_s"]
        assert row["mfu"] == ref["mfu"]
        for k, v in ref["breakdown_s"].items():
            assert row[f"breakdown_s.{k}"] == v
        assert row["experts.dropped_total"] == ref["experts"]["dropped_total"]
        assert row["memory.peak_bytes_max"] == ref["memory"]["peak_bytes_max"]


def test_progress_lines_unless_quiet(tmp_path, client):
    import io

    spec = load_sweep(sweep_file(tmp_path, hf="[0.3]", seeds="[1, 2]"))
    buf = io.StringIO()
    run_sweep(spec, tmp_path / "p", client=client, stream=buf)
    lines = buf.getvalue().splitlines()
    assert lines and lines[0].startswith("moesim sweep tiny: ")
    assert "100.0% (2/2)" in lines[-1]
    buf = io.StringIO()
    run_sweep(spec, tmp_path / "q", client=client, stream=buf, quiet=True)
    assert buf.getvalue() == ""


def _instant(point: dict) -> dict:
    return {**{k: point[k] for k in ("point_id", "index", "values", "seed")},
            "status": "ok", "metrics": {"step_time_s": 1.0}, "sim_wall_s": 0.0}


def test_progress_in_a_log_is_a_few_lines_not_one_per_point(tmp_path, client):
    """40 points into a log (not a terminal): a line at 10, 20, 30 and 40 points done
    (a quarter each), none repeated, whatever the timing."""
    import io

    hf = "[" + ", ".join(f"{0.1 + 0.01 * i:.2f}" for i in range(20)) + "]"
    spec = load_sweep(sweep_file(tmp_path, hf=hf, seeds="[1, 2]"))
    buf = io.StringIO()
    run_sweep(spec, tmp_path / "log", client=client, stream=buf, point_fn=_instant)
    lines = buf.getvalue().splitlines()
    assert [ln.split("(")[1].split(")")[0] for ln in lines] == ["10/40", "20/40", "30/40",
                                                                "40/40"]
    assert len(set(lines)) == len(lines)
