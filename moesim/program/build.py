"""Build every rank's op program for one training step (pure: no simpy).

From the resolved scenario (layout, model, routing policy, compute model, pipeline
schedule) this produces, for each global rank, the ordered ops of its streams:

- ``compute``: kernels (durations from the compute model) and the collectives that
  block it: TP all-reduce, EP dispatch/combine all-to-all-v, ZeRO-3 weight
  all-gathers' consumers, pipeline receives;
- ``comm``: data-parallel gradient buckets (all-reduce, or reduce-scatter with ZeRO)
  that overlap backward, ZeRO-3 weight all-gathers prefetched one layer ahead, the
  ZeRO-1/2 parameter all-gather after the optimizer;
- ``pp``: eager pipeline sends of activations and gradients (``ep``: own-stream EP;
  ``tp_ub``: TP pieces beside GEMMs, :mod:`moesim.program.tp_overlap`).

Routing is sampled per (EP group, MoE layer, micro-batch) by
:func:`moesim.gating.route_microbatch`; the same byte matrix is handed to every member
of the group, so dispatch and combine are exact all-to-all-v exchanges. Expert
popularity depends on (seed, step, layer) only, shared by all data-parallel replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moesim.collectives.communicator import CollectiveSpec
from moesim.compute.base import Kernel
from moesim.compute.select import grouped_experts
from moesim.gating.eplb_placement import step_placement
from moesim.program import recipe, recompute, shared_overlap, tp_overlap
from moesim.program.dualpipe_build import DualPipeProgram, a2a_program, inflight
from moesim.program.ep_backend import EPBackend
from moesim.program.ep_transfers import EPTransfers
from moesim.program.folding import FoldedTransfers, Transfer
from moesim.program.grads import GradientStage
from moesim.program.layer_plan import LayerKernels, LayerPlan, is_recompute
from moesim.program.ops import Op
from moesim.program.overlap import PairRule, ep_stream, interleave
from moesim.program.recompute_ops import RecomputeStage
from moesim.program.replicas import ReplicaMap, replica_map
from moesim.program.timer import Timer
from moesim.program.token_routing import TokenRouting
from moesim.scenario.checks import check_seq
from moesim.schedule.dualpipe import KINDS as DUAL_KINDS
from moesim.schedule.dualpipe import make_dual_order
from moesim.schedule.layout_string import stage_chunks
from moesim.schedule.pipeline import make_order

ACT_BYTES = 2  # bf16 activations and gradients on the wire (Megatron default dtype)


@dataclass
class StepPlan:
    programs: list[list[Op]]
    moe_layers: list[int]                       # global indices of MoE layers
    expert_tokens: np.ndarray                   # (moe_layers, E) assignments routed, pre-drop
    expert_kept: np.ndarray                     # (moe_layers, E) computed
    expert_dropped: np.ndarray                  # (moe_layers, E)
    expert_capacity: np.ndarray                 # (moe_layers,) per-expert capacity in the step
                                                # (summed over sources and micro-batches; inf: none)
    lb_loss: np.ndarray                         # (moe_layers,) mean over micro-batches/groups
    rank_received: np.ndarray                   # (world, moe_layers) max tokens received per mb
    model_flops: float                          # FLOP of all compute ops (optimizer excluded)
    tokens_per_step: int                        # tokens of the global batch
    hot_ranks: list[int] = field(default_factory=list)
    inflight: list[int] = field(default_factory=list)  # activations alive per stage (mbs)
    eplb: object = None      # routing.placement's LayerPlacements (moesim.gating.eplb_placement)


def build_step(res, step: int | None = None, *, replicas: str = "independent",
               dedup: bool = False) -> StepPlan:
    """Programs for every rank of ``res`` (a :class:`moesim.scenario.resolved.Resolved`) for
    training step ``step`` (default: the scenario's ``schedule.step``).

    ``replicas="identical"``: every expert-data-parallel replica of an EP group samples
    the same tokens (:mod:`moesim.program.replicas`); ``dedup`` (identical only) then
    builds programs for the representatives only (mirrors get an empty program) while
    every statistic (expert tokens, FLOPs, tokens received per rank) still counts all
    ranks."""
    if dedup and replicas != "identical":
        raise ValueError("dedup needs replicas='identical'")
    return Builder(res, res.scenario.schedule.step if step is None else step,
                    replicas, dedup).build()


class Builder:
    """Every rank's program of one step, composed of stages with explicit inputs:
    routing (:class:`~moesim.program.token_routing.TokenRouting`, ``routes``) -> kernels
    (:mod:`moesim.program.recipe`; recompute: :class:`RecomputeStage`, ``recompute``) ->
    transfers (EP all-to-alls: :class:`EPTransfers`, ``ep_transfers``; TP/SP/CP/ETP:
    :class:`FoldedTransfers`, ``folded``; gradient buckets and ZeRO:
    :class:`GradientStage`, ``grads``) -> schedule (the pipeline order's items here;
    DualPipe(V): :class:`DualPipeProgram`, a2a-1f1b: :func:`a2a_program`). The builder
    places each stage's ops in the rank's program."""

    def __init__(self, res, step: int, replicas: str = "independent",
                 dedup: bool = False, rmap: ReplicaMap | None = None) -> None:
        self.res = res
        self.scn = scn = res.scenario
        self.spec = res.model
        self.lay = res.layout
        self.step = step
        sch, par = scn.schedule, scn.parallel
        self.tp, self.pp, self.ep, self.dp = par.tp, par.pp, par.ep, self.lay.dp
        self.zero = par.zero
        self.v = par.vpp if sch.kind == "interleaved" else 1
        self.m = sch.microbatches
        self.seq = sch.seq_len
        # Megatron-Core folding: CP splits the sequence, ETP the experts, SP the TP all-reduce
        self.cp, self.etp = self.lay.cp, self.lay.etp
        self.sp = bool(par.sequence_parallel) and self.tp > 1
        check_seq(scn.source, sch.seq_len, self.cp)
        self.tokens = sch.micro_batch_size * sch.seq_len // self.cp  # per rank per micro-batch
        self.ep_tokens = max(1, self.tokens // self.tp)          # routed per rank (seq-parallel)
        self.timer = Timer(res.compute)
        self.grouped = grouped_experts(self.scn.compute)   # compute.expert_launches
        # DualPipe(V): per-rank items (moesim.schedule.dualpipe) instead of a stage order
        self.dual = (make_dual_order(sch.kind, self.pp, self.m) if sch.kind in DUAL_KINDS
                     else None)
        self.order = make_order(sch.kind, self.pp, self.m, self.v) if self.dual is None else None
        self.pairs = PairRule(self.order, self.pp, self.v) if self.dual is None else None
        self.chunks = stage_chunks(scn, self.spec, self.dual.stages if self.dual is not None
                                   else self.pp * self.v, dual=self.dual is not None)
        self.rc = recompute.RecomputeRule(scn.memory, self.chunks, self.spec)
        self.gpn = scn.gpus_per_node
        self.routing = res.routing
        E = self.spec.n_experts
        placement = step_placement(self.routing, n_experts=E, ep=self.ep,
                                   source=scn.source) if E else None
        self._specs: dict[tuple, CollectiveSpec] = {}
        self.layer_starts: list[int] = []
        self.a2a_algo = scn.routing.a2a_algo
        # SMs held by communication kernels while in flight (compute shares the rest)
        self.nccl_sms = scn.overlap.nccl_sms
        self.ep_sms = par.ep_backend.held_sms(self.nccl_sms)
        self.ep_backend = EPBackend(res, self.ep_sms)
        self.flops = 0.0
        # rmap: a caller's own representatives (sampled replicas, moesim.engine.fast.sampled)
        self.rmap: ReplicaMap | None = rmap if rmap is not None else (
            replica_map(self.lay) if replicas == "identical" else None)
        self.dedup = dedup
        # stage 1, token routing: every (EP group, MoE layer, micro-batch)'s sample and the
        # step's expert statistics (the later stages and the fast engine read it)
        self.routes = TokenRouting(res, step, placement=placement, ep_tokens=self.ep_tokens,
                                   microbatches=self.m, rmap=self.rmap, dedup=dedup,
                                   ep_backend=self.ep_backend)
        self.moe_layers = self.routes.moe_layers
        # the gradient stage: DP buckets, optimizer placement, ZeRO gathers (comm stream)
        self.grads = GradientStage.of(scn, self.lay, self.spec, self.routes)
        # the EP transfers: every group's dispatch / combine all-to-all-v
        self.ep_transfers = EPTransfers(self.ep_backend, self.spec.hidden, self.gpn,
                                        self.a2a_algo)
        # the folded-parallelism transfers: TP / SP all-reduces, CP's KV ring, ETP's gathers
        self.folded = FoldedTransfers(self.lay, self.spec, self.tokens, self.tp, self.sp,
                                      self.cp, self.etp, tp_overlap.enabled(scn), self.routes)
        # the schedule stage of DualPipe(V) orders (a2a-1f1b: a2a_program)
        self.dualpipe = (DualPipeProgram(self, self.dual, self.fb_overlap)
                         if self.dual is not None else None)
        # the recompute stage: what each layer's backward recomputes, priced
        self.recompute = RecomputeStage(
            self.rc, self.spec, self.tokens, self.seq, self.tp, self.ep_tokens,
            self.spec.top_k if self.routing.top_k is None else self.routing.top_k,
            self.etp, self.grouped)
        # one layer's op order (moesim.program.layer_plan): every writer walks it
        self.layer_plan = LayerPlan.of(res, self.spec)
        side = self.layer_plan.facts["side"]
        self.kernels = LayerKernels(
            self.spec, self.tokens, self.seq, self.tp, self.ep_tokens,
            self.ep_tokens * self.recompute.top_k, scn.overlap.cuda_graphs, side, self.rc,
            self.etp, self.sp)

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the same expert shards as ``rank`` (:class:`GradientStage`)."""
        return self.grads.expert_dp_group(rank)

    def inflight(self) -> list[int]:
        """Activations alive per pipeline stage (micro-batches) under this schedule."""
        return inflight(self)

    @property
    def fb_overlap(self) -> bool:
        """A DualPipe F&B pair interleaves its EP all-to-alls (static overlap, EP > 1)."""
        return self.scn.overlap.kind == "static" and self.ep > 1

    # ---------------------------------------------------------------- programs
    def build(self, rank_program=None) -> StepPlan:
        """Every rank's program (``rank_program``: rank -> its ops; default the training
        step's; a forward-only step such as serving passes its own) and the step's
        statistics."""
        program = rank_program or self._rank_program
        world = self.lay.world
        programs: list[list[Op]] = []
        for r in range(world):
            if self.dedup and self.rmap is not None and not self.rmap.is_rep(r):
                programs.append([])          # a mirror: its representative stands for it
                continue
            before = self.flops
            programs.append(program(r))
            if self.dedup and self.rmap is not None:  # the mirrors do the same FLOPs
                self.flops += (self.flops - before) * len(self.rmap.mirrors.get(r, ()))
        return StepPlan(programs=programs, model_flops=self.flops,
                        tokens_per_step=self.tokens * self.m * self.dp * self.cp,
                        inflight=self.inflight(), **self.routes.stats())

    def _rank_program(self, rank: int) -> list[Op]:
        if self.dual is not None:
            return self.dualpipe.program(rank)
        if self.scn.overlap.kind == "a2a-1f1b":
            return a2a_program(self, rank)
        lay = self.lay
        stage = int(lay.coords["pp"][rank])
        pp_group = lay.group_of(rank, "pp")
        prog: list[Op] = []
        self.layer_starts = []
        last_bwd: dict[int, int] = {}    # layer -> index of its last backward op
        overlap = self.scn.overlap.ep_comm_overlap and self.ep > 1
        own_stream = (overlap or self.ep_backend.deepep    # DeepEP; shared experts beside
                      or shared_overlap.enabled(self.scn, self.spec))
        pending = None   # (start index in prog, schedule item) of an unpaired item
        for item in self.order[stage]:
            item_start = len(prog)
            self.item_ops(prog, rank, stage, pp_group, item, last_bwd)
            if tp_overlap.enabled(self.scn):    # TE userbuffers: TP comm beside GEMMs
                tp_overlap.rewrite(prog, item_start, last_bwd, self.res, self.timer.model)
            if own_stream:
                ep_stream(prog, item_start)
            if not overlap:
                continue
            if pending is not None and self.pairs.can_pair(stage, pending[1], item):
                interleave(prog, pending[0], item_start, last_bwd)
                pending = None
                self.layer_starts = []
            else:
                pending = (item_start, item)
        self.gradient_ops(prog, rank, stage, last_bwd)
        return prog

    # ---------------------------------------------------------------- one schedule item
    def item_ops(self, prog: list[Op], rank: int, stage: int, pp_group, item,
              last_bwd: dict[int, int]) -> None:
        p = self.pp
        vstage = item.chunk * p + stage
        layers = list(self.chunks[vstage])
        last_v = p * self.v - 1
        if item.kind == "F":
            if vstage > 0:
                src = pp_group[(vstage - 1) % p]
                prog.append(self.recv_op(src, ("act", item.mb, vstage, rank), item.mb, "fwd",
                                       layers[0] if layers else -1))
            if vstage == 0:
                self.compute_op(prog, "fwd.embedding", -1, item.mb, "fwd", ("emb", "fwd"),
                                lambda: recipe.embedding(self.spec, self.tokens, self.tp, "fwd"))
            for layer in layers:
                self.layer_ops(prog, rank, layer, item.mb, "fwd")
            if vstage == last_v:
                self.compute_op(prog, "fwd.lm_head", -1, item.mb, "fwd", ("lm", "fwd"),
                                lambda: recipe.lm_head(self.spec, self.tokens, self.tp, "fwd",
                                                       self.sp))
            else:
                dst = pp_group[(vstage + 1) % p]
                prog.append(self.send_op(prog, dst, ("act", item.mb, vstage + 1, dst), item.mb,
                                       "fwd", layers[-1] if layers else -1))
        else:
            if vstage < last_v:
                src = pp_group[(vstage + 1) % p]
                prog.append(self.recv_op(src, ("grad", item.mb, vstage, rank), item.mb, "bwd",
                                       layers[-1] if layers else -1))
            else:
                self.compute_op(prog, "bwd.lm_head", -1, item.mb, "bwd", ("lm", "bwd"),
                                lambda: recipe.lm_head(self.spec, self.tokens, self.tp, "bwd",
                                                       self.sp))
            for layer in reversed(layers):
                self.layer_ops(prog, rank, layer, item.mb, "bwd")
                last_bwd[layer] = len(prog) - 1
            if vstage > 0:
                dst = pp_group[(vstage - 1) % p]
                prog.append(self.send_op(prog, dst, ("grad", item.mb, vstage - 1, dst), item.mb,
                                       "bwd", layers[0] if layers else -1))

    # ------------------------------------------- pieces (public: serving writes its ops)
    def compute_op(self, prog: list[Op], name: str, layer: int, mb: int, phase: str,
                   key: tuple, make, deps: tuple[int, ...] = (), **kw) -> None:
        """A compute op priced by the timer under ``key`` (``make``: its kernels)."""
        t, fl = self.timer(key, make)
        if name != "opt.adam" and not is_recompute(name):  # model FLOPs only
            self.flops += fl
        prog.append(Op(stream="compute", kind="compute", name=name, duration_s=t, flops=fl,
                       layer=layer, microbatch=mb, phase=phase, deps=deps,
                       kernels=self.timer.kernels_for(key), **kw))

    def gradient_ops(self, prog: list[Op], rank: int, stage: int, last_bwd: dict[int, int],
                   parts: list[tuple] | None = None) -> None:
        """The gradient stage's ops after the rank's backward, the optimizer between."""
        self.grads.reduce(prog, rank, stage, last_bwd, self._optimizer, parts)

    def _optimizer(self, prog: list[Op], params: float, deps: tuple[int, ...]) -> None:
        self.compute_op(prog, "opt.adam", -1, -1, "opt", ("opt", params),
                        lambda: recipe.optimizer(params), deps=deps)

    def recv_op(self, src: int, key: tuple, mb: int, phase: str, layer: int) -> Op:
        return Op(stream="compute", kind="pp", name=f"{phase}.recv", recv_from=src, key=key,
                  microbatch=mb, phase=phase, layer=layer)

    def send_op(self, prog: list[Op], dst: int, key: tuple, mb: int, phase: str,
              layer: int) -> Op:
        nbytes = self.tokens * self.spec.hidden * ACT_BYTES / self.tp
        deps = (len(prog) - 1,) if prog else ()
        return Op(stream="pp", kind="pp", name=f"{phase}.send", send_to=dst, key=key,
                  nbytes=nbytes, microbatch=mb, phase=phase, layer=layer, deps=deps,
                  sms=self.nccl_sms)

    def collective_op(self, prog: list[Op], kind: str, name: str, spec: CollectiveSpec,
                      key: tuple, layer: int, mb: int, phase: str, nbytes: float,
                      stream: str = "compute", deps: tuple[int, ...] = (),
                      tokens: int = 0) -> None:
        """A collective op holding the SMs of its kind (EP kernels or NCCL)."""
        sms = self.ep_sms if kind in ("ep_dispatch", "ep_combine") else self.nccl_sms
        prog.append(Op(stream=stream, kind=kind, name=name, coll=spec, key=key, nbytes=nbytes,
                       layer=layer, microbatch=mb, phase=phase, deps=deps, tokens=tokens,
                       sms=sms))

    def collective_spec(self, key: tuple, make) -> CollectiveSpec:
        """The collective under ``key``, made once (``make``)."""
        if key not in self._specs:
            self._specs[key] = make()
        return self._specs[key]

    def layer_ops(self, prog: list[Op], rank: int, layer: int, mb: int, phase: str,
                  attn: tuple | None = None) -> None:
        """Layer ``layer``'s ops of ``phase`` (``fwd``/``bwd``), written by walking its
        template (:class:`moesim.program.layer_plan.LayerPlan`); ``attn``: a (key, kernel
        maker) in place of the attention step's (e.g. a serving step's). ZeRO-3's gathers
        come first; what waits for them is the layer's first op (and its recompute)."""
        deps: tuple[int, ...] = ()
        start = len(prog)
        for st in self.layer_plan.steps(layer, phase):
            k = st.kind
            if k == "zero3":
                deps = self.grads.zero3_gather(prog, rank, layer, mb, phase, self.layer_starts)
                start = len(prog)
            elif k == "tp":
                self.tp_allreduce_ops(prog, rank, layer, mb, phase, st.arg)
            elif k == "moe":
                self._moe_block(prog, rank, layer, mb, phase, st.block, deps)
                deps = ()
            elif k == "attn":
                self._attention(prog, rank, layer, mb, st, attn or self.kernels.op(st, layer),
                                deps)
                deps = ()
            else:               # one compute op: recompute (waits too), ffn, mtp
                op = self.kernels.op(st, layer)
                if op is not None:
                    self.compute_op(prog, st.name, layer, mb, phase, *op,
                                    deps=deps if k in ("recompute", "ffn") else ())
                if k == "ffn":
                    deps = ()
        self.layer_starts.append(start)

    def moe_ops(self, prog: list[Op], rank: int, layer: int, mb: int, phase: str,
                deps: tuple[int, ...] = ()) -> None:
        """A MoE block: router, dispatch, (ETP,) experts, combine, unpermute
        (:meth:`LayerPlan.moe`)."""
        self._moe_block(prog, rank, layer, mb, phase, self.layer_plan.moe(phase), deps)

    def _moe_block(self, prog: list[Op], rank: int, layer: int, mb: int, phase: str, steps,
                   deps: tuple[int, ...] = ()) -> None:
        """The MoE block's ``steps`` on ``rank``, routed as the token-routing stage says."""
        group = self.lay.group_of(rank, "ep")
        pos = group.index(rank)
        r = self.routes.route(group[0], group, layer, mb)
        sent = self.kernels.sent
        recv = int(r.rank_tokens[pos])
        gkey = (group[0], layer, mb)
        disp, comb = self.ep_transfers.exchange(group, r, layer, mb, phase)
        local, etp_g = self.folded.expert_tokens(rank, r, pos, layer, mb)
        experts = tuple(int(e) for e in np.flatnonzero(local))
        hot = int(np.argmax(local)) if experts else -1
        t_exp, f_exp = 0.0, 0.0
        exp_ks: list[Kernel] = []
        for i, e in enumerate(experts):      # grouped: later experts share the 1st's launches
            key, make = self.kernels.expert(int(local[e]), phase, self.grouped and i > 0)
            t, f = self.timer(key, make)
            t_exp += t
            f_exp += f
            exp_ks += self.timer.kernels_for(key)
        bwd = "b" if phase == "bwd" else ""
        for st in steps:
            k = st.kind
            if k == "a2a":
                dispatch = st.arg == "ep_dispatch"
                first = dispatch == (phase == "fwd")     # the pass's first all-to-all
                self.collective_op(prog, st.arg, st.name, disp if dispatch else comb,
                                   (bwd + ("disp" if dispatch else "comb"),) + gkey, layer,
                                   mb, phase, self.ep_transfers.sent_bytes(
                                       disp if dispatch else comb, pos),
                                   tokens=sent if first else recv)
                if st.beside >= 0:      # the shared experts beside it (shared_overlap)
                    side, (key, make) = self.kernels.shared(phase, st.beside)
                    self.compute_op(prog, side.name, layer, mb, phase, key, make)
            elif k == "etp":
                self._etp(prog, etp_g, local, layer, mb, phase, st.arg)
            elif k == "experts":
                self.flops += f_exp
                prog.append(Op(stream="compute", kind="compute", name=st.name,
                               duration_s=t_exp, kernels=tuple(exp_ks), flops=f_exp,
                               layer=layer, microbatch=mb, phase=phase, tokens=recv,
                               experts=experts,
                               expert_tokens=tuple(int(local[e]) for e in experts),
                               hot_expert=hot, hot_tokens=int(local[hot]) if hot >= 0 else 0))
            elif k == "recompute_experts":
                self._recompute_experts(prog, st.name, layer, mb, local, experts, recv)
            else:               # router, unpermute: the first waits for ``deps``
                self.compute_op(prog, st.name, layer, mb, phase, *self.kernels.op(st, layer),
                                deps=deps)
                deps = ()

    def _transfer(self, prog: list[Op], t: Transfer, layer: int, mb: int, phase: str,
                  deps: tuple[int, ...] = ()) -> None:
        self.collective_op(prog, t.kind, t.name, t.spec, t.key, layer, mb, phase, t.nbytes,
                           stream=t.stream, deps=deps)

    def tp_allreduce_ops(self, prog: list[Op], rank: int, layer: int, mb: int, phase: str,
                         which: str) -> None:
        """TP's all-reduce, or SP's reduce-scatter / all-gather (:class:`FoldedTransfers`)."""
        for t in self.folded.tp_reduce(rank, layer, mb, phase, which):
            self._transfer(prog, t, layer, mb, phase)

    def _attention(self, prog: list[Op], rank: int, layer: int, mb: int, st, op: tuple,
                   deps: tuple[int, ...] = ()) -> None:
        """Attention; with CP the ring's KV exchange on its own stream beside it, and
        the next op waiting for both (moesim.program.cp)."""
        phase = st.phase
        kv_t = self.folded.cp_kv(rank, layer, mb, phase) if st.cp else None
        if kv_t is None:
            self.compute_op(prog, st.name, layer, mb, phase, *op, deps=deps)
            return
        kv = len(prog)
        self._transfer(prog, kv_t, layer, mb, phase, deps=deps + ((kv - 1,) if kv else ()))
        self.compute_op(prog, st.name, layer, mb, phase, *op, deps=deps)
        prog.append(Op(stream="compute", kind="compute", name=f"{phase}.cp_wait",
                       layer=layer, microbatch=mb, phase=phase, deps=(kv,)))

    def _etp(self, prog: list[Op], group, gathered, layer: int, mb: int, phase: str,
             which: int) -> None:
        """ETP's all-gather (0, before the experts) or reduce-scatter (1, after)."""
        t = self.folded.etp_transfer(group, gathered, layer, mb, phase, which)
        if t is not None:
            self._transfer(prog, t, layer, mb, phase)

    def _recompute_experts(self, prog: list[Op], name: str, layer: int, mb: int, local,
                           experts, recv: int) -> None:
        """``bwd.recompute_experts`` (``name``) before the experts' backward
        (:class:`RecomputeStage`)."""
        priced = self.recompute.experts(layer, [int(local[e]) for e in experts], self.timer)
        if priced is not None:
            prog.append(Op(stream="compute", kind="compute", name=name,
                           duration_s=priced[0], flops=priced[1], layer=layer, microbatch=mb,
                           phase="bwd", tokens=recv))
