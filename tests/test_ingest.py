"""Ingest of Kineto traces: a hand-written two-rank trace with known phases and bytes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from moesim.cli import main
from moesim.validation.cpu.ingest import ingest

H, E, T = 8, 4, 4          # hidden, experts, tokens per rank (top-2 → 8 rows per rank)
SEND = {0: [3, 5], 1: [2, 6]}               # rows to rank 0, rank 1
RECV = {0: [3, 2], 1: [5, 6]}               # rows from rank 0, rank 1
LOCAL_M = {0: [2, 3], 1: [4, 7]}            # rows per local expert (sum = received)


def _x(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _a2a(ts, rows_in, rows_out, send, recv, typ="float", width=H):
    dims = [[rows_out, width], [rows_in, width]] if width else [[rows_out], [rows_in]]
    return _x("c10d::alltoall_base_", ts, 2, **{
        "Input Dims": dims + [[], [], [], [], []],
        "Input type": [typ, typ, "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", str(recv), str(send), "False", "-1"]})


def _worker(ts, dur, rows_in, typ="float", width=H):
    return _x("gloo:all_to_all", ts, dur, tid=2, cat="user_annotation",
              **{"Input Dims": [[rows_in, width] if width else [rows_in]], "Input type": [typ]})


def _mm(ts, dur, m, k, n, name="aten::mm"):
    return _x(name, ts, dur, **{"Input Dims": [[m, k], [k, n]], "Input type": ["float", "float"]})


def rank_events(rank: int, step_marks: bool = True, labels: bool = False) -> list[dict]:
    """One step, times in µs. Phases by hand: backward starts at 300; dispatch is
    issued at 60 and its worker ends at 100; combine issued at 200, worker ends at 260."""
    rows_in, rows_out = sum(SEND[rank]), sum(RECV[rank])
    m0, m1 = LOCAL_M[rank]
    ev = [
        _x("aten::normal_", 0, 5, **{"Input Dims": [[T, H]], "Input type": ["float"]}),
        _x("aten::linear", 10, 20, **{"Input Dims": [[T, H], [E, H], []]}),
        _x("aten::matmul", 11, 18, **{"Input Dims": [[T, H], [H, E]]}),
        _mm(12, 16, T, H, E),                                             # router: n = E
        _x("aten::softmax", 30, 5, **{"Input Dims": [[T, E], []], "Input type": ["float", ""]}),
        _a2a(40, E, E, [], [], typ="long int", width=0),                 # count exchange
        _worker(41, 9, E, typ="long int", width=0),
        _a2a(60, rows_in, rows_out, SEND[rank], RECV[rank]),             # dispatch
        _worker(61, 39, rows_in),
        _mm(110, 20, m0, H, 16), _mm(130, 20, m0, 16, H),                # expert 0 up, down
        _mm(150, 20, m1, H, 16), _mm(170, 20, m1, 16, H),                # expert 1
        _a2a(200, rows_out, rows_in, RECV[rank], SEND[rank]),            # combine
        _worker(201, 59, rows_out),
        _x("autograd::engine::evaluate_function: MmBackward0", 300, 100),
        _x("MmBackward0", 301, 98),
        _mm(310, 80, m1, H, 16),
        _a2a(450, rows_in, rows_out, SEND[rank], RECV[rank]),            # combine grad
        _worker(451, 29, rows_in),
        _a2a(500, rows_out, rows_in, RECV[rank], SEND[rank]),            # dispatch grad
        _worker(501, 29, rows_out),
        _x("c10d::barrier", 600, 10),                                    # extra ops
        _x("Optimizer.step#SGD.step", 700, 50, cat="user_annotation"),
        _x("aten::add_", 710, 20, **{"Input Dims": [[16, H], [16, H], []],
                                     "Input type": ["float", "float", "Scalar"]}),
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "main"}},
    ]
    if step_marks:
        ev.append(_x("ProfilerStep#3", 0, 1000, cat="user_annotation"))
    if labels:
        ev.append(_x("moe/experts", 105, 90, cat="user_annotation"))
    return ev


def write_trace_dir(d: Path, gz: bool = True, **kw) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
               "traceEvents": rank_events(r, **kw)}
        raw = json.dumps(doc).encode()
        if gz and r == 1:
            (d / f"rank{r}.json.gz").write_bytes(gzip.compress(raw))
        else:
            (d / f"rank{r}.json").write_bytes(raw)
    return d


def test_phases_bytes_and_tokens_exact(tmp_path):
    ts = ingest([str(write_trace_dir(tmp_path / "t"))])
    assert (ts.world, ts.hidden, ts.n_experts, ts.step_ids()) == (2, H, E, [3])
    s0 = ts.step(0, 3)
    assert s0.phases == pytest.approx({
        "forward_s": 288e-6,          # first matmul (12) → backward start (300)
        "backward_s": 230e-6,         # 300 → dispatch-grad worker end (530)
        "dispatch_s": 40e-6,          # issue 60 → worker end 100
        "experts_s": 100e-6,          # dispatch end 100 → combine issue 200
        "combine_s": 60e-6,           # 200 → 260
        "combine_grad_s": 30e-6, "dispatch_grad_s": 30e-6}, abs=1e-12)
    roles = [o.role for o in s0.ops if o.kind in ("all_to_all", "count_exchange")]
    assert roles == ["count_exchange", "dispatch", "combine", "combine_grad", "dispatch_grad"]
    # byte matrix: rows × hidden 8 × 4 bytes (float32)
    np.testing.assert_array_equal(ts.byte_matrix(3, "dispatch"), [[96, 160], [64, 192]])
    np.testing.assert_array_equal(ts.token_matrix(3, "combine"), [[3, 2], [5, 6]])
    # conservation: what rank r receives from s is what s sent to r
    np.testing.assert_array_equal(ts.token_matrix(3).T, [RECV[0], RECV[1]])
    for r in (0, 1):
        assert ts.step(r, 3).tokens_per_local_expert == tuple(LOCAL_M[r])
        assert sum(LOCAL_M[r]) == sum(RECV[r])
    # matmuls: innermost only (mm, not linear/matmul): router + 4 expert + 1 backward
    gemms = [o for o in s0.ops if o.kind == "gemm"]
    assert [o.role for o in gemms] == ["router", "expert", "expert", "expert", "expert", ""]
    assert gemms[0].flops == 2 * T * H * E
    # memory ops: softmax and optimizer add_, not normal_ (RNG) nor the barrier
    mem = {o.name: o.bytes for o in s0.ops if o.kind == "memory"}
    assert mem == {"aten::softmax": 2 * T * E * 4, "aten::add_": 3 * 16 * H * 4}


def test_labels_used_and_missing_profiler_step(tmp_path):
    ts = ingest([str(write_trace_dir(tmp_path / "t", gz=False, step_marks=False,
                                     labels=True))])
    assert ts.step_ids() == [0]                     # whole trace = one step
    s1 = ts.step(1, 0)
    assert s1.phases["experts_s"] == pytest.approx(90e-6)   # the moe/experts label
    assert s1.phases["dispatch_s"] == pytest.approx(40e-6)


def test_cli_ingest_text_and_json(tmp_path, capsys):
    d = write_trace_dir(tmp_path / "t")
    assert main(["ingest", str(d)]) == 0
    out = capsys.readouterr().out
    assert "2 ranks, hidden 8, 4 experts" in out
    assert "dispatch [src→dst] (bytes): 96.000 160.000; 64.000 192.000" in out
    assert main(["ingest", str(d / "rank0.json"), str(d / "rank1.json.gz"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["byte_matrices"]["3"]["dispatch"] == [[96, 160], [64, 192]]
    assert doc["steps"][0]["phases"]["dispatch_s"] == pytest.approx(40e-6)


def _one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    for n in needles:
        assert n in err
    return err


def test_corrupt_traces_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_line_error(capsys, ["ingest", str(bad)], str(bad), "JSON")
    bad.write_text(json.dumps({"schemaVersion": 1}))
    _one_line_error(capsys, ["ingest", str(bad)], str(bad), "traceEvents")
    ev = [e for e in rank_events(0) if "alltoall" not in e["name"]]
    bad.write_text(json.dumps({"traceEvents": ev}))
    _one_line_error(capsys, ["ingest", str(bad)], str(bad), "all-to-all")
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(b"\x1f\x8b" + b"garbage")
    _one_line_error(capsys, ["ingest", str(gz)], str(gz), "gzip")
    _one_line_error(capsys, ["ingest", str(tmp_path / "nope")], "nope", "expected")


def test_record_param_comms_form(tmp_path):
    """The NCCL-style form: split sizes in record_param_comms args, no c10d op."""
    ev = []
    for e in rank_events(0):
        if e["name"] != "c10d::alltoall_base_":
            ev.append(e)
            continue
        ci = e["args"]["Concrete Inputs"]
        dims = e["args"]["Input Dims"]
        width = dims[1][1] if len(dims[1]) > 1 else 1
        typ = "Float" if e["args"]["Input type"][1] == "float" else "Long"
        ev.append(_x("record_param_comms", e["ts"], e["dur"], **{
            "Collective name": "all_to_allv", "dtype": typ, "Group size": 2,
            "In msg nelems": dims[1][0] * width, "Out msg nelems": dims[0][0] * width,
            "In split size": ci[4], "Out split size": ci[3]}))
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    ts = ingest([str(p)])
    s = ts.step(0, 3)
    assert [o.role for o in s.collectives()] == ["dispatch", "combine", "combine_grad",
                                                 "dispatch_grad"]
    assert s.role("dispatch").send_bytes == (96.0, 160.0)
    assert s.phases["experts_s"] == pytest.approx(100e-6)


SHIPPED = Path(__file__).resolve().parents[1] / "traces"


@pytest.mark.parametrize("skew", ["uniform", "zipf", "hot", "uniform-repeat", "hot-repeat"])
def test_shipped_traces_conserve_tokens(skew):
    d = SHIPPED / skew
    assert d.is_dir(), "the shipped traces are part of the repository"
    routing = json.loads((d / "routing.json").read_text())
    a = routing["args"]
    ts = ingest([str(d)])
    n_local = a["experts"] // a["world"]
    assert ts.step_ids() == [s["step"] for s in routing["steps"] if s["traced"]]
    for sid in ts.step_ids():
        counts = np.array(routing["steps"][sid]["tokens_per_expert_by_rank"])  # [src, expert]
        want = counts.reshape(a["world"], a["world"], n_local).sum(2)          # [src, dst]
        np.testing.assert_array_equal(ts.token_matrix(sid), want)
        np.testing.assert_array_equal(ts.token_matrix(sid, "combine"), want.T)
        assert want.sum() == a["tokens"] * a["top_k"] * a["world"]
        for r in range(a["world"]):
            s = ts.step(r, sid)
            assert len(s.collectives()) == 4 and len(s.collectives("count_exchange")) == 1
            local = counts[:, r * n_local:(r + 1) * n_local].sum(0)
            assert s.tokens_per_local_expert == tuple(local)


def test_ingest_and_calibrate_do_not_import_torch():
    import subprocess
    import sys

    code = ("import argparse, importlib, sys, moesim.validation, moesim.validation.cpu.ingest, "
            "moesim.compute.calibrated, moesim.validation.recorder.record\n"
            "for c in ('record', 'ingest', 'calibrate'):\n"
            "    importlib.import_module(f'moesim.cli.{c}_cmd').add_arguments("
            "argparse.ArgumentParser())\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_innermost_ops_with_only_allocation_children_are_samples(tmp_path):
    """index_select and cat call aten::empty / select inside: they still count, with
    bytes from their shapes; argsort (whose child sort counts) does not; sort counts."""
    extra = [
        _x("aten::index_select", 32, 4, **{"Input Dims": [[T, H], [], [2 * T]],
                                           "Input type": ["float", "Scalar", "long int"]}),
        _x("aten::empty", 32.5, 0.1, **{"Input Dims": [[], [], [], [], [], []]}),
        _x("aten::select", 33, 0.1, **{"Input Dims": [[T, H], [], []]}),
        _x("aten::argsort", 36, 2, **{"Input Dims": [[2 * T], [], [], []]}),
        _x("aten::sort", 36.2, 1.5, **{"Input Dims": [[2 * T], [], [], []],
                                       "Input type": ["long int", "Scalar", "Scalar",
                                                      "Scalar"]}),
        _x("aten::cat", 190, 3, **{"Input Dims": [[[2, H], [3, H]], []],
                                   "Input type": ["TensorList", "Scalar"]}),
        _x("aten::empty", 190.5, 0.1, **{"Input Dims": [[], [], [], [], [], []]}),
        # an expanded (stride 0) index is read once per distinct element
        _x("aten::scatter_add_", 760, 5, **{
            "Input Dims": [[T, H], [], [2 * T, H], [2 * T, H]],
            "Input Strides": [[H, 1], [], [1, 0], [H, 1]],
            "Input type": ["float", "Scalar", "long int", "float"]}),
        _x("aten::fill_", 770, 1, **{"Input Dims": [[T, H], []],
                                     "Input type": ["float", "Scalar"]}),
    ]
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
               "traceEvents": rank_events(r) + extra}
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    s = ingest([str(d)]).step(0, 3)
    mem = {o.name: o.bytes for o in s.ops if o.kind == "memory"}
    f4, i8 = 4, 8
    assert mem == {
        "aten::softmax": 2 * T * E * f4,
        "aten::index_select": T * H * f4 + 2 * T * i8 + 2 * T * H * f4,   # read + 2T rows
        "aten::sort": 2 * (2 * T * i8),
        "aten::cat": 2 * (5 * H) * f4,           # listed tensors read, written once
        "aten::scatter_add_": (T * H * f4) * 2 + 2 * T * i8 + 2 * T * H * f4,
        "aten::fill_": T * H * f4,               # written only
        "aten::add_": 3 * 16 * H * 4,
    }


# --------------------------------------------------------------------------- other forms
def _list_form(events: list[dict]) -> list[dict]:
    """The same trace with the list-form all-to-all (``dist.all_to_all(out_list,
    in_list)``): ``c10d::alltoall_`` whose Input Dims are lists of tensor shapes
    (TensorList, no dtype), and gloo worker spans listing the input tensors."""
    out, pending = [], []
    for e in events:
        if e["name"] == "c10d::alltoall_base_":
            ci, dims = e["args"]["Concrete Inputs"], e["args"]["Input Dims"]
            typ = e["args"]["Input type"][1]
            tail = dims[1][1:]
            send = json.loads(ci[4]) or [dims[1][0] // 2] * 2
            recv = json.loads(ci[3]) or [dims[0][0] // 2] * 2
            out.append(_x("c10d::alltoall_", e["ts"], e["dur"], **{
                "Input Dims": [[[n, *tail] for n in recv], [[n, *tail] for n in send],
                               [], [], []],
                "Input type": ["TensorList", "TensorList", "", "Scalar", "Scalar"],
                "Concrete Inputs": ["", "", "", "False", "-1"]}))
            pending.append(([[n, *tail] for n in send], typ))
        elif e["name"] == "gloo:all_to_all":
            shapes, typ = pending.pop(0)
            out.append(_x("gloo:all_to_all", e["ts"], e["dur"], tid=2, cat="user_annotation",
                          **{"Input Dims": shapes, "Input type": [typ] * len(shapes)}))
        else:
            out.append(e)
    return out


def _write(d: Path, per_rank) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
               "traceEvents": per_rank(r)}
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    return d


def test_list_form_all_to_all(tmp_path):
    """c10d::alltoall_ (TensorList): split sizes = rows of each listed tensor, dtype from
    the gloo worker span; the int64 1-D count exchange stays a count exchange. Same
    result as the all_to_all_single form of the same trace."""
    base = ingest([str(write_trace_dir(tmp_path / "base", gz=False))])
    ts = ingest([str(_write(tmp_path / "list", lambda r: _list_form(rank_events(r))))])
    for r in (0, 1):
        a, b = base.step(r, 3), ts.step(r, 3)
        assert b.phases == pytest.approx(a.phases, abs=1e-12)
        assert b.tokens_per_local_expert == a.tokens_per_local_expert
        assert [(o.kind, o.role, o.send_rows, o.recv_rows, o.row_bytes) for o in b.ops
                if o.kind != "gemm" and o.kind != "memory"] == \
               [(o.kind, o.role, o.send_rows, o.recv_rows, o.row_bytes) for o in a.ops
                if o.kind != "gemm" and o.kind != "memory"]
    np.testing.assert_array_equal(ts.byte_matrix(3, "dispatch"), [[96, 160], [64, 192]])
    # without worker spans the list's dtype is unknown: float32 is assumed
    bare = [e for e in _list_form(rank_events(0)) if e["name"] != "gloo:all_to_all"]
    p = tmp_path / "bare" / "rank0.json"
    p.parent.mkdir()
    p.write_text(json.dumps({"traceEvents": bare}))
    s = ingest([str(p)]).step(0, 3)
    assert s.role("dispatch").send_bytes == (96.0, 160.0)
    assert len(s.collectives("count_exchange")) == 1


def test_list_form_with_bad_dims_is_one_line(tmp_path, capsys):
    ev = _list_form(rank_events(0))
    for e in ev:
        if e["name"] == "c10d::alltoall_":
            e["args"]["Input Dims"][1] = [[3, H], "x"]
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    _one_line_error(capsys, ["ingest", str(p)], str(p), "c10d::alltoall_.Input Dims",
                    "lists of output and input tensor shapes")


def test_steps_found_without_profiler_step(tmp_path):
    """One plain profile() around three training steps: no ProfilerStep spans. The
    steps are found from forward/backward all-to-alls (ids 0, 1, 2), each as the
    ProfilerStep#3 step of the single-step trace; validate's windows see the same."""
    from moesim.validation.cpu.validate import phase_windows

    def three_steps(r):
        ev = []
        for k in range(3):
            for e in rank_events(r, step_marks=False):
                if e["ph"] == "X":
                    e = {**e, "ts": e["ts"] + 1000 * k}
                ev.append(e)
        return ev

    base = ingest([str(write_trace_dir(tmp_path / "base", gz=False))])
    ts = ingest([str(_write(tmp_path / "t", three_steps))])
    assert ts.step_ids() == [0, 1, 2]
    for sid in (0, 1, 2):
        np.testing.assert_array_equal(ts.token_matrix(sid), base.token_matrix(3))
        for r in (0, 1):
            s, b = ts.step(r, sid), base.step(r, 3)
            assert s.phases == pytest.approx(b.phases, abs=1e-9)
            assert [o.role for o in s.ops] == [o.role for o in b.ops]
            assert s.tokens_per_local_expert == b.tokens_per_local_expert
    # step 1 starts at its router matmul's outermost op (aten::linear at 1010 µs)
    assert ts.step(0, 1).dur_s == pytest.approx(1000e-6)
    assert ts.step(0, 0).dur_s == pytest.approx(1010e-6)
    win = phase_windows(ts)
    assert win[(1, 2)]["forward"] == pytest.approx((2e-6, 290e-6))


