"""FP8 GEMMs of a DualPipe training step on the SMs DeepEP leaves (``overlap.gemm_sms:
left_by_ep``, moesim.compute.pinned_sms.step_gemms): priced by wave quantisation on
S - held SMs for the whole step, pairs and lone chunks alike, and not slowed again while
the EP kernels hold SMs, in both engines.

Hand cases:

- DeepSeek-V3's attention output projection on an H800 (132 SMs, DeepEP holding 20): a
  4,096 x 7,168 output is 32 x 56 = 1,792 tiles of 128 x 128, 14 waves on 132 SMs
  (ceil(1792 / 132) = 14) and 16 on 112 (1792 / 112 = 16): its work takes 16/14 as long,
  its launch cost unchanged. The q up-projection (4,096 x 1,536: 32 x 12 = 384 tiles)
  goes from 3 waves to 4; the kv down-projection (4,096 x 576: 32 x 5 = 160 tiles) stays
  at 2 waves on both.
- One overlapped pair on the fast path (a kernel holding half the SMs, f = 0.5): x = c2,
  dispatch (3 s), c1 (half of it pinned); y = c1 (all pinned), combine (4 s), c1. x's c2
  [0, 2]; the dispatch [2, 5]; y's pinned c1 runs under it at full rate [2, 3]; y's
  combine waits for the ep stream, [5, 9]; x's c1 waits for its dispatch (3..5 exposed)
  and runs under the combine, a second of its work taking 0.5 + 0.5 / 0.5 = 1.5 s:
  [5, 6.5]; y's c1 waits for the combine (6.5..9 exposed), [9, 10]. Compute 5.5 s,
  exposed dispatch 2 s, combine 2.5 s, end 10 s (without pinning: compute 7, 1, 2).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from moesim.cli import main
from moesim.compute.base import per_launch_s
from moesim.compute.pinned_sms import PinnedGemms, is_pinned, step_gemms
from moesim.engine.fast.pairs import pinned_rate, run_pair
from moesim.program.build import Builder
from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate

#: a 16-GPU cut of deepseek-v3-2048 (2 stages of 2 MoE layers, EP8 with DeepEP on 20 SMs,
#: 4 micro-batches: each rank runs lone chunks and one overlapped F&B pair)
CUT = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
       "parallel.decoder_last_pipeline_num_layers=null", "cluster.nodes=2",
       "parallel.pp=2", "parallel.ep=8", "model.layers=4", "model.first_dense_layers=0",
       "schedule.microbatches=4", "routing.max_nodes=null")
ON = "overlap.gemm_sms=left_by_ep"
OFF = "overlap.gemm_sms=all"


def _res(*over: str):
    return resolve(load_scenario("deepseek-v3-2048", [*CUT, *over]))


# ------------------------------------------------------------ pricing on 112 of 132 SMs

def test_fp8_gemms_priced_in_waves_on_the_sms_deepep_leaves():
    res = _res(ON)
    b = Builder(res, 0)
    pm = b.timer.model
    assert isinstance(pm, PinnedGemms) and (pm.sms, pm.total) == (112, 132)
    prog = b.dualpipe.program(0)
    attn = next(o for o in prog if o.name == "fwd.attn")
    base = res.compute
    launch = res.compute.launch_overhead_s
    gemms = {(k.m, k.n): k for k in attn.kernels if k.kind == "gemm"}
    for (m, n), (w132, w112) in {(4096, 7168): (14, 16), (4096, 1536): (3, 4),
                                 (4096, 576): (2, 2)}.items():
        k = gemms[(m, n)]
        fixed = per_launch_s(k, launch, 0.0)
        assert pm.time_s(k) == pytest.approx(fixed + (base.time_s(k) - fixed) * w112 / w132,
                                             rel=1e-12)
    # the op's pinned part is its FP8 GEMMs' time; the rest (norms, casts, attention)
    # keeps the whole GPU
    want = sum(pm.time_s(k) for k in attn.kernels if is_pinned(k, "fp8"))
    assert attn.pinned_s == pytest.approx(want, rel=1e-12)
    assert 0 < attn.pinned_s < attn.duration_s
    assert attn.duration_s == pytest.approx(sum(pm.time_s(k) for k in attn.kernels))
    # the router's GEMM is BF16 (cuBLAS on the whole GPU): nothing pinned
    assert next(o for o in prog if o.name == "fwd.router").pinned_s == 0.0


def test_lone_chunks_and_pairs_both_pinned():
    b = Builder(_res(ON), 0)
    prog = b.dualpipe.program(0)
    items = [it.kind for it in b.dual.items[0]]
    assert items[0] == "F" and "F&B" in items     # a warm-up forward, then a pair
    first = next(o for o in prog if o.name == "fwd.experts")          # the lone forward
    assert first.microbatch == b.dual.items[0][0].mb and first.pinned_s > 0
    pair = b.dual.items[0][items.index("F&B")]
    w = [o for o in prog if o.name == "bwd.w_experts" and o.microbatch == pair.bmb]
    assert w and all(o.pinned_s > 0 for o in w)                       # inside the pair
    off = Builder(_res(OFF), 0)
    assert not isinstance(off.timer.model, PinnedGemms)
    assert all(o.pinned_s == 0 for o in off.dualpipe.program(0))


# ------------------------------------------------------------ the fast pair by hand

class FakeChain:
    """One rank; an all-to-all's ``rec`` is (wait for partners, transfer) seconds."""

    def __init__(self, f: float) -> None:
        cats = ("compute", "ep_dispatch", "ep_combine", "tp", "stall", "bubble")
        self.t = [np.zeros(1)]
        self.out = [SimpleNamespace(acc={k: np.zeros(1) for k in cats}, ep_iv=[])]
        self.c = SimpleNamespace(ep_sm_frac=f)

    def _span(self, *args, **kw):
        pass

    def _a2a_times(self, s, name, rec, a):
        start = a + rec[0]
        return start, start + rec[1], np.zeros(1, dtype=int)

    def _a2a_spans(self, *args, **kw):
        pass


