"""The step's EP transfers: each (EP group, MoE layer, micro-batch)'s dispatch and
combine all-to-all-v (pure).

From the routing stage's sample of a group (:class:`moesim.gating.microbatch` route:
byte and token matrices) and the EP backend (:mod:`moesim.program.ep_backend`): NCCL's
pairwise all-to-all-v over the sample's byte matrices (forward) or its token matrices
reversed at bf16 gradient bytes (backward), or DeepEP's planned kernels. Every member of
the group gets the same :class:`CollectiveSpec` objects (one per group, layer,
micro-batch and direction), so the exchange is one rendezvous.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moesim.collectives.communicator import CollectiveSpec
from moesim.gating.matrices import bytes_per_token

ACT_BYTES = 2  # bf16 gradients on the wire (as moesim.program.build)


@dataclass
class EPTransfers:
    """Dispatch and combine collectives of every EP group."""

    ep_backend: object           # moesim.program.ep_backend.EPBackend
    hidden: int                  # model width: gradient bytes per token = 2 x hidden
    gpus_per_node: int           # DeepEP: ranks of a group on one node
    a2a_algo: str                # routing.a2a_algo: the pairwise exchange's algorithm
    _specs: dict = field(default_factory=dict, repr=False)

    def _cached(self, key: tuple, make) -> CollectiveSpec:
        if key not in self._specs:
            self._specs[key] = make()
        return self._specs[key]

    def exchange(self, group: tuple[int, ...], r, layer: int, mb: int,
                 phase: str) -> tuple[CollectiveSpec, CollectiveSpec]:
        """(dispatch, combine) of EP group ``group`` for route ``r`` of ``layer`` and
        micro-batch ``mb`` in ``phase``: forward, tokens out and results back; backward,
        the gradients of both with the forward's shapes reversed."""
        gkey = (group[0], layer, mb)
        tags = ("disp", "comb") if phase == "fwd" else ("bdisp", "bcomb")
        if self.ep_backend.deepep:
            L = self.ep_backend.ranks_per_node(group, self.gpus_per_node)
            mk = self.ep_backend.spec
            names = (("fwd.dispatch", "fwd.combine") if phase == "fwd"
                     else ("bwd.dispatch", "bwd.combine"))
            return (self._cached((tags[0],) + gkey, lambda: mk(r, group, names[0], L)),
                    self._cached((tags[1],) + gkey, lambda: mk(r, group, names[1], L)))
        if phase == "fwd":
            mats = (lambda: r.dispatch_bytes, lambda: r.combine_bytes)
        else:
            grad_bpt = float(ACT_BYTES * self.hidden)
            to_experts = bytes_per_token(self.ep_backend.dtypes["grad_dispatch"], self.hidden)
            mats = (lambda: r.combine_tokens * grad_bpt, lambda: r.dispatch_tokens * to_experts)
        return tuple(self._cached((tag,) + gkey, lambda m=m: CollectiveSpec(
            "all_to_all_v", group, matrix=m(), algo=self.a2a_algo))
            for tag, m in zip(tags, mats, strict=True))

    @staticmethod
    def sent_bytes(spec, pos: int) -> float:
        """Bytes group member ``pos`` sends in exchange ``spec`` (pairwise or planned)."""
        m = getattr(spec, "matrix", None)
        return float((m if m is not None else spec.byte_matrix())[pos].sum())

