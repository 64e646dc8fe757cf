"""Overlapped pairs on the fast path (moesim.engine.fast.pairs): the exact builder's
two-stream interleaving, by hand and against the exact engine."""

from types import SimpleNamespace

import numpy as np
import pytest

from moesim.engine.fast.pairs import run_pair, segments

#: deepseek-v3-2048 ships DeepSeek's MTP module and its first/last stage split; the
#: cuts below take them off (a pp 2 cut of a few layers cannot hold that split).
NO_MTP = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null")

CATS = ("compute", "ep_dispatch", "ep_combine", "tp", "stall", "bubble")


class FakeChain:
    """One rank; an all-to-all's ``rec`` is (wait for partners, transfer) seconds."""

    def __init__(self, f: float) -> None:
        self.t = [np.zeros(1)]
        self.out = [SimpleNamespace(acc={k: np.zeros(1) for k in CATS}, ep_iv=[])]
        self.c = SimpleNamespace(ep_sm_frac=f)
        self.spans = []
        self.sent = []

    def _span(self, s, kind, name, a, b, *args, **kw):
        self.spans.append((kind, name, float(a[0]), float(b[0]), kw.get("stream", "compute")))

    def _a2a_times(self, s, name, rec, a):
        start = a + rec[0]
        return start, start + rec[1], np.zeros(1, dtype=int)

    def _a2a_spans(self, s, kind, name, rec, layer, mb, phase, a, start, end, late, stream):
        self._span(s, kind, name, start, end, stream=stream)

    def _send(self, s, *args):
        self.sent.append((float(self.t[s][0]), args))


def c(w, name="c"):
    return ("c", w, name, 0, 0, "fwd", {})


def a(kind, wait, dur):
    return ("a", kind, kind, (wait, dur), 0, 0, "fwd")


def test_segments_end_at_each_all_to_all():
    ops = [c(1), a("ep_dispatch", 0, 1), c(2), a("ep_combine", 0, 1), c(3)]
    assert [len(x) for x in segments(ops)] == [2, 2, 1]


@pytest.mark.parametrize("f, want", [
    # no SM sharing: x c2 [0,2], x's dispatch [2,5]; y c1 [2,3], y's combine joins when
    # the ep stream frees at 5, ends 9; x c1 waits for its dispatch: [5,6] (3..5
    # exposed dispatch); y c1 waits for its combine: [9,10] (6..9 exposed combine)
    (0.0, {"compute": 5.0, "ep_dispatch": 2.0, "ep_combine": 3.0, "end": 10.0}),
    # half the SMs held: y c1 runs under x's dispatch at half rate [2,4]; x c1 under
    # y's combine [5,9] at half rate [5,7]; y c1 after it at full rate [9,10]
    (0.5, {"compute": 7.0, "ep_dispatch": 1.0, "ep_combine": 2.0, "end": 10.0}),
])
def test_two_stream_schedule_by_hand(f, want):
    ch = FakeChain(f)
    x = [c(2), a("ep_dispatch", 0, 3), c(1)]
    y = [c(1), a("ep_combine", 0, 4), c(1)]
    run_pair(ch, 0, x, y)
    acc = ch.out[0].acc
    for k in ("compute", "ep_dispatch", "ep_combine"):
        assert acc[k][0] == pytest.approx(want[k]), k
    assert ch.t[0][0] == pytest.approx(want["end"])
    # every instant is in one category: the categories fill the pair
    assert sum(float(v[0]) for v in acc.values()) == pytest.approx(want["end"])


def test_stall_exposed_only_while_the_compute_stream_waits():
    # x's dispatch joins at 2, waits 3 for its partners (2..5, SMs held), moves 1 (5..6);
    # y's c4 runs 2..6 (under the kernel: the wait is hidden); x's c1 at 6..7
    ch = FakeChain(0.0)
    run_pair(ch, 0, [c(2), a("ep_dispatch", 3, 1), c(1)], [c(4)])
    acc = ch.out[0].acc
    assert acc["stall"][0] == 0.0 and acc["ep_dispatch"][0] == 0.0
    assert ch.t[0][0] == pytest.approx(7.0)
    # a longer wait: the compute stream idles 6..8 on the stall, 8..9 on the transfer
    ch = FakeChain(0.0)
    run_pair(ch, 0, [c(2), a("ep_dispatch", 6, 1), c(1)], [c(4)])
    acc = ch.out[0].acc
    assert acc["stall"][0] == pytest.approx(2.0)
    assert acc["ep_dispatch"][0] == pytest.approx(1.0)
    assert ch.t[0][0] == pytest.approx(10.0)


