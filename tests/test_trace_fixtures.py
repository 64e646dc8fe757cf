"""Hand-built SimResults shared by the trace/plot tests (no tests of its own besides the
self-check of the fixture arithmetic).

The 2-rank hot-expert step, times in ms (one MoE layer 3, micro-batch 1, forward). As
in the engine, the blocking EP all-to-alls and their waits are on the compute stream;
the DP all-reduce is on the comm stream, hidden under compute:

    rank 0 compute: attn 0-1 | dispatch 1-1.5 | experts e0,e1 (200 tok) 1.5-2.3 |
                    STALL 2.3-3.5 (waits on rank 1, expert 3) | combine 3.5-4.0 | post 4.0-4.5
    rank 0 comm:    dp 4.0-4.4
    rank 1 compute: attn 0-1 | dispatch 1-1.5 | experts e2,e3 (800 tok, e3 hot: 600) 1.5-3.5 |
                    combine 3.5-4.0 | post 4.0-4.5

Breakdown (engine rule, exclusive): rank 0 compute 2.3, ep_dispatch 0.5, stall 1.2,
ep_combine 0.5 ms (dp hidden); rank 1 compute 3.5, ep_dispatch 0.5, ep_combine 0.5 ms.

Step time 4.5 ms. Critical path: r1 attn 1.0 + r1 dispatch 0.5 + r1 experts 2.0 + r0
combine 0.5 + r0 post 0.5 = 4.5 ms.
"""

from __future__ import annotations

import numpy as np

from moesim.engine.breakdown import breakdown
from moesim.trace.result import LinkStats, SimResult
from moesim.trace.spans import Span

MS = 1e-3


def _sp(rank, stream, kind, name, a_ms, b_ms, **kw) -> Span:
    kw.setdefault("layer", 3)
    kw.setdefault("microbatch", 1)
    kw.setdefault("phase", "fwd")
    return Span(rank=rank, stream=stream, kind=kind, name=name, start_s=a_ms * MS,
                end_s=b_ms * MS, **kw)


def hot_expert_spans() -> list[Span]:
    spans = []
    for r in (0, 1):
        spans += [
            _sp(r, "compute", "compute", "fwd.attn", 0.0, 1.0, flops=1e12),
            _sp(r, "compute", "ep_dispatch", "dispatch", 1.0, 1.5, bytes=7.4e6, tokens=500,
                peers=(0, 1)),
            _sp(r, "compute", "ep_combine", "combine", 3.5, 4.0, bytes=1.4e7, tokens=500,
                peers=(0, 1)),
            _sp(r, "compute", "compute", "fwd.post", 4.0, 4.5),
        ]
    spans += [
        _sp(0, "compute", "compute", "fwd.experts", 1.5, 2.3, tokens=200, experts=(0, 1)),
        _sp(1, "compute", "compute", "fwd.experts", 1.5, 3.5, tokens=800, experts=(2, 3)),
        _sp(0, "compute", "stall", "combine.wait", 2.3, 3.5, waited_on=1, expert=3, tokens=600,
            peers=(0, 1), reason="expert 3 on rank 1 has 600 tokens (3.0x mean)"),
        _sp(0, "comm", "dp", "dp.bucket0", 4.0, 4.4, bytes=1e8, layer=-1, microbatch=-1,
            phase="bwd"),
    ]
    return spans


def make_summary(spans, n_ranks, step_s, rpn, **extra) -> dict:
    mean, rows = breakdown(spans, n_ranks, step_s)
    s = {"scenario": "hand-built", "world": n_ranks, "step_time_s": step_s,
         "tokens_per_s": 500 / step_s, "mfu": 0.4, "breakdown_s": mean,
         "per_rank": [{"rank": r, "breakdown_s": row} for r, row in enumerate(rows)],
         "experts": {"tokens_per_expert": [[100, 100, 200, 600]], "dropped": 100,
                     "lb_loss": 1.6, "max_over_mean": 2.4},
         "memory": {"per_rank": [{"rank": r, "peak_bytes": 30e9 + r * 1e9,
                                  "by_category": {"weights": 20e9}} for r in range(n_ranks)],
                    "capacity_bytes": 80e9, "oom": False}}
    s.update(extra)
    return s


def hot_expert_result(**summary_extra) -> SimResult:
    spans = hot_expert_spans()
    step = 4.5 * MS
    links = LinkStats(names=["gpu0->nvsw0", "gpu1->nvsw0", "gpu0->nic0", "nic0->leaf0"],
                      kinds=["nvlink", "nvlink", "pcie", "ib"],
                      capacity_Bps=np.array([450e9, 450e9, 64e9, 50e9]),
                      bytes=np.array([2e8, 1e8, 0.0, 1.125e8]))
    return SimResult(
        spans=spans, summary=make_summary(spans, 2, step, 2, **summary_extra),
        scenario={"seed": 7, "model": {"preset": "tiny"}, "layout": {"ep": 2}},
        n_ranks=2, ranks_per_node=2, step_time_s=step, hot_ranks=[1],
        expert_tokens=np.array([[100.0, 100.0, 200.0, 600.0]]),
        expert_dropped=np.array([[0.0, 0.0, 0.0, 100.0]]),
        expert_capacity=np.array([500.0]), links=links)


def many_rank_result(n_ranks: int, rpn: int = 8, hot: int = 3) -> SimResult:
    """Each rank: compute 0-1 ms, dispatch 1-1.5 ms; rank ``hot`` computes 1.5-3 ms while
    every other rank stalls 1.5-3 ms waiting on it; step 3 ms."""
    spans = []
    for r in range(n_ranks):
        spans.append(Span(r, "compute", "compute", "fwd.attn", 0.0, 1 * MS, layer=0))
        spans.append(Span(r, "compute", "ep_dispatch", "dispatch", 1 * MS, 1.5 * MS, layer=0))
        if r == hot:
            spans.append(Span(r, "compute", "compute", "fwd.experts", 1.5 * MS, 3 * MS,
                              layer=0, experts=(r,), tokens=900))
        else:
            spans.append(Span(r, "compute", "stall", "combine.wait", 1.5 * MS, 3 * MS, layer=0,
                              waited_on=hot, expert=hot, tokens=900, reason="hot"))
    return SimResult(spans=spans, summary=make_summary(spans, n_ranks, 3 * MS, rpn),
                     scenario={"seed": 1}, n_ranks=n_ranks, ranks_per_node=rpn,
                     step_time_s=3 * MS, hot_ranks=[hot])


def test_fixture_arithmetic():
    res = hot_expert_result()
    pr = res.summary["per_rank"]
    want = [{"compute": 2.3, "ep_dispatch": 0.5, "ep_combine": 0.5, "stall": 1.2},
            {"compute": 3.5, "ep_dispatch": 0.5, "ep_combine": 0.5}]
    for row, w in zip(pr, want, strict=True):
        for k, v in row["breakdown_s"].items():
            assert abs(v - w.get(k, 0.0) * MS) < 1e-12, (k, v)
