"""The most loaded rank of every pipeline stage, for ``moesim memory`` (routing only,
no simulation).

``moesim memory`` tabulates one rank per stage with balanced routing; a skewed run
gives the rank of a hot expert larger routed-token buffers, and the run's peak is
that rank's. :func:`stage_max_rows` finds, per stage, the rank whose peak is largest
with the tokens its experts receive, as the run computes them
(:func:`moesim.engine.api.memory_summary`: per MoE layer, the most tokens received in
one micro-batch):

- ``routed``: every (EP group, MoE layer, micro-batch) is routed exactly as the step
  engines route it (same seeds, :meth:`moesim.program.token_routing.TokenRouting.route`), so the
  table's peak equals the run's; used while the routing calls stay within
  ``ROUTE_BUDGET``;
- ``expected``: beyond that, each expert's expected tokens (inclusion probability ×
  tokens of the EP group, split evenly over its replicas), which leaves out
  micro-batch-to-micro-batch variation, capacity drops and node-limited routing.
"""

from __future__ import annotations

import numpy as np

from moesim.memory.report import StageMemory
from moesim.program.build import Builder
from moesim.program.replicas import replicas_mode

#: routing calls (EP group × MoE layer × micro-batch) ``moesim memory`` makes before it
#: falls back to expected shares: hot-expert needs 8, mixtral-8x7b-64gpu 2,048,
#: deepseek-v3-2048 13,920 (about as long as the simulation itself)
ROUTE_BUDGET = 4096


def _stage_moe_layers(sm: StageMemory, b, s: int) -> list[int]:
    return [i for i in sm.stage_layers(s) if i in b.routes.moe_index]


def stage_max_rows(res) -> dict[int, dict]:
    """Per stage holding MoE layers: ``{"rank", "how", "received", **row}`` of its rank
    with the largest peak (``row``: :meth:`StageMemory.row` bytes)."""
    lay, scn = res.layout, res.scenario
    if res.model is None or not res.model.n_experts:
        return {}
    sm = StageMemory(res)
    b = Builder(res, scn.schedule.step, replicas_mode(scn), False)
    pp = lay.coords["pp"]
    calls = sum(len(_stage_moe_layers(sm, b, int(pp[g[0]]))) * b.m for g in lay.ep_groups)
    how = "routed" if calls <= ROUTE_BUDGET else "expected"
    received = np.zeros((lay.world, len(b.moe_layers)))
    if how == "routed":
        for g in lay.ep_groups:
            g = tuple(int(r) for r in g)
            for layer in _stage_moe_layers(sm, b, int(pp[g[0]])):
                for mb in range(b.m):
                    b.routes.route(g[0], g, layer, mb)
                    b.routes.forget_all()
        received = b.routes.received.astype(float)
    else:
        received = _expected(res, b, sm)
    out: dict[int, dict] = {}
    for s in range(lay.pp):
        moe = _stage_moe_layers(sm, b, s)
        if not moe:
            continue
        best = None
        for r in np.flatnonzero(pp == s):
            recv = [int(round(received[r, b.routes.moe_index[i]])) for i in moe]
            row = sm.row(s, recv)
            if best is None or row["peak_bytes"] > best["peak_bytes"]:
                best = {"rank": int(r), "how": how, "received": recv, **row}
        out[s] = best
    return out


def _expected(res, b, sm: StageMemory) -> np.ndarray:
    """(world, MoE layers) expected tokens received per micro-batch."""
    from moesim.gating.config import with_top_k
    from moesim.gating.skew import expert_shares, inclusion_probs

    spec, scn, lay = res.model, res.scenario, res.layout
    cfg = res.routing
    k = int(cfg.top_k if cfg.top_k is not None else spec.top_k)
    cfg = with_top_k(cfg, k)
    pl = b.routes.placement
    out = np.zeros((lay.world, len(b.moe_layers)))
    for j in range(len(b.moe_layers)):
        q = expert_shares(cfg, spec.n_experts, seed=scn.seed, step=b.step, layer=j,
                          source=scn.source)
        pi = inclusion_probs(q, k, strict=cfg.kind == "hot", source=scn.source)
        per_rank = np.zeros(pl.ep)
        for e, holders in enumerate(pl.layer(j).holders):
            for h in holders:
                per_rank[h] += pi[e] * b.ep_tokens * pl.ep / len(holders)
        for g in lay.ep_groups:
            for pos, r in enumerate(g):
                out[int(r), j] = per_rank[pos]
    return out
