"""The calibration terms added for validation: total-matching memory rate, host gap."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from moesim.compute.calibrated import load_calibration, model_from_dict
from moesim.errors import InputError
from moesim.validation.calibration.calibrate import calibrate, fit_total, gap_samples, host_gaps
from moesim.validation.cpu.ingest import RankTrace, TracedOp, TraceSet, TraceStep
from moesim.validation.cpu.validate import validate
from tests.test_validate import CALIB, SIMULATED, US, write_traces


def test_fit_total_keeps_overhead_and_matches_the_total():
    x = np.array([1e3, 1e6, 1e7, 1e7])
    t = np.array([2e-6, 1e-4, 1e-3, 9e-3])           # one slow sample (a page fault)
    f = fit_total(x, t, overhead_s=1e-6)
    assert f.overhead_s == 1e-6
    assert f.slope == pytest.approx((t.sum() - 4 * 1e-6) / x.sum())
    assert np.sum(f.overhead_s + f.slope * x) == pytest.approx(t.sum())


def _ops_set() -> TraceSet:
    """One rank, one step: ops at 0–1, 3–4 (gap 2), 3.5–5 (overlaps: gap 0), 5.5–6
    (gap 0.5 after the latest end, 5)."""
    ops = (TracedOp("gemm", "aten::mm", 0.0, 1.0, flops=1e9),
           TracedOp("memory", "aten::mul", 3.0, 1.0, bytes=1e6),
           TracedOp("memory", "aten::mul", 3.5, 1.5, bytes=2e6),
           TracedOp("gemm", "aten::mm", 5.5, 0.5, flops=2e9))
    return TraceSet((RankTrace(0, "r0", 1, (TraceStep(0, 0, 6.0, ops),)),), 8, 0)


def test_gap_samples_exact():
    np.testing.assert_allclose(gap_samples(_ops_set()), [2.0, 0.0, 0.5])


def test_host_gaps_per_compute_op_forward_and_backward():
    """The last two ops of _ops_set marked backward: forward gaps 2.0 over 2 compute
    ops, backward 0 + 0.5 over 2; all: 2.5 over 4."""
    ts = _ops_set()
    step = ts.ranks[0].steps[0]
    ops = tuple(replace(o, backward=i >= 2) for i, o in enumerate(step.ops))
    ts = TraceSet((RankTrace(0, "r0", 1, (replace(step, ops=ops),)),), 8, 0)
    assert host_gaps(ts) == {"forward": (2.0, 2), "backward": (0.5, 2), "all": (2.5, 4)}


def test_host_gap_in_file_and_model(tmp_path):
    from tests.test_calibrate import _synthetic_set
    doc = calibrate([_synthetic_set()], ["synthetic"])
    tot = host_gaps(_synthetic_set())
    for key, cls in (("op_gap_s", "all"), ("op_gap_forward_s", "forward"),
                     ("op_gap_backward_s", "backward")):
        g, n = tot[cls]
        assert doc["host"][key] == pytest.approx(g / n if n else 0.0)
    m = model_from_dict(CALIB | {"host": {"op_gap_s": 2e-6, "op_gap_backward_s": 1e-6}})
    assert (m.gap_s(False), m.gap_s(True)) == (2e-6, 1e-6)   # forward falls back to op_gap_s
    assert model_from_dict(CALIB | {"host": {"op_gap_s": 2e-6}}).op_gap_s == 2e-6
    assert model_from_dict(CALIB).op_gap_s == 0.0           # older files: no host gap
    p = tmp_path / "c.json"
    p.write_text(json.dumps(CALIB | {"host": {"op_gap_s": -1.0}}))
    with pytest.raises(InputError) as err:
        load_calibration(p)
    assert err.value.field == "host.op_gap_s"


def test_replay_adds_the_host_gap_to_each_compute_op(tmp_path):
    """With a 10 µs gap every compute op is 10 µs longer: rank 0's experts phase holds
    4 matmuls (1600 + 40 µs); forward holds 6 compute ops before the combine
    (router, softmax, 4 expert matmuls: 1915 + 60 µs)."""
    from moesim.validation.cpu.ingest import ingest
    ts = ingest([str(write_traces(tmp_path / "t"))])
    v = validate(ts, model_from_dict(CALIB | {"host": {"op_gap_s": 10e-6}}))
    sim0 = v.mean(0, "simulated")
    assert sim0["experts_s"] == pytest.approx((SIMULATED[0]["experts_s"] + 40) * US)
    assert sim0["forward_s"] == pytest.approx((SIMULATED[0]["forward_s"] + 60) * US)
    assert sim0["dispatch_s"] == pytest.approx(SIMULATED[0]["dispatch_s"] * US)


def test_replay_charges_forward_and_backward_gaps_apart(tmp_path):
    """Forward gap 10 µs, backward 1000 µs. Forward: 6 compute ops before the combine on
    both ranks (+60 µs each, so the stall is unchanged). Backward: one matmul per rank
    (ingest flags it backward: it starts after the autograd op at 2100 µs), so both
    ranks' backward grows by exactly 1000 µs (rank 0's matmul 800 + 1000 sets the
    dispatch-grad)."""
    from moesim.validation.cpu.ingest import ingest
    ts = ingest([str(write_traces(tmp_path / "t"))])
    assert [o.backward for o in ts.step(0, 1).ops if o.kind == "gemm"] == [False] * 5 + [True]
    host = {"op_gap_s": 0.0, "op_gap_forward_s": 10e-6, "op_gap_backward_s": 1000e-6}
    v = validate(ts, model_from_dict(CALIB | {"host": host}))
    for r in (0, 1):
        sim = v.median(r, "simulated")
        assert sim["forward_s"] == pytest.approx((SIMULATED[r]["forward_s"] + 60) * US)
        assert sim["backward_s"] == pytest.approx((SIMULATED[r]["backward_s"] + 1000) * US)
        assert sim["combine_s"] == pytest.approx(SIMULATED[r]["combine_s"] * US)
