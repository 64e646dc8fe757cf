"""TP, SP, CP and ETP collectives of a rank's program (pure; mixed into the builder).

Megatron-Core's layouts (megatron/core/parallel_state.py; docs/scenarios.md "Parallel
folding"): the TP all-reduce, or with sequence parallelism its reduce-scatter +
all-gather; context parallelism's ring KV exchange beside attention
(:mod:`moesim.program.cp`); expert tensor parallelism's all-gather / reduce-scatter
around the expert GEMMs (:mod:`moesim.program.etp`). Every one is charged to the
``tp`` category of the breakdown; span names tell them apart (``sp_*``, ``cp_kv``,
``etp_*``).
"""

from __future__ import annotations

import numpy as np

from moesim.collectives.communicator import CollectiveSpec
from moesim.program import cp as cpx
from moesim.program import etp as etpx
from moesim.program import tp_overlap
from moesim.program.ops import Op

ACT_BYTES = 2  # bf16 activations on the wire (as moesim.program.build)


class FoldedOps:
    """Mixin for :class:`moesim.program.build.Builder` (uses its layout, spec, tokens
    and op helpers)."""

    def _tp_allreduce(self, prog: list[Op], rank: int, layer: int, mb: int, phase: str,
                      which: str) -> None:
        """The TP all-reduce after attention / MLP; with sequence parallelism
        (Megatron-LM arXiv:2205.05198 §4.2.2) a reduce-scatter of the block's output and
        an all-gather of the next block's input instead (same bytes on a ring). An MoE
        layer takes sequence-parallel input, so it keeps only the reduce-scatter after
        attention and the all-gather before the next attention."""
        if self.tp <= 1:
            return
        group = self.lay.group_of(rank, "tp")
        nbytes = float(self.tokens * self.spec.hidden * ACT_BYTES)
        if not self.sp:
            spec = self._spec(("tp", group), lambda: CollectiveSpec("all_reduce", group, nbytes))
            self._coll(prog, "tp", f"{phase}.tp_{which}", spec,
                       ("tp", which, layer, mb, phase, group[0]), layer, mb, phase, nbytes)
            return
        ops = ("reduce_scatter", "all_gather")
        if self.spec.is_moe_layer(layer):
            # with TE's overlap the backward's exchanges are the gradients' own kinds
            swap = phase == "bwd" and tp_overlap.enabled(self.scn)    # (tp_overlap)
            ops = ops[:1] if (which == "attn") != swap else ops[1:]
        for op in ops:
            spec = self._spec(("sp", op, group), lambda o=op: CollectiveSpec(o, group, nbytes))
            self._coll(prog, "tp", f"{phase}.sp_{which}_{op}", spec,
                       ("sp", op, which, layer, mb, phase, group[0]), layer, mb, phase, nbytes)

    def _attention(self, prog: list[Op], rank: int, layer: int, mb: int, phase: str, attn,
                   attn_k, deps: tuple[int, ...] = ()) -> None:
        """Attention; with CP the ring's KV exchange on its own stream beside it, and
        the next op waiting for both (moesim.program.cp)."""
        if self.cp <= 1:
            self._compute(prog, f"{phase}.attn", layer, mb, phase, attn, attn_k, deps=deps)
            return
        group = self.lay.group_of(rank, "cp")
        spec = self._spec(("cp", group, phase), lambda: cpx.kv_spec(
            group, self.spec, self.tokens, self.tp, phase))
        kv = len(prog)
        self._coll(prog, "tp", f"{phase}.cp_kv", spec, ("cp", layer, mb, phase, group[0]),
                   layer, mb, phase, cpx.kv_exchange_bytes(self.spec, self.tokens, self.tp,
                                                           self.cp, phase),
                   stream="cp", deps=deps + ((kv - 1,) if kv else ()))
        self._compute(prog, f"{phase}.attn", layer, mb, phase, attn, attn_k, deps=deps)
        prog.append(Op(stream="compute", kind="compute", name=f"{phase}.cp_wait",
                       layer=layer, microbatch=mb, phase=phase, deps=(kv,)))

    def _expert_tokens(self, rank: int, r, pos: int, layer: int, mb: int):
        """(tokens per local expert this rank computes, its ETP group): with ETP > 1 the
        tokens every ETP peer received (same EP position, other EP groups), gathered."""
        local = r.rank_expert_tokens[pos]
        if self.etp <= 1:
            return local, ()
        group = self.lay.group_of(rank, "etp")
        total = np.zeros_like(local)
        for peer in group:
            g = self.lay.group_of(peer, "ep")
            total = total + self.routes.route(g[0], g, layer, mb).rank_expert_tokens[g.index(peer)]
        return total, group

    def _etp(self, prog: list[Op], group, gathered, layer: int, mb: int, phase: str,
             which: int) -> None:
        """ETP all-gather (which 0, before the experts) or reduce-scatter (1, after)."""
        if len(group) <= 1:
            return
        n = int(gathered.sum())
        specs = self._spec(("etp", group, layer, mb, phase),
                           lambda: etpx.etp_specs(group, self.spec, n))
        name = ("etp_gather", "etp_scatter")[which]
        self._coll(prog, "tp", f"{phase}.{name}", specs[which],
                   ("etp", which, layer, mb, phase, group[0]), layer, mb, phase,
                   specs[which].nbytes)
