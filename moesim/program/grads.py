"""The step's gradient stage: data-parallel gradient buckets and ZeRO's weight
collectives of a rank's program (pure).

Data-parallel gradient buckets (all-reduce, or reduce-scatter under ZeRO >= 1) cut in
the order the layers' backward ends and overlapped with backward when
``overlap.dp_overlap``; dense gradients reduce over DP x CP, expert gradients over
every replica of the expert shards (EDP);
the optimizer over the rank's (ZeRO-sharded) parameters; ZeRO-1/2 parameter
all-gathers after it; ZeRO-3 weight all-gathers before each layer's use, at most
``schedule.zero3_prefetch`` layers ahead.

:class:`GradientStage` takes its inputs explicitly (the layout, the model, and the
scenario's parallel / overlap / ZeRO settings, :meth:`GradientStage.of`) and appends
its comm-stream ops to a rank's program; the optimizer's compute op is the caller's
(``optimizer``: it prices kernels), placed between the buckets and the gathers.

Replicated experts (``routing.placement`` with redundant experts, ``routing.replicate``;
:mod:`moesim.program.replica_grads`): each bucket's replica all-reduces run just before
its data-parallel reduces, its EDP reduce and the optimizer carry the replicas' bytes.
Buckets are cut on the bytes without replicas, so every rank cuts them alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from moesim.collectives.communicator import CollectiveSpec
from moesim.memory.model import rank_params
from moesim.program.layer_plan import zero3_gathers
from moesim.program.ops import Op
from moesim.program.replica_grads import TAG, ReplicaGrads

#: ``optimizer(prog, params, deps)``: append the optimizer's op over ``params`` parameters
#: (this rank's shard), waiting for ``deps``
Optimizer = Callable[[list, float, tuple], None]


@dataclass
class GradientStage:
    """Gradient buckets, optimizer placement and ZeRO gathers of every rank."""

    lay: object                  # moesim.layout Layout: groups dp_cp, edp of a rank
    spec: object                 # moesim.model ModelSpec
    tp: int
    ep: int
    pp: int
    zero: int                    # parallel.zero (0..3)
    bucket_bytes: float          # schedule.dp_bucket_bytes
    overlap: bool                # overlap.dp_overlap: a bucket starts once its layers end
    prefetch: int                # schedule.zero3_prefetch
    sms: int = 0                 # overlap.nccl_sms held by each collective
    replicas: ReplicaGrads | None = None   # replicated experts' gradients (None: none)
    _specs: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, scn, lay, spec, routes=None) -> GradientStage:
        """The stage of scenario ``scn`` on layout ``lay`` for model ``spec`` (``routes``:
        the step's token routing, whose placement may replicate experts)."""
        par, sch = scn.parallel, scn.schedule
        return cls(lay, spec, par.tp, par.ep, par.pp, par.zero, sch.dp_bucket_bytes,
                   scn.overlap.dp_overlap, sch.zero3_prefetch, scn.overlap.nccl_sms,
                   ReplicaGrads.of(scn, lay, spec, routes))

    @property
    def zero3(self) -> bool:
        """ZeRO-3 weight gathers before each layer (a data-parallel group to gather over)."""
        return zero3_gathers(self.zero, self.lay)

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the same expert shards as ``rank``: its expert-data-parallel group
        of the folded layout (size tp·cp·dp/(etp·ep); with etp = 1 and tp > 1 it takes in
        the TP peers, each holding whole experts), as the memory model counts replicas."""
        return self.lay.group_of(rank, "edp")

    def layer_bytes(self, layer: int) -> tuple[float, float]:
        """(dense, expert) weight bytes of ``layer`` held by one rank."""
        dense, expert = rank_params(self.spec, [layer], tp=self.tp, ep=self.ep, first=False,
                                    last=False, etp=self.lay.etp)
        wb = self.spec.weight_bytes
        return dense * wb, expert * wb

    def _coll(self, prog: list[Op], kind: str, name: str, spec: CollectiveSpec, key: tuple,
              layer: int, mb: int, phase: str, nbytes: float, deps: tuple[int, ...]) -> None:
        prog.append(Op(stream="comm", kind=kind, name=name, coll=spec, key=key, nbytes=nbytes,
                       layer=layer, microbatch=mb, phase=phase, deps=deps, sms=self.sms))

    def _cached(self, key: tuple, make) -> CollectiveSpec:
        if key not in self._specs:
            self._specs[key] = make()
        return self._specs[key]

    def zero3_gather(self, prog: list[Op], rank: int, layer: int, mb: int, phase: str,
                     layer_starts: list[int]) -> tuple[int, ...]:
        """ZeRO-3's all-gathers of ``layer``'s weights (dense over DP x CP, experts over
        EDP) on the comm stream, at most ``prefetch`` layers ahead of the layer computing
        (``layer_starts``: where the rank's earlier layers began). Returns their indices."""
        dense_b, expert_b = self.layer_bytes(layer)
        g = self.lay.group_of(rank, "dp_cp")
        spec = self._cached(("z3", layer, g), lambda: CollectiveSpec("all_gather", g, dense_b))
        ahead = self.prefetch
        gdeps = (layer_starts[-ahead],) if len(layer_starts) >= ahead else ()
        idx = [len(prog)]
        self._coll(prog, "zero", f"{phase}.zero3_gather", spec, ("z3", layer, mb, phase, g[0]),
                   layer, mb, phase, dense_b, gdeps)
        eg = self.expert_dp_group(rank)
        if len(eg) > 1 and expert_b > 0:
            espec = self._cached(("z3e", layer, eg),
                                 lambda: CollectiveSpec("all_gather", eg, expert_b))
            idx.append(len(prog))
            self._coll(prog, "zero", f"{phase}.zero3_gather_experts", espec,
                       ("z3e", layer, mb, phase, eg[0]), layer, mb, phase, expert_b, gdeps)
        return tuple(idx)

    def parts(self, rank: int, stage: int, last_bwd: dict[int, int]) -> list[tuple]:
        """The one part of a rank holding one stage (see :meth:`reduce`)."""
        # dense gradients reduce over DP x CP (Megatron-Core DATA_PARALLEL_GROUP_WITH_CP)
        return [(sorted(last_bwd, key=last_bwd.get), stage == 0, stage == self.pp - 1,
                 self.lay.group_of(rank, "dp_cp"), self.expert_dp_group(rank), "")]

    def reduce(self, prog: list[Op], rank: int, stage: int, last_bwd: dict[int, int],
               optimizer: Optimizer, parts: list[tuple] | None = None) -> None:
        """Gradient buckets, optimizer and ZeRO-1/2 gathers of ``rank`` after its backward
        (``last_bwd``: layer -> index of its last backward op). ``parts`` (default: the
        rank's one stage, :meth:`parts`): per model chunk it holds, ``(layers in bucket
        order, first, last, dense group, expert group, tag)``; a chunk held by two ranks
        (DualPipe's two copies) reduces over both copies' groups."""
        if parts is None:
            parts = self.parts(rank, stage, last_bwd)
        wb = self.spec.weight_bytes
        end_bwd = max(last_bwd.values()) if last_bwd else len(prog) - 1
        grad_op = "all_reduce" if self.zero == 0 else "reduce_scatter"
        reduce_ops: list[int] = []
        shard_d = shard_e = 0.0
        gathers = []
        for order, first, last, dg, eg, ptag in parts:
            extra_dense, _ = rank_params(self.spec, [], tp=self.tp, ep=self.ep, first=first,
                                         last=last)
            total_dense = total_expert = 0.0
            acc_d = acc_e = acc_r = 0.0
            n_bucket = 0
            held: list[int] = []          # the bucket's layers
            rep = self.replicas
            for j, layer in enumerate(order):
                d, e = self.layer_bytes(layer)
                acc_d += d
                acc_e += e
                total_dense += d
                total_expert += e
                held.append(layer)
                if rep is not None:       # the rank's replicas: bytes beyond the cut
                    r_b = rep.extra_experts(rank, layer) * rep.expert_bytes
                    acc_r += r_b
                    total_expert += r_b
                final = j == len(order) - 1
                if final:
                    acc_d += extra_dense * wb
                    total_dense += extra_dense * wb
                if acc_d + acc_e < self.bucket_bytes and not final:
                    continue
                dep = (last_bwd[layer] if self.overlap else end_bwd,)
                if rep is not None:
                    for lyr in held:
                        for grp, nbytes in rep.syncs(rank, lyr):
                            spec = CollectiveSpec("all_reduce", grp, nbytes)
                            reduce_ops.append(len(prog))
                            key = ("dp", TAG, lyr, grp) + ((ptag,) if ptag else ())
                            self._coll(prog, "dp", f"dp.{ptag}bucket{n_bucket}.{TAG}", spec,
                                       key, layer, -1, "bwd", nbytes, dep)
                acc_e += acc_r
                held, acc_r = [], 0.0
                for grp, nbytes, tag in ((dg, acc_d, "dense"), (eg, acc_e, "experts")):
                    if len(grp) > 1 and nbytes > 0:
                        spec = CollectiveSpec(grad_op, grp, nbytes)
                        reduce_ops.append(len(prog))
                        key = ("dp", tag, n_bucket, grp[0]) + ((ptag,) if ptag else ())
                        self._coll(prog, "dp", f"dp.{ptag}bucket{n_bucket}.{tag}", spec, key,
                                   layer, -1, "bwd", nbytes, dep)
                n_bucket += 1
                acc_d = acc_e = 0.0
            # optimizer over this rank's shard of master weights (ZeRO>=1 shards them)
            shard_d += total_dense / wb / (len(dg) if self.zero >= 1 else 1)
            shard_e += total_expert / wb / (len(eg) if self.zero >= 1 else 1)
            gathers += [(dg, total_dense, "dense", ptag), (eg, total_expert, "experts", ptag)]
        deps = tuple(reduce_ops) or ((end_bwd,) if end_bwd >= 0 else ())
        opt_idx = len(prog)
        optimizer(prog, shard_d + shard_e, deps)
        if self.zero in (1, 2):
            for grp, nbytes, tag, ptag in gathers:
                if len(grp) > 1 and nbytes > 0:
                    spec = CollectiveSpec("all_gather", grp, nbytes)
                    key = ("zgather", tag, grp[0]) + ((ptag,) if ptag else ())
                    self._coll(prog, "zero", f"opt.{ptag}param_gather.{tag}", spec, key, -1,
                               -1, "opt", nbytes, (opt_idx,))
