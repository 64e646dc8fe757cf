"""The step builder's recompute ops (a mixin of :class:`moesim.program.build.Builder`):
activation recomputation's forward kernels, re-run inside the backward
(:mod:`moesim.program.recompute` decides which)."""

from __future__ import annotations

from moesim.compute.base import fused_launches
from moesim.program import recipe, recompute
from moesim.program.ops import Op


class RecomputeOps:
    """Needs the builder's spec, rc, routing, tokens, seq, tp, ep_tokens, etp, timer and
    _compute."""

    def _recompute(self, prog: list[Op], layer: int, mb: int, deps: tuple[int, ...]) -> None:
        """``bwd.recompute``: the layer's recomputed forward kernels (but the routed
        experts'), before its backward."""
        mods = self.rc.mods(layer)
        if mods:
            spec = self.spec
            k = spec.top_k if self.routing.top_k is None else self.routing.top_k
            key, make = recipe.recompute_op(spec, layer, mods, tokens=self.tokens, seq=self.seq,
                                            tp=self.tp, ep_tokens=self.ep_tokens,
                                            sent=self.ep_tokens * k)
            self._compute(prog, "bwd.recompute", layer, mb, "bwd", key, make, deps=deps)

    def _recompute_experts(self, prog: list[Op], layer: int, mb: int, local, experts,
                           recv: int) -> None:
        """``bwd.recompute_experts``: the routed experts' forward (``moe``, full) or
        activation (``moe_act``) again, each with the tokens it received."""
        rc = self.rc.expert_phase(layer)
        if rc is None or not experts:
            return
        spec, etp = self.spec, self.etp

        def price(n, make, later):  # grouped: the experts after the rank's first share its launches
            fu = self.grouped and later
            return self.timer(("expert", n, rc, etp) + (("fused",) if fu else ()),
                              lambda: fused_launches(make(), fu))
        t_rc, f_rc = recompute.expert_recompute(
            spec, layer, self.rc.mods(layer), [int(local[e]) for e in experts], price,
            lambda n: recipe.expert(spec, n, etp, "fwd"))
        prog.append(Op(stream="compute", kind="compute", name="bwd.recompute_experts",
                       duration_s=t_rc, flops=f_rc, layer=layer, microbatch=mb, phase="bwd",
                       tokens=recv))
