"""The low-latency exchange's byte matrix without its plan (:func:`moesim.ep.plan.ll_matrix`,
what :meth:`moesim.program.ep_backend.EPBackend.spec` uses once a group's low-latency
plan is known) equals the plan's stages summed, bit for bit and in the same layout."""

from __future__ import annotations

import numpy as np

from moesim.ep import plan as ep_plan
from moesim.gating.tokens import DedupCounts


def _stages_summed(pair: np.ndarray, op: str, dtype: str, per: int) -> np.ndarray:
    n = pair.shape[0]
    counts = DedupCounts(pair_tokens=pair, gpu_tokens=pair, node_tokens=np.zeros((n, 1)),
                         tokens=pair.sum(axis=1), ranks_per_node=per)
    plan = ep_plan.plan_ep_exchange(counts, op, "deepep-ll", dtype, 7168, 8)
    return sum(st.matrix for st in plan.stages)


def test_ll_matrix_equals_the_plans_stages_summed():
    rng = np.random.default_rng(5)
    for n, per in ((16, 8), (64, 8), (128, 8), (8, 8)):
        pair = rng.integers(0, 500, (n, n)) * (rng.random((n, n)) < 0.7)
        for op, dtype in (("ep_dispatch", "fp8"), ("ep_combine", "bf16"),
                          ("ep_dispatch", "bf16")):
            want = _stages_summed(pair, op, dtype, per)
            got = ep_plan.ll_matrix(pair, dtype, 7168, op == "ep_combine")
            assert got.tobytes(order="A") == want.tobytes(order="A")
            assert got.tobytes() == want.tobytes()
            assert got.flags.c_contiguous == want.flags.c_contiguous
            assert got.sum(axis=1).tobytes() == want.sum(axis=1).tobytes()


def test_ll_spec_after_the_first_plan_equals_a_planned_spec():
    """A backend that planned a group's exchange once gives, for later routed
    micro-batches, the spec a fresh backend plans (matrix, bounds, fill, notify)."""
    from moesim.program.ep_backend import EPBackend
    from moesim.serve.program import ServeBuilder
    from moesim.serve.run import resolve_serve

    res, cfg = resolve_serve("deepseek-v3-decode", [])
    b = ServeBuilder(res, cfg).builder
    be = b.ep_backend
    assert be.kind == "deepep-ll"
    g = tuple(int(x) for x in res.layout.ep_groups[0])
    per = be.ranks_per_node(g, b.gpn)
    layers = sorted(b.moe_layers)[:2]
    for layer in layers:
        for mb in (0, 1):
            r = b.routes.route(g[0], g, layer, mb)
            for name in ("fwd.dispatch", "fwd.combine"):
                got = be.spec(r, g, name, per)
                want = EPBackend(res, be.sms).spec(r, g, name, per)
                assert got == want          # group, kernel, op, fill, notify, SMs
                assert got.matrix.tobytes(order="A") == want.matrix.tobytes(order="A")
                assert got.matrix.flags.c_contiguous == want.matrix.flags.c_contiguous
                assert not got.matrix.flags.writeable
                assert got.sm_s.tobytes() == want.sm_s.tobytes()
    assert len(be._ll) == 2      # planned once per (group, op, dtype)
