"""Calibration: exact recovery from synthetic data, the file format, the model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.calibrated import load_calibration, model_from_dict
from moesim.errors import InputError
from moesim.validation.calibration.calibrate import calibrate, comm_samples, fit_line
from moesim.validation.cpu.ingest import RankTrace, TracedOp, TraceSet, TraceStep
from tests.test_ingest import write_trace_dir

RATE, OVH = 2.0e11, 7e-6          # FLOP/s, s per GEMM
MRATE, MOVH = 5.0e10, 1.5e-6      # bytes/s, s per memory op
LAT, BW = 40e-6, 3.0e9            # s, bytes/s


def test_fit_line_recovers_known_line():
    x = np.array([1e6, 4e8, 2e9, 7e9, 3e10])
    f = fit_line(x, OVH + x / RATE)
    assert f.overhead_s == pytest.approx(OVH, rel=1e-9)
    assert f.rate == pytest.approx(RATE, rel=1e-9)
    assert f.r2 == pytest.approx(1.0) and f.n_samples == 5 and f.max_rel < 1e-9


def test_fit_line_clamps_negative_overhead():
    x = np.array([1.0, 2.0, 3.0])
    f = fit_line(x, np.array([0.5, 1.5, 2.5]))     # unconstrained intercept would be -0.5
    assert f.overhead_s == 0.0 and f.slope > 0


def test_fit_line_needs_two_sizes():
    with pytest.raises(InputError, match="two samples"):
        fit_line(np.array([5.0, 5.0]), np.array([1.0, 1.1]))


def send_of(rank: int, rows: tuple[int, int]) -> tuple[int, int]:
    return rows if rank == 0 else rows[::-1]


def _synthetic_set(duplex: bool = True) -> TraceSet:
    """Two ranks, two steps. Rank 1 reaches every all-to-all 0.3 ms late, so rank 0's
    span is transfer + 0.3 ms of waiting and rank 1's is the pure transfer. The
    transfer moves the busiest rank's bytes: its larger direction on a ``duplex``
    backend, sent + received on a half-duplex one (gloo)."""
    ranks = []
    for r in (0, 1):
        steps = []
        for sid, rows in ((0, (100, 300)), (1, (500, 50))):
            ops = [TracedOp("gemm", "aten::mm", 0, OVH + f / RATE, flops=f)
                   for f in (3e6, 8e8, 4e9 * (sid + 1))]
            ops += [TracedOp("memory", "aten::mul", 0, MOVH + b / MRATE, bytes=b)
                    for b in (1e3, 2e6 * (r + 1), 6e7)]
            send = send_of(r, rows)
            recv = (rows[0], rows[0]) if r == 0 else (rows[1], rows[1])
            row_bytes = 4096
            # off-rank rows by hand: rank 0 sends rows[1] to rank 1 and receives
            # rows[0] from it; rank 1 sends send_of(1, rows)[0] and receives rows[1]
            r0_sent, r0_recv = rows[1], rows[0]
            r1_sent, r1_recv = send_of(1, rows)[0], rows[1]
            busiest = (max(r0_sent, r0_recv, r1_sent, r1_recv) if duplex else
                       max(r0_sent + r0_recv, r1_sent + r1_recv)) * row_bytes
            ops += [TracedOp("count_exchange", "c10d::alltoall_base_", 0, 0, send_rows=(4, 4),
                             recv_rows=(4, 4), row_bytes=8,
                             work_dur_s=LAT + (32 if duplex else 64) / BW
                             + (3e-4 if r == 0 else 0.0)),
                    TracedOp("all_to_all", "c10d::alltoall_base_", 0, 0, role="dispatch",
                             send_rows=send, recv_rows=recv, row_bytes=row_bytes,
                             work_dur_s=LAT + busiest / BW + (3e-4 if r == 0 else 0.0))]
            steps.append(TraceStep(r, sid, 1.0, tuple(ops)))
        ranks.append(RankTrace(r, f"rank{r}", 2, tuple(steps)))
    return TraceSet(tuple(ranks), hidden=1024, n_experts=4)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_calibrate_recovers_all_three_models(backend):
    duplex = backend == "nccl"
    ts = _synthetic_set(duplex)
    x, t = comm_samples(ts, duplex)
    # count exchange: 4 × int64 each way; gloo copies both ways on one core
    assert len(x) == 4 and x[0] == (32.0 if duplex else 64.0)
    doc = calibrate([ts], ["synthetic"], backend=backend)
    assert doc["comm"]["duplex"] is duplex
    assert doc["format"] == "moesim-calibration/1"
    assert doc["gemm"]["flops_per_s"] == pytest.approx(RATE, rel=1e-9)
    assert doc["gemm"]["overhead_s"] == pytest.approx(OVH, rel=1e-9)
    assert doc["memory"]["bytes_per_s"] == pytest.approx(MRATE, rel=1e-9)
    assert doc["memory"]["overhead_s"] == pytest.approx(MOVH, rel=1e-9)
    # min over ranks removes rank 0's 0.3 ms wait: the transfer line comes out exactly
    assert doc["comm"]["latency_s"] == pytest.approx(LAT, rel=1e-9)
    assert doc["comm"]["bandwidth_Bps"] == pytest.approx(BW, rel=1e-9)
    assert doc["fit"]["gemm"]["n_samples"] == 12 and doc["fit"]["comm"]["r2"] == pytest.approx(1)
    model = model_from_dict(json.loads(json.dumps(doc)))
    assert model.comm.all_to_all_s(3e9) == pytest.approx(LAT + 1.0)


def test_calibrated_model_times_known_kernels():
    doc = calibrate([_synthetic_set()], ["synthetic"])
    m = model_from_dict(doc)
    gemm = Kernel("expert_gemm", flops=2 * 1000 * 4096 * 14336, bytes=0, m=1000, n=14336,
                  k=4096, count=3)
    assert m.time_s(gemm) == pytest.approx(3 * OVH + 2 * 1000 * 4096 * 14336 / RATE)
    perm = Kernel("permute", flops=0, bytes=1e8, count=2)
    assert m.time_s(perm) == pytest.approx(2 * MOVH + 1e8 / MRATE)   # 2 × 1.5 µs + 2 ms


def test_cli_calibrate_writes_and_refuses_overwrite(tmp_path, capsys):
    d = write_trace_dir(tmp_path / "t")
    out = tmp_path / "calib.json"
    assert main(["calibrate", str(d), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    model = load_calibration(out)
    assert model.comm.backend == "gloo" and model.gemm_flops_per_s > 0
    before = out.read_bytes()
    assert main(["calibrate", str(d), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and "--force" in err
    assert out.read_bytes() == before
    assert main(["calibrate", str(d), "-o", str(out), "--force"]) == 0
    assert out.read_bytes() == before          # same traces, same bytes


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(format="other/1"), "format"),
    (lambda d: d["gemm"].update(flops_per_s=-1.0), "gemm.flops_per_s"),
    (lambda d: d["comm"].pop("bandwidth_Bps"), "comm.bandwidth_Bps"),
    (lambda d: d.pop("memory"), "memory.bytes_per_s"),
    (lambda d: d["comm"].update(duplex="no"), "comm.duplex"),
])
def test_bad_calibration_file(tmp_path, edit, field):
    doc = calibrate([_synthetic_set()], ["synthetic"])
    edit(doc)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        load_calibration(p)
    assert err.value.field == field and err.value.source == str(p)
    p.write_text("not json")
    with pytest.raises(InputError, match="JSON"):
        load_calibration(p)


def test_gemm_fit_recovers_overhead_rate_and_operand_bandwidth():
    """t = 50 µs + F / 100 GFLOP/s + B / 10 GB/s on shapes whose FLOPs and bytes are
    not proportional (square, skinny, tall): all three coefficients come back."""
    from moesim.validation.calibration.calibrate import fit_gemm
    shapes = [(512, 512, 512), (2048, 8, 512), (4096, 1024, 512), (64, 4096, 4096),
              (1000, 14336, 4096), (8, 8, 8)]
    f = np.array([2.0 * m * n * k for m, n, k in shapes])
    b = np.array([4.0 * (m * k + k * n + m * n) for m, n, k in shapes])
    t = 50e-6 + f / 1e11 + b / 1e10
    fit, byte_slope = fit_gemm(f, b, t)
    assert fit.overhead_s == pytest.approx(50e-6, rel=1e-6)
    assert fit.rate == pytest.approx(1e11, rel=1e-6)
    assert 1 / byte_slope == pytest.approx(1e10, rel=1e-6)
    # no traffic in the data (bytes all 0): the term drops out, the line remains
    fit, byte_slope = fit_gemm(f, np.zeros_like(b), 50e-6 + f / 1e11)
    assert byte_slope == 0 and fit.rate == pytest.approx(1e11, rel=1e-6)


def test_calibrated_gemm_charges_operand_traffic():
    from moesim.compute.calibrated import model_from_dict
    doc = {"format": "moesim-calibration/1",
           "gemm": {"flops_per_s": 1e11, "overhead_s": 1e-5, "bytes_per_s": 1e10},
           "memory": {"bytes_per_s": 1e10, "overhead_s": 0.0},
           "comm": {"latency_s": 1e-4, "bandwidth_Bps": 1e9, "backend": "gloo"}}
    k = Kernel("expert_gemm", flops=2e9, bytes=4e6, m=1000, n=1000, k=1000)
    assert model_from_dict(doc).time_s(k) == pytest.approx(1e-5 + 2e-2 + 4e-4)
    del doc["gemm"]["bytes_per_s"]          # older files: no traffic term
    assert model_from_dict(doc).time_s(k) == pytest.approx(1e-5 + 2e-2)


def test_memory_rate_per_op_kind_and_fallback():
    """Two kinds at different bytes/s: each gets its own total-matching rate; a kind
    with too few samples, or unseen, takes the common rate."""
    from moesim.compute.calibrated import model_from_dict
    from moesim.validation.calibration.calibrate import MIN_KIND_SAMPLES, rates_by_op
    n = MIN_KIND_SAMPLES
    x = np.array(([1e6, 2e6, 3e6] * n)[: 2 * n] + [1e6], dtype=float)
    names = np.array(["aten::copy_"] * n + ["aten::gelu"] * n + ["aten::rare"], dtype=object)
    t = np.where(names == "aten::copy_", 1e-6 + x / 20e9, 1e-6 + x / 5e9)
    t[-1] = 1.0                                  # one slow sample: not enough for a rate
    rates = rates_by_op(x, t, names, 1e-6)
    assert rates == pytest.approx({"aten::copy_": 20e9, "aten::gelu": 5e9}, rel=1e-9)
    doc = {"format": "moesim-calibration/1",
           "gemm": {"flops_per_s": 1e11, "overhead_s": 0.0},
           "memory": {"bytes_per_s": 10e9, "overhead_s": 1e-6, "bytes_per_s_by_op": rates},
           "comm": {"latency_s": 1e-4, "bandwidth_Bps": 1e9, "backend": "gloo"}}
    m = model_from_dict(doc)
    assert m.time_s(Kernel("aten::gelu", 0, 5e6)) == pytest.approx(1e-6 + 1e-3)
    assert m.time_s(Kernel("aten::rare", 0, 5e6)) == pytest.approx(1e-6 + 5e-4)
    doc["memory"]["bytes_per_s_by_op"] = {"aten::gelu": 0}
    with pytest.raises(InputError) as err:
        model_from_dict(doc, "c.json")
    assert err.value.field == "memory.bytes_per_s_by_op.aten::gelu"


def test_flat_samples_still_give_a_finite_rate():
    """All-to-alls whose time does not grow with size (noise): the non-negative line is
    flat (rate infinite); the calibration falls back to the line through the origin,
    so the file it writes loads."""
    from moesim.validation.calibration.calibrate import fit_line, with_rate
    x = np.array([1e3, 2e3, 4e3, 8e3])
    t = np.array([4e-4, 3e-4, 2e-4, 1e-4])          # shrinking with size: slope clamped
    flat = fit_line(x, t)
    assert flat.slope == 0 and flat.rate == float("inf")
    fixed = with_rate(flat, x, t)
    assert fixed.overhead_s == 0 and 0 < fixed.rate < float("inf")
    w = 1 / t                                         # weighted least squares, by hand
    assert fixed.slope == pytest.approx(np.sum(w * w * x * t) / np.sum(w * w * x * x))
