"""ZeRO-3 weight all-gathers on the fast path (pure: no simpy).

As the exact builder plans them (:mod:`moesim.program.grads`): before each layer's
forward and backward, its dense weights are all-gathered over the DP × CP group and
its expert weights over the EDP group, one after the other on the rank's comm stream,
issued when the layer ``schedule.zero3_prefetch`` layers earlier started; the layer
waits for them (``zero`` in the breakdown). Ring times in closed form
(:class:`moesim.engine.fast.dp.RingCost`); DP replicas (other chains) are taken to
reach their gathers together, as the lockstep model does for every stage.
"""

from __future__ import annotations

import numpy as np

from moesim.memory.model import rank_params
from moesim.program.layer_plan import zero3_gathers


class Zero3Gathers:
    def __init__(self, ctx, groups: list[tuple[int, ...]]) -> None:
        scn, lay = ctx.res.scenario, ctx.res.layout
        self.on = zero3_gathers(scn.parallel.zero, lay)
        self.c, self.groups, self.lay = ctx, groups, lay
        self.ahead = scn.schedule.zero3_prefetch
        n = len(groups[0])
        self.free = [np.zeros(n) for _ in groups]        # comm stream free, per member
        self.starts: list[list[np.ndarray]] = [[] for _ in groups]
        self._dur: dict[tuple[int, int], np.ndarray] = {}

    def _duration(self, s: int, layer: int) -> np.ndarray:
        moe = self.c.spec.is_moe_layer(layer)
        key = (s, int(moe))
        hit = self._dur.get(key)
        if hit is None:
            par, spec = self.c.res.scenario.parallel, self.c.spec
            dense, expert = rank_params(spec, [layer], tp=par.tp, ep=par.ep, first=False,
                                        last=False, etp=par.etp)
            wb = spec.weight_bytes
            out = np.zeros(len(self.groups[s]))
            for e, r in enumerate(self.groups[s]):
                t = self.c.rings.time("all_gather", self.lay.group_of(r, "dp_cp"), dense * wb)
                eg = self.lay.group_of(r, "edp")
                if len(eg) > 1 and expert > 0:
                    t += self.c.rings.time("all_gather", eg, expert * wb)
                out[e] = t
            hit = self._dur[key] = out
        return hit

    def gather(self, s: int, layer: int, now: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) per member of layer ``layer``'s gathers; records the layer's
        start (``max(now, end)``) for the prefetch of later layers."""
        st = self.starts[s]
        issue = st[-self.ahead] if len(st) >= self.ahead else np.zeros_like(now)
        start = np.maximum(self.free[s], issue)
        end = start + self._duration(s, layer)
        self.free[s] = end
        st.append(np.maximum(now, end))
        return start, end