def test_a_send_leaves_after_its_items_previous_op():
    # x: c1, send; y: c3. x's send leaves at 1 (x's last op), not at the pair's end
    ch = FakeChain(0.0)
    run_pair(ch, 0, [c(1), ("s", 1, ("act", 0, 1), 0, "fwd", 0)], [c(3)])
    assert ch.sent[0][0] == pytest.approx(1.0)
    assert ch.t[0][0] == pytest.approx(4.0)


@pytest.mark.slow
def test_dualpipe_deepep_128_gpus_within_one_percent_of_exact():
    """Issue 13: step, every breakdown category and every rank's stall within 1 % of
    the step (measured: +0.41 %, dp +0.88 %, 0.02 %; docs/results/fast-vs-exact.md)."""
    from moesim.wiring import simulate
    case = [*NO_MTP, "cluster.nodes=16", "parallel.pp=2", "parallel.ep=16", "model.layers=4",
            "model.first_dense_layers=0", "schedule.microbatches=4", "routing.max_nodes=null"]
    e = simulate("deepseek-v3-2048", [*case, "engine.mode=exact"])
    f = simulate("deepseek-v3-2048", [*case, "engine.mode=fast"])
    step = e.step_time_s
    assert abs(f.step_time_s / step - 1) < 0.01
    for k, v in e.summary["breakdown_s"].items():
        assert abs(f.summary["breakdown_s"][k] - v) < 0.01 * step, k
    for re, rf in zip(e.summary["per_rank"], f.summary["per_rank"], strict=True):
        assert abs(re["breakdown_s"]["stall"] - rf["breakdown_s"]["stall"]) < 0.01 * step


def test_compiled_slowed_equals_numpy_bit_for_bit(monkeypatch):
    """The numba loop of a compute op under a running EP kernel gives the numpy path's
    durations bit for bit (scalar and per-rank work, before, inside and after the
    kernel, ties); ``use_numba(False)`` keeps numpy."""
    pytest.importorskip("numba")
    from moesim.engine.fast import pairs
    from moesim.network import jit

    rng = np.random.default_rng(7)
    n = 257
    for f in (0.15, 0.5, 20 / 132):
        p = pairs._Pair.__new__(pairs._Pair)
        p.f = f
        for _ in range(40):
            a = rng.random(n) * rng.choice([1e-6, 1e-3, 1.0])
            j = a + (rng.random(n) - 0.5) * 1e-3
            e = j + rng.random(n) * 1e-3
            j[::7], e[::11], a[::13] = a[::7], j[::11], e[::13]   # ties
            p.kern = [(j, None, e, "ep_dispatch")]
            for w in (rng.random() * 1e-3, rng.random(n) * 1e-3, np.float64(0.0),
                      rng.random(n) * np.where(rng.random(n) < 0.3, 0.0, 2e-3)):
                monkeypatch.setattr(pairs, "_jit", {"calls": 0, "kernel": None})
                monkeypatch.setattr(pairs, "JIT_AFTER_CALLS", 10**9)
                want = p._slowed(a, w)
                monkeypatch.setattr(pairs, "JIT_AFTER_CALLS", 0)
                old = jit.use_numba(True)
                try:
                    got = p._slowed(a, w)
                    assert pairs._jit["kernel"] is not None
                    jit.use_numba(False)
                    assert pairs._compiled("slowed") is None
                finally:
                    jit.use_numba(old)
                assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_compiled_idle_split_equals_numpy_bit_for_bit():
    """The numba loop that splits a compute-stream wait between a kernel's transfer and
    its wait for partners adds the numpy expressions' values bit for bit."""
    pytest.importorskip("numba")
    from moesim.engine.fast.jit_loops import idle_split

    rng = np.random.default_rng(11)
    n = 131
    for _ in range(200):
        g0 = rng.random(n) * rng.choice([1e-6, 1e-3, 1.0])
        g1 = np.maximum(g0, g0 + (rng.random(n) - 0.3) * 1e-3)
        j = g0 + (rng.random(n) - 0.5) * 1e-3
        st = j + rng.random(n) * 1e-3 * (rng.random(n) < 0.7)
        e = st + rng.random(n) * 1e-3
        st[::5], e[::9], j[::7] = g1[::5], g0[::9], g0[::7]      # ties
        busy0, stall0 = rng.random(n), rng.random(n)
        want_b = busy0 + np.maximum(0.0, np.minimum(e, g1) - np.maximum(st, g0))
        want_s = stall0 + np.maximum(0.0, np.minimum(st, g1) - np.maximum(j, g0))
        b, s = busy0.copy(), stall0.copy()
        idle_split(b, s, j, st, e, g0, g1)
        assert b.tobytes() == want_b.tobytes() and s.tobytes() == want_s.tobytes()