def c(w: float, pinned: float | None = None) -> tuple:
    op = ("c", w, "c", 0, 0, "fwd", {})
    return op if pinned is None else (*op, pinned)


def a(kind: str, dur: float) -> tuple:
    return ("a", kind, kind, (0.0, dur), 0, 0, "fwd")


@pytest.mark.parametrize("pins, want", [
    ((None, None), {"compute": 7.0, "ep_dispatch": 1.0, "ep_combine": 2.0}),
    ((0.5, 1.0), {"compute": 5.5, "ep_dispatch": 2.0, "ep_combine": 2.5}),
])
def test_pinned_ops_in_a_fast_pair_by_hand(pins, want):
    ch = FakeChain(0.5)
    x = [c(2), a("ep_dispatch", 3), c(1, pins[0])]
    y = [c(1, pins[1]), a("ep_combine", 4), c(1)]
    run_pair(ch, 0, x, y)
    acc = ch.out[0].acc
    for k, v in want.items():
        assert acc[k][0] == pytest.approx(v, rel=1e-12), k
    assert ch.t[0][0] == pytest.approx(10.0, rel=1e-12)


def test_pinned_rate_scalar_and_per_rank():
    assert pinned_rate(2.0, 0.0, 0.2) == 0.8            # nothing pinned: 1 - f
    assert pinned_rate(2.0, 2.0, 0.2) == pytest.approx(1.0)
    got = pinned_rate(np.array([2.0, 2.0, 0.0]), np.array([1.0, 0.0, 0.0]), 0.2)
    assert got == pytest.approx([1 / (0.5 + 0.5 / 0.8), 0.8, 0.8])


# ------------------------------------------------------------ both engines

def test_exact_and_fast_agree_and_the_knob_moves_compute():
    runs = {(gs, m): simulate("deepseek-v3-2048", [*CUT, f"overlap.gemm_sms={gs}",
                                                   f"engine.mode={m}"], record_series=False)
            for gs in ("all", "left_by_ep") for m in ("exact", "fast")}
    for gs in ("all", "left_by_ep"):
        e, f = runs[(gs, "exact")].summary, runs[(gs, "fast")].summary
        step = e["step_time_s"]
        assert f["step_time_s"] == pytest.approx(step, rel=0.01)
        assert f["breakdown_s"]["compute"] == pytest.approx(e["breakdown_s"]["compute"],
                                                            rel=1e-6)
        for k, v in e["breakdown_s"].items():
            assert abs(f["breakdown_s"][k] - v) < 0.01 * step, k
    on = runs[("left_by_ep", "exact")].summary
    off = runs[("all", "exact")].summary
    assert on["breakdown_s"]["compute"] > 1.03 * off["breakdown_s"]["compute"]
    assert runs[("left_by_ep", "fast")].scenario["overlap"]["gemm_sms"] == "left_by_ep"
    assert "gemm_sms" not in runs[("all", "fast")].scenario["overlap"]


# ------------------------------------------------------------ scenario input

def test_bad_value_is_one_line(capsys):
    assert main(["run", "deepseek-v3-2048", "--set", "overlap.gemm_sms=half"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "overlap.gemm_sms" in err


def test_changes_nothing_outside_dualpipe():
    # the profiled step is DualPipe's; a what-if that swaps the schedule keeps working
    # and prices every kernel on the whole GPU
    res = _res(ON, "schedule.kind=1f1b", "schedule.microbatches=4")
    assert step_gemms(res) is None
    assert not isinstance(Builder(res, 0).timer.model, PinnedGemms)
    assert isinstance(step_gemms(_res(ON)), PinnedGemms)
    # nor where the EP kernels hold no SMs (DeepEP's low-latency kernels)
    assert step_gemms(_res(ON, "parallel.ep_backend.kind=deepep-ll")) is None