def test_bucketed_all_to_all_single_and_baddbmm(tmp_path):
    """fairseq/GShard style: all_to_all_single of [world, C, H] buckets with equal splits
    ("[]"), and experts as one baddbmm over [E_local, world·C, H]: rows = C per
    destination, width = H; tokens per local expert = the padded rows of each batch."""
    cap, n_local = 5, 2

    def ev(r):
        out = []
        for e in rank_events(r):
            if e["name"] == "c10d::alltoall_base_" and e["args"]["Input type"][1] == "float":
                e = _x(e["name"], e["ts"], e["dur"], **{
                    "Input Dims": [[2, n_local * cap, H], [2, n_local * cap, H],
                                   [], [], [], [], []],
                    "Input type": ["float"] * 2 + ["", "ScalarList", "ScalarList", "Scalar",
                                                   "Scalar"],
                    "Concrete Inputs": ["", "", "", "[]", "[]", "False", "-1"]})
            elif e["name"] == "gloo:all_to_all" and e["args"]["Input type"] == ["float"]:
                e = {**e, "args": {"Input Dims": [[2, n_local * cap, H]],
                                   "Input type": ["float"]}}
            elif e["name"] == "aten::mm" and 100 < e["ts"] < 200:   # the expert GEMMs
                if e["ts"] != 110:
                    continue
                e = _x("aten::baddbmm", 110, 80, **{
                    "Input Dims": [[n_local, 1, H], [n_local, 2 * cap, 16],
                                   [n_local, 16, H], [], []],
                    "Input type": ["float"] * 3 + ["Scalar", "Scalar"]})
            out.append(e)
        return out

    ts = ingest([str(_write(tmp_path / "t", ev))])
    assert (ts.hidden, ts.n_experts) == (H, E)
    np.testing.assert_array_equal(ts.token_matrix(3), [[2 * cap] * 2] * 2)
    np.testing.assert_array_equal(ts.byte_matrix(3, "combine"), [[2 * cap * H * 4] * 2] * 2)
    s = ts.step(0, 3)
    assert s.tokens_per_local_expert == (2 * cap, 2 * cap)
    g = next(o for o in s.ops if o.name == "aten::baddbmm")
    assert (g.role, g.flops) == ("expert", 2.0 * n_local * 2 * cap * 16 * H)
