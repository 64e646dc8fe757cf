"""The step's recompute stage: activation recomputation's forward kernels, re-run inside
the backward (:mod:`moesim.program.recompute` decides which).

:class:`RecomputeStage` takes its inputs explicitly (the recompute rule, the model, the
tokens a rank computes and routes per micro-batch) and prices what a layer's backward
recomputes; the builder places the ops (``bwd.recompute`` before the layer's backward,
``bwd.recompute_experts`` before its experts')."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moesim.compute.base import fused_launches
from moesim.program import recipe, recompute


@dataclass(frozen=True)
class RecomputeStage:
    """What each layer's backward recomputes, priced: the routed experts' part here (the
    layer's own ``bwd.recompute`` op is a step of its template, priced by
    :class:`moesim.program.layer_plan.LayerKernels`)."""

    rc: recompute.RecomputeRule  # which modules / experts each layer recomputes
    spec: object                 # moesim.model ModelSpec
    tokens: int                  # per rank per micro-batch (after CP)
    seq: int                     # sequence length (attention's keys)
    tp: int
    ep_tokens: int               # tokens routed per rank (sequence-parallel share)
    top_k: int                   # experts each token is routed to
    etp: int                     # expert tensor parallelism
    grouped: bool                # compute.expert_launches: later experts share launches

    def experts(self, layer: int, counts: Sequence[int], timer) -> tuple[float, float] | None:
        """(seconds, FLOP) of ``bwd.recompute_experts``: the routed experts' forward
        (``moe``, full) or activation (``moe_act``) again, each with the tokens it received
        (``counts``, the rank's experts in order), priced by ``timer``; None when the layer
        recomputes none."""
        rc = self.rc.expert_phase(layer)
        if rc is None or not counts:
            return None
        spec, etp = self.spec, self.etp

        def price(n, make, later):  # grouped: the experts after the rank's first share its launches
            fu = self.grouped and later
            return timer(("expert", n, rc, etp) + (("fused",) if fu else ()),
                         lambda: fused_launches(make(), fu))
        return recompute.expert_recompute(spec, layer, self.rc.mods(layer), list(counts), price,
                                          lambda n: recipe.expert(spec, n, etp, "fwd"))
