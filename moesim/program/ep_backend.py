"""The EP backend of a step's dispatch and combine (pure; both engines use it).

``parallel.ep_backend.kind``:

* ``nccl`` (default): the pairwise all-to-all-v of :mod:`moesim.gating.matrices`, one copy
  per (token, expert); its kernels hold ``overlap.nccl_sms`` SMs;
* ``deepep``: DeepEP's normal kernels, planned by :func:`moesim.ep.plan.plan_ep_exchange`
  from the micro-batch's deduplicated copies (:mod:`moesim.gating.dedup`): one RDMA copy
  per (token, node) to the rail peer, NVLink forwarding per (token, GPU), holding
  ``sms`` SMs (default 20);
* ``deepep-ll``: the low-latency kernels, one message per (token, expert), no SMs held;
* ``hybridep``: HybridEP's kernels: DeepEP's normal copies on the links (the same plan),
  each rank done no sooner than its (token, node) bytes at HybridEP's published H100 rate
  (:mod:`moesim.ep.hybridep`; the rate stands for the SM bound and the fill and drain of
  DeepEP's kernels), holding ``sms`` SMs (default 16).

Directions: the forward dispatch sends tokens in ``routing.dispatch_dtype`` and the
forward combine expert outputs in ``routing.combine_dtype``; in the backward the
combine's gradient travels as a dispatch, in ``routing.grad_dispatch_dtype`` (bf16, or
fp8 as DeepSeek-V3 casts "the activation gradient before MoE down-projections", report
§3.3.3; its profile casts per token, then runs DeepEP's cached dispatch, under
``combine(B)``), and the dispatch's as a combine in bf16 (§3.3.3: "both the forward and
backward combine components" in BF16).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moesim.collectives.ep_exchange import EPExchangeSpec
from moesim.ep import hybridep
from moesim.ep.messages import ll_bytes_per_message
from moesim.ep.plan import check_nvl_peers, ll_matrix, plan_ep_exchange
from moesim.ep.timing import SM_WRITE_BPS, medium_rates, path_latencies
from moesim.errors import InputError
from moesim.gating.tokens import DedupCounts
from moesim.scenario.schema import step_graph_floor_s

DEEPEP_KINDS = ("deepep", "deepep-ll")
#: kinds whose exchanges are planned as DeepEP's (EPExchangeSpec): DeepEP's and HybridEP's
PLANNED_KINDS = (*DEEPEP_KINDS, "hybridep")
#: name of the engine's EP op -> (DeepEP op, which dtype) of each direction
DIRECTIONS = {
    "fwd.dispatch": ("ep_dispatch", "dispatch"),
    "fwd.combine": ("ep_combine", "combine"),
    "bwd.combine": ("ep_dispatch", "grad_dispatch"),   # gradient of the combine's output
    "bwd.dispatch": ("ep_combine", "grad"),     # gradient of the dispatched tokens
}


class EPBackend:
    """Plans the DeepEP exchanges of a step for one resolved scenario (cached per
    (EP group, layer, micro-batch, direction))."""

    def __init__(self, res, sms: int) -> None:
        scn = res.scenario
        self.kind = scn.parallel.ep_backend.kind
        self.sms = sms
        self.src = scn.source
        self.topo = res.topology
        self.hidden = res.model.hidden
        k = res.model.top_k if res.routing.top_k is None else res.routing.top_k
        self.top_k = int(k)
        self.dtypes = {"dispatch": scn.routing.dispatch_dtype,
                       "combine": scn.routing.combine_dtype, "grad": "bf16",
                       "grad_dispatch": scn.routing.grad_dispatch_dtype}
        floor = step_graph_floor_s(scn, res.device)     # DeepEP's kernels are captured
        self.launch_s = (float(getattr(res.device, "launch_overhead_s", 0.0)) if floor is None
                         else floor)
        self._bounds: dict[tuple[int, ...], tuple[float, float, dict[str, float]]] = {}
        self._counts: tuple | None = None     # (routed micro-batch, its DedupCounts)
        self._ll: dict[tuple, EPExchangeSpec] = {}  # (group, op, dtype) -> a planned LL spec
        self._ll_msg: tuple[float, float] | None = None  # bytes of an LL dispatch, combine message
        self.device = str(getattr(res.device, "name", res.device))
        if self.kind in PLANNED_KINDS:
            if res.routing.replicate:
                raise InputError(self.src, "routing.replicate",
                                 "no replicated experts with a DeepEP backend (its layout "
                                 "sends each token to the expert's one home GPU)",
                                 f"{len(res.routing.replicate)} replica specs")
            if (self.kind in ("deepep", "hybridep") and res.routing.placement is not None
                    and res.routing.placement.redundant):
                raise InputError(self.src, "routing.placement.redundant",
                                 "0 with DeepEP's normal kernels (their plan sends each token "
                                 "to the expert's one home GPU; deepep-ll sends each (token, "
                                 "expert) to the replica's GPU)", res.routing.placement.redundant)
            if self.kind == "deepep" and (sms < 2 or sms % 2):
                raise InputError(self.src, "parallel.ep_backend.sms",
                                 "an even number of SMs >= 2 (DeepEP runs 2 SMs per channel)",
                                 sms)
            if self.kind == "hybridep":       # the SMs and the combine's dtype it has rates for
                hybridep.rate_Bps(hybridep.RANKS[0], sms, "ep_combine", self.dtypes["combine"],
                                  self.src)
            dev_sms = int(getattr(res.device, "sms", 0) or 0)
            if dev_sms and sms >= dev_sms:
                raise InputError(self.src, "parallel.ep_backend.sms",
                                 f"fewer than the device's {dev_sms} SMs", sms)

    @property
    def deepep(self) -> bool:
        """Whether the exchanges are planned DeepEP-style (EPExchangeSpec): DeepEP's
        kernels and HybridEP's."""
        return self.kind in PLANNED_KINDS

    @property
    def needs_dedup(self) -> bool:
        """Whether the plan reads the (token, GPU) and (token, node) copies: the normal
        kernels and HybridEP's (the low-latency ones send one message per (token,
        expert))."""
        return self.kind in ("deepep", "hybridep")

    def ranks_per_node(self, group: tuple[int, ...], gpn: int | None) -> int:
        """EP ranks per node; DeepEP needs the group laid out node by node, equally."""
        if not gpn:
            return len(group)
        hosts = [g // gpn for g in group]
        counts = np.bincount(hosts)
        counts = counts[counts > 0]
        if len(set(counts.tolist())) != 1 or hosts != sorted(hosts):
            raise InputError(self.src, "parallel.ep_backend.kind",
                             "an EP group with the same number of ranks on every node, node "
                             "by node, for DeepEP's rail-aligned forwarding (or kind: nccl)",
                             self.kind)
        if self.kind == "hybridep":
            hybridep.check_layout(self.device, int(counts[0]), self.src)
            hybridep.rate_Bps(len(group), self.sms, "ep_combine", "bf16", self.src)
        else:
            check_nvl_peers(self.kind, int(counts[0]), self.src, "parallel.ep_backend.kind")
        return int(counts[0])

    def plan_key(self, name: str) -> tuple[str, str]:
        """(DeepEP op, dtype) of direction ``name``: directions with the same key have
        the same plan for one routed micro-batch (e.g. the forward combine and the
        backward dispatch in bf16)."""
        op, which = DIRECTIONS[name]
        return op, self.dtypes[which]

    def ll_forward(self, group: tuple[int, ...]):
        """(dispatch spec, combine spec, bytes of a dispatch message, of a combine
        message) of the forward low-latency exchanges of ``group``, once both were
        planned (:meth:`spec`); None before, or for other kernels."""
        if self.kind != "deepep-ll":
            return None
        d = self._ll.get((group, "ep_dispatch", "dispatch"))
        c = self._ll.get((group, "ep_combine", "combine"))
        if d is None or c is None:
            return None
        if self._ll_msg is None:      # the same for every micro-batch: worked out once
            self._ll_msg = (
                ll_bytes_per_message(self.dtypes["dispatch"], self.hidden, combine=False),
                ll_bytes_per_message(self.dtypes["combine"], self.hidden, combine=True))
        return (d, c, *self._ll_msg)

    def spec(self, route, group: tuple[int, ...], name: str, ranks_per_node: int
             ) -> EPExchangeSpec:
        """The planned exchange ``name`` (``fwd.dispatch`` ...) of one routed micro-batch.
        Low-latency kernels: planned once per (group, op, dtype), then only the byte
        matrix (:func:`moesim.ep.plan.ll_matrix`), the rest not depending on the counts."""
        op, which = DIRECTIONS[name]
        if self.kind == "deepep-ll":
            fixed = self._ll.get((group, op, which))
            if fixed is not None:
                matrix = ll_matrix(route.dispatch_tokens, self.dtypes[which], self.hidden,
                                   op == "ep_combine")
                matrix.setflags(write=False)
                return dataclasses.replace(fixed, matrix=matrix, sm_s=np.zeros(len(group)))
        if self._counts is None or self._counts[0] is not route \
                or self._counts[1].ranks_per_node != ranks_per_node:
            # every direction of one routed micro-batch plans from the same counts
            self._counts = (route, DedupCounts(
                pair_tokens=route.dispatch_tokens, gpu_tokens=route.gpu_tokens,
                node_tokens=route.node_tokens,
                tokens=route.assign.sum(axis=1) // max(self.top_k, 1),
                ranks_per_node=ranks_per_node))
        counts = self._counts[1]
        dtype = self.dtypes[which]
        planned = "deepep" if self.kind == "hybridep" else self.kind
        plan = plan_ep_exchange(counts, op, planned, dtype, self.hidden, self.top_k,
                                self.sms if self.kind == "deepep" else 20)
        fill, notify, _ = self._fixed(group, plan)
        matrix = sum(st.matrix for st in plan.stages)
        matrix.setflags(write=False)
        if self.kind == "hybridep":      # the published rate bounds each rank instead
            sm_s = hybridep.bound_s(counts.node_tokens, self.hidden, op, dtype, self.sms,
                                    self.src)
            return EPExchangeSpec(group=tuple(group), kernel=self.kind, ep_op=op,
                                  matrix=matrix, sm_s=sm_s, fill_s=0.0,
                                  notify_s=notify(plan), sms=self.sms)
        sm_s = (plan.sm_write_bytes / (plan.sms * SM_WRITE_BPS) if plan.sms
                else np.zeros(len(group)))
        out = EPExchangeSpec(group=tuple(group), kernel=self.kind, ep_op=op, matrix=matrix,
                             sm_s=sm_s, fill_s=fill(plan), notify_s=notify(plan),
                             sms=plan.sms)
        if self.kind == "deepep-ll":      # no SMs held, no fill or notify: as every plan
            self._ll[(group, op, which)] = out
        return out

    def _fixed(self, group: tuple[int, ...], plan):
        """Fill/drain and notify of ``plan`` on this group's links (cached per group)."""
        hit = self._bounds.get(group)
        if hit is None:
            gpus = [self.topo.gpus[r] for r in group]
            nic, nvl = medium_rates(self.topo, gpus)
            hit = self._bounds[group] = (nic, nvl, path_latencies(self.topo, gpus))
        nic, nvl, hop = hit

        def fill(p) -> float:
            chan = max(p.sms // 2, 1)
            return float(sum(b * chan / (nic if m == "rdma" else nvl) for m, b in p.fill_drain))

        def notify(p) -> float:
            return float(p.latency["rdma_hops"] * hop["rdma"] + p.latency["nvl_hops"] * hop["nvl"]
                         + p.latency["launches"] * self.launch_s)

        return fill, notify, hop