# DeepSeek-V3 cut to 32 GPUs: PP2, each stage's EP16 group over two nodes, NCCL
# all-to-alls (timed flow by flow on the fast path), so a pipeline send leaves through
# the NICs its stage's all-to-alls use (benchmarks/fast_vs_exact.py, row ds32-*)
DS32 = [*NO_MTP, "model.layers=4", "model.first_dense_layers=0", "schedule.microbatches=4",
        "cluster.nodes=4", "parallel.pp=2", "parallel.ep=16", "routing.max_nodes=null",
        "parallel.ep_backend.kind=nccl",
        # these tests' all-to-all times are worked for BF16 backward dispatches (the
        # scenario sends them in FP8, as DeepSeek does: routing.grad_dispatch_dtype)
        "routing.grad_dispatch_dtype=bf16"]


@pytest.mark.slow
def test_pipeline_sends_share_nics_with_all_to_alls():
    """1F1B with static pairs: stage 0's first forward send starts while micro-batch 1's
    combine holds the NICs (ep stream), so in the exact engine it lasts 5.6 ms, not the
    1.24 ms it takes alone; the fast path runs it with that combine's flows
    (moesim.engine.fast.flow_a2a) and gets the exact engine's duration. With sends
    alone the step was -1.71 % (bubble -1.59 %); measured -0.02 %, worst category
    bubble +0.12 % (docs/results/fast-vs-exact.md). The issue's bounds: step 0.5 %,
    every category 1 % of the step."""
    from moesim.wiring import simulate
    case = [*DS32, "schedule.kind=1f1b"]
    e = simulate("deepseek-v3-2048", case, engine="exact")
    f = simulate("deepseek-v3-2048", case, engine="fast")

    def first_send(r):
        sp = [s for s in r.spans if s.rank == 0 and s.kind == "pp" and s.microbatch == 0
              and s.name == "fwd.send"]
        return sp[0].end_s - sp[0].start_s

    assert first_send(e) > 4e-3                      # shared: far above 1.24 ms alone
    assert first_send(f) == pytest.approx(first_send(e), rel=0.01)
    step = e.step_time_s
    assert abs(f.step_time_s / step - 1) < 0.005
    for k, v in e.summary["breakdown_s"].items():
        assert abs(f.summary["breakdown_s"][k] - v) < 0.01 * step, k


@pytest.mark.slow
def test_dualpipe_buckets_share_nics_with_all_to_alls():
    """DualPipe with static pairs on 32 GPUs: a stage's gradient buckets start while
    the other stage's backward runs (dp_overlap), and their ring flows share the NICs
    with its all-to-alls (exact engine: 5.2-5.6 ms each, 4.95 ms with the NICs to
    themselves). The fast path runs the buckets' rings beside the all-to-alls run flow
    by flow (moesim.engine.fast.grad_flows): every backward all-to-all of rank 0 from
    the first bucket on lasts what the exact engine's does (measured within 4.1 %;
    without the buckets 7-11 % short) and the step is within the issue's bounds
    (measured +0.10 %, was -0.57 %; docs/results/fast-vs-exact.md)."""
    from moesim.wiring import simulate
    e = simulate("deepseek-v3-2048", DS32, engine="exact")
    f = simulate("deepseek-v3-2048", DS32, engine="fast")
    first = min(s.start_s for s in e.spans if s.rank == 0 and s.kind == "dp")

    def a2as(r):
        return {(s.name, s.layer, s.microbatch): s.end_s - s.start_s for s in r.spans
                if s.rank == 0 and s.kind in ("ep_dispatch", "ep_combine")
                and s.name.startswith("bwd.") and s.start_s > first}

    got, want = a2as(f), a2as(e)
    assert len(want) >= 6 and got.keys() == want.keys()
    for k, v in want.items():
        assert v > 5.1e-3, k                              # shared: above 4.95 ms alone
        assert got[k] == pytest.approx(v, rel=0.05), k
    step = e.step_time_s
    assert abs(f.step_time_s / step - 1) < 0.005
    for k, v in e.summary["breakdown_s"].items():
        assert abs(f.summary["breakdown_s"][k] - v) < 0.01 * step, k
