"""moesim validate: a synthetic two-rank trace whose simulated phases are worked out by hand.

Calibration (chosen for round numbers): GEMM 2.56 MFLOP/s, no overhead; memory-bound
1.28 MB/s; all-to-all 10 µs + bytes / 3.2 MB/s. Rows are hidden 8 × float32 = 32 bytes.

Per rank: router matmul (4×8×4: 256 FLOP → 100 µs), softmax (128 bytes → 100 µs),
count exchange (16 bytes each way → 10 + 5 = 15 µs), dispatch (rank 0 sends [4, 1]
rows, rank 1 [4, 1]: 0→1 32 B = 20 µs, 1→0 128 B = 50 µs → 50 µs), experts (up and
down matmuls m×8×16 and m×16×8: 256·m FLOP each → 100·m µs; rank 0 holds 6 + 2 rows,
rank 1 1 + 1 → 1600 µs and 400 µs), combine (0→1 128 B = 50 µs, 1→0 32 B = 20 µs),
backward: combine-grad (as dispatch, 50 µs), one matmul over all rows (8×8×16 → 800 µs;
2×8×16 → 200 µs), dispatch-grad (as combine).

Simulated timeline, both ranks start at 0: router 0–100, softmax 100–200, count
exchange 200–215, dispatch 215–265; rank 0 experts 265–1865, rank 1 265–665; combine
starts when rank 0 arrives (1865) and ends at 1915, so rank 1 stalls 665–1865 waiting on
rank 0 (hot expert 0, 6 tokens); combine-grad 1915–1965; backward matmul rank 0
1965–2765, rank 1 1965–2165; dispatch-grad 2765–2815 (rank 1 stalls 2165–2765).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from moesim.cli import main
from moesim.compute.calibrated import model_from_dict
from moesim.topology.machine import machine_topology
from moesim.validation.cpu.ingest import ingest
from moesim.validation.cpu.replay import build_programs, exchange_matrices
from moesim.validation.cpu.validate import PHASES, relative_error, validate
from tests.test_ingest import _a2a, _mm, _worker, _x

H, F, E, T = 8, 16, 4, 4
SEND = {0: [4, 1], 1: [4, 1]}        # dispatch rows to rank 0, rank 1
RECV = {0: [4, 4], 1: [1, 1]}        # dispatch rows from rank 0, rank 1
LOCAL_M = {0: [6, 2], 1: [1, 1]}     # rows per local expert
CALIB = {"format": "moesim-calibration/1", "device": "cpu",
         "gemm": {"flops_per_s": 2.56e6, "overhead_s": 0.0},
         "memory": {"bytes_per_s": 1.28e6, "overhead_s": 0.0},
         "comm": {"latency_s": 10e-6, "bandwidth_Bps": 3.2e6, "backend": "gloo"}}
US = 1e-6

# measured (trace) times in µs, chosen by hand: see rank_events
MEASURED = {0: {"forward_s": 2040, "backward_s": 960, "dispatch_s": 60, "experts_s": 1700,
                "combine_s": 50},
            1: {"forward_s": 2040, "backward_s": 960, "dispatch_s": 60, "experts_s": 400,
                "combine_s": 1350}}
SIMULATED = {0: {"forward_s": 1915, "backward_s": 900, "dispatch_s": 50, "experts_s": 1600,
                 "combine_s": 50},
             1: {"forward_s": 1915, "backward_s": 900, "dispatch_s": 50, "experts_s": 400,
                 "combine_s": 1250}}


def rank_events(rank: int, slow: float = 1.0) -> list[dict]:
    """One traced step (µs). ``slow`` scales every measured compute duration (the
    simulation must not change: it never reads them)."""
    m0, m1 = LOCAL_M[rank]
    rows_in, rows_out = sum(SEND[rank]), sum(RECV[rank])
    ev = [_x("ProfilerStep#1", 0, 5000, cat="user_annotation"),
          _mm(10, 100 * slow, T, H, E),                                     # router
          _x("aten::softmax", 120, 80 * slow, **{"Input Dims": [[T, E], []],
                                                 "Input type": ["float", ""]}),
          _a2a(210, E, E, [], [], typ="long int", width=0), _worker(211, 20, E, "long int", 0),
          _a2a(240, rows_in, rows_out, SEND[rank], RECV[rank]), _worker(241, 59, rows_in)]
    t = 300.0
    for m in (m0, m1):                                                       # up, down
        ev += [_mm(t, 100 * m * slow, m, H, F), _mm(t + 100 * m, 100 * m * slow, m, F, H)]
        t += 200 * m
    t = max(t, 700.0) if rank else 2000.0                                    # combine issue
    ev += [_a2a(t, rows_out, rows_in, RECV[rank], SEND[rank]),
           _worker(t + 1, 2050 - t - 1, rows_out),
           _x("autograd::engine::evaluate_function: MmBackward0", 2100, 960),
           _a2a(2100, rows_in, rows_out, SEND[rank], RECV[rank]), _worker(2101, 59, rows_in),
           _mm(2170, 100 * rows_out * slow, rows_out, H, F)]
    t = 3000.0 if rank == 0 else 2400.0                                      # dispatch grad
    ev += [_a2a(t, rows_out, rows_in, RECV[rank], SEND[rank]), _worker(t + 1, 3060 - t - 1,
                                                                        rows_out),
           _x("aten::add_", 3200, 20, **{"Input Dims": [[16, H], [16, H], []],
                                         "Input type": ["float", "float", "Scalar"]})]
    return ev


def write_traces(d: Path, slow: float = 1.0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
               "traceEvents": rank_events(r, slow)}
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    return d


def write_calib(path: Path, doc: dict | None = None) -> Path:
    path.write_text(json.dumps(CALIB if doc is None else doc))
    return path


@pytest.fixture()
def traces(tmp_path):
    return write_traces(tmp_path / "t")


def _us(d: dict) -> dict:
    return {k: v * US for k, v in d.items()}


def test_machine_topology_point_to_point_is_latency_plus_bytes_over_bandwidth():
    import simpy

    from moesim.network import FlowNetwork
    topo = machine_topology(3, model_from_dict(CALIB).comm)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    ev = net.transfer(topo.gpus[0], topo.gpus[2], 320.0)
    env.run(ev)
    assert env.now == pytest.approx(10e-6 + 320 / 3.2e6, rel=1e-12)


def test_programs_carry_trace_bytes_and_calibrated_durations(traces):
    ts = ingest([str(traces)])
    mats = dict((role, m) for role, m in exchange_matrices(ts, 1) if role != "count_exchange")
    np.testing.assert_array_equal(mats["dispatch"], np.array([SEND[0], SEND[1]]) * 32)
    np.testing.assert_array_equal(mats["combine"], mats["dispatch"].T)     # the way back
    np.testing.assert_array_equal(mats["combine_grad"], mats["dispatch"])
    progs = build_programs(ts, 1, model_from_dict(CALIB))
    for r in (0, 1):
        comp = [op.duration_s for op in progs[r] if op.coll is None]
        m0, m1 = LOCAL_M[r]
        rows = sum(RECV[r])
        expect = [100, 100] + [100 * m0] * 2 + [100 * m1] * 2 + [100 * rows, 1200]
        assert comp == pytest.approx([x * US for x in expect], rel=1e-12)
        # every member holds the same spec (one CollectiveSpec per exchange)
        keys = [(op.key, op.coll) for op in progs[r] if op.coll is not None]
        assert keys == [(op.key, op.coll) for op in progs[1 - r] if op.coll is not None]


def test_simulated_and_measured_phases_exact(traces):
    v = validate(ingest([str(traces)]), model_from_dict(CALIB))
    assert v.steps == (1,)
    for r in (0, 1):
        assert v.mean(r, "measured") == pytest.approx(_us(MEASURED[r]), abs=1e-12)
        assert v.mean(r, "simulated") == pytest.approx(_us(SIMULATED[r]), abs=1e-12)
        err = v.error(r)
        for p in PHASES:
            assert err[p] == pytest.approx((SIMULATED[r][p] - MEASURED[r][p]) / MEASURED[r][p])
    assert v.error(1)["combine_s"] == pytest.approx(-100 / 1350)
    all_err = [abs(SIMULATED[r][p] - MEASURED[r][p]) / MEASURED[r][p]
               for r in (0, 1) for p in PHASES]
    assert v.median_abs_error() == pytest.approx(float(np.median(all_err)))


def test_relative_error_formula():
    meas = dict.fromkeys(PHASES, 2.0) | {"combine_s": 0.0}
    sim = dict.fromkeys(PHASES, 3.0)
    err = relative_error(meas, sim)
    assert err["forward_s"] == 0.5 and np.isnan(err["combine_s"])


def test_cold_rank_stalls_at_combine_waiting_on_hot_rank(traces):
    v = validate(ingest([str(traces)]), model_from_dict(CALIB))
    sim1 = next(c for c in v.per_step if c.rank == 1).simulated_spans
    stalls = [s for s in sim1 if s.kind == "stall"]
    assert [(s.name, s.waited_on, s.expert, s.tokens) for s in stalls] == [
        ("combine", 0, 0, 6), ("dispatch_grad", 0, 0, 6)]
    assert (stalls[0].start_s, stalls[0].end_s) == pytest.approx((665 * US, 1865 * US))
    assert (stalls[1].start_s, stalls[1].end_s) == pytest.approx((2165 * US, 2765 * US))
    assert "hot expert 0" in stalls[0].reason
    sim0 = next(c for c in v.per_step if c.rank == 0).simulated_spans
    assert not [s for s in sim0 if s.kind == "stall"]      # the hot rank waits for nobody
    # the measured overlay shows the same wait: rank 1's combine beyond rank 0's
    meas1 = next(c for c in v.per_step if c.rank == 1).measured_spans
    mstall = next(s for s in meas1 if s.kind == "stall" and s.name == "combine")
    assert mstall.dur_s == pytest.approx(1300 * US)


def test_trace_durations_are_never_used(tmp_path):
    a = validate(ingest([str(write_traces(tmp_path / "a"))]), model_from_dict(CALIB))
    b = validate(ingest([str(write_traces(tmp_path / "b", slow=0.5))]), model_from_dict(CALIB))
    for r in (0, 1):
        assert a.mean(r, "simulated") == b.mean(r, "simulated")


def test_cli_json_schema(traces, tmp_path, capsys):
    calib = write_calib(tmp_path / "c.json")
    assert main(["validate", str(traces), "--calibration", str(calib), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"ranks", "median_abs_error"}
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert set(r) >= {"rank", "measured", "simulated", "error"}
        for key in ("measured", "simulated", "error"):
            assert set(r[key]) == set(PHASES)
    assert doc["ranks"][1]["simulated"]["combine_s"] == pytest.approx(1250 * US)
    assert doc["ranks"][1]["error"]["combine_s"] == pytest.approx(-100 / 1350)


def test_cli_table_and_outdir(traces, tmp_path, capsys):
    calib = write_calib(tmp_path / "c.json")
    out = tmp_path / "out"
    assert main(["validate", str(traces), "--calibration", str(calib), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "measured ms" in text and "simulated ms" in text
    assert "1 combine_s 1.350 1.250 -7.4% -7.4% 0.0%" in [" ".join(ln.split()) for ln in text.splitlines()]
    doc = json.loads((out / "validation.json").read_text())
    assert doc["ranks"][0]["simulated"]["experts_s"] == pytest.approx(1600 * US)
    assert (out / "overlay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing written is overwritten without --force
    before = (out / "validation.json").read_bytes()
    assert main(["validate", str(traces), "--calibration", str(calib), "-o", str(out)]) == 2
    assert "validation.json" in capsys.readouterr().err
    assert (out / "validation.json").read_bytes() == before
    assert main(["validate", str(traces), "--calibration", str(calib), "-o", str(out),
                 "--force"]) == 0
    assert (out / "validation.json").read_bytes() == before      # deterministic


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_bad_inputs_exit_2_with_one_line(traces, tmp_path, capsys):
    calib = write_calib(tmp_path / "c.json")
    assert main(["validate", str(traces), "--calibration", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in _one_error_line(capsys)
    # a trace passed as the calibration: wrong format
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"traceEvents": []}))
    assert main(["validate", str(traces), "--calibration", str(wrong)]) == 2
    line = _one_error_line(capsys)
    assert "wrong.json: format: expected" in line
    bad = write_calib(tmp_path / "bad.json", CALIB | {"comm": {"latency_s": 1e-5,
                                                               "bandwidth_Bps": 0}})
    assert main(["validate", str(traces), "--calibration", str(bad)]) == 2
    assert "comm.bandwidth_Bps" in _one_error_line(capsys)
    # corrupt and truncated traces
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "rank0.json.gz").write_bytes(b"\x1f\x8b" + b"garbage")
    (corrupt / "rank1.json.gz").write_bytes((traces / "rank1.json.gz").read_bytes())
    assert main(["validate", str(corrupt), "--calibration", str(calib)]) == 2
    assert "rank0.json.gz" in _one_error_line(capsys)
    trunc = tmp_path / "trunc"
    trunc.mkdir()
    raw = gzip.decompress((traces / "rank0.json.gz").read_bytes())
    (trunc / "rank0.json").write_bytes(raw[: len(raw) // 2])
    (trunc / "rank1.json.gz").write_bytes((traces / "rank1.json.gz").read_bytes())
    assert main(["validate", str(trunc), "--calibration", str(calib)]) == 2
    assert "rank0.json" in _one_error_line(capsys)
    assert main(["validate", str(tmp_path / "missing"), "--calibration", str(calib)]) == 2
    _one_error_line(capsys)


def test_inconsistent_split_sizes_are_an_input_error(tmp_path, capsys):
    d = write_traces(tmp_path / "t")
    doc = json.loads(gzip.decompress((d / "rank1.json.gz").read_bytes()))
    for ev in doc["traceEvents"]:    # rank 1 claims to receive 3 rows from rank 0, not 1
        ci = ev.get("args", {}).get("Concrete Inputs")
        if ev["name"] == "c10d::alltoall_base_" and ci and ci[3] == str(RECV[1]):
            ci[3] = "[3, 1]"
    (d / "rank1.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    calib = write_calib(tmp_path / "c.json")
    assert main(["validate", str(d), "--calibration", str(calib)]) == 2
    assert "what s sends to r" in _one_error_line(capsys)


def test_shipped_hot_trace_gives_finite_errors_and_the_stall():
    root = Path(__file__).resolve().parents[1]
    from moesim.compute.calibrated import load_calibration
    v = validate(ingest([str(root / "traces/hot")]),
                 load_calibration(root / "traces/calib-uniform-cpu.json"))
    assert len(v.steps) >= 2
    for r in range(v.world):
        for p in PHASES:
            assert np.isfinite(v.error(r)[p]) and v.mean(r, "simulated")[p] > 0
    for c in v.per_step:        # rank 1 (cold experts) waits for rank 0 (hot expert 0)
        if c.rank == 1:
            st = [s for s in c.simulated_spans if s.kind == "stall" and s.name == "combine"]
            assert len(st) == 1 and st[0].waited_on == 0 and st[0].expert == 0


def test_step_without_combine_or_unknown_step_exit_2(tmp_path, capsys):
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):      # only the count exchange and the dispatch: no combine
        ev = [e for e in rank_events(r) if e["ts"] < 300]
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
               "traceEvents": ev}
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    calib = write_calib(tmp_path / "c.json")
    assert main(["validate", str(d), "--calibration", str(calib)]) == 2
    line = _one_error_line(capsys)
    assert "rank0.json: ProfilerStep#1: expected a forward dispatch and combine" in line
    good = write_traces(tmp_path / "good")
    assert main(["validate", str(good), "--calibration", str(calib), "--step", "7"]) == 2
    assert "--step" in _one_error_line(capsys)


def test_a_fast_calibrated_copy_rate_still_builds_the_half_duplex_machine():
    """A calibration on a noisy trace can fit a copy rate of thousands of GB/s; the free
    hops around the copy link (1e6 x the rate) stay within a topology's largest link
    rate, so the machine builds and a transfer still costs latency + bytes / rate."""
    import simpy

    from moesim.compute.calibrated import CommCalibration
    from moesim.network import FlowNetwork
    from moesim.topology.bounds import MAX_LINK_GBPS
    rate = 6.7e12                                  # 6,700 GB/s: 1e6 x is over the bound
    topo = machine_topology(2, CommCalibration(10e-6, rate, "gloo", False))
    assert topo.line_rate_Bps.max() <= MAX_LINK_GBPS * 1e9
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    g = topo.gpus
    env.run(net.transfer(g[0], g[1], 1e6))
    assert env.now == pytest.approx(10e-6 + 1e6 / rate, rel=1e-6)


def test_half_duplex_machine_shares_a_rank_between_its_sends_and_receives():
    """gloo (duplex false): two opposite 1 MB transfers between two ranks take
    latency + 2 MB / bandwidth (each rank copies both); duplex: latency + 1 MB / bw."""
    import simpy

    from moesim.compute.calibrated import CommCalibration
    from moesim.network import FlowNetwork
    for duplex, nbytes in ((True, 1e6), (False, 2e6)):
        topo = machine_topology(2, CommCalibration(10e-6, 1e9, "gloo", duplex))
        env = simpy.Environment()
        net = FlowNetwork(env, topo)
        g = topo.gpus
        done = [net.transfer(g[0], g[1], 1e6), net.transfer(g[1], g[0], 1e6)]
        env.run(simpy.AllOf(env, done))
        assert env.now == pytest.approx(10e-6 + nbytes / 1e9, rel=1e-9)
        # one transfer alone: the calibrated point-to-point cost either way
        env = simpy.Environment()
        net = FlowNetwork(env, topo)
        env.run(net.transfer(g[0], g[1], 1e6))
        assert env.now == pytest.approx(10e-6 + 1e6 / 1e9, rel=1e-9)
