"""Gradient and weight collectives of a rank's program (pure; mixed into the builder).

Data-parallel gradient buckets (all-reduce, or reduce-scatter under ZeRO >= 1) cut in
the order the layers' backward ends and overlapped with backward when
``overlap.dp_overlap``; dense gradients reduce over DP x CP, expert gradients over
every replica of the expert shards (EDP);
the optimizer over the rank's (ZeRO-sharded) parameters; ZeRO-1/2 parameter
all-gathers after it; ZeRO-3 weight all-gathers before each layer's use, at most
``schedule.zero3_prefetch`` layers ahead.
"""

from __future__ import annotations

from moesim.collectives.communicator import CollectiveSpec
from moesim.memory.model import rank_params
from moesim.program import recipe
from moesim.program.ops import Op


class GradientOps:
    """Mixin for :class:`moesim.program.build.Builder` (uses its layout, spec, scenario
    and op helpers)."""

    # ---------------------------------------------------------------- ZeRO / DP
    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks holding the same expert shards as ``rank``: its expert-data-parallel group
        of the folded layout (size tp·cp·dp/(etp·ep); with etp = 1 and tp > 1 it takes in
        the TP peers, each holding whole experts), as the memory model counts replicas."""
        return self.lay.group_of(rank, "edp")

    def _layer_param_bytes(self, layer: int) -> tuple[float, float]:
        dense, expert = rank_params(self.spec, [layer], tp=self.tp, ep=self.ep, first=False,
                                    last=False, etp=self.lay.etp)
        wb = self.spec.weight_bytes
        return dense * wb, expert * wb

    def _zero3_gather(self, prog: list[Op], rank: int, layer: int, mb: int,
                      phase: str) -> tuple[int, ...]:
        dense_b, expert_b = self._layer_param_bytes(layer)
        g = self.lay.group_of(rank, "dp_cp")
        spec = self._spec(("z3", layer, g), lambda: CollectiveSpec("all_gather", g, dense_b))
        # gather at most `zero3_prefetch` layers ahead of the layer computing
        ahead = self.scn.schedule.zero3_prefetch
        starts = self._layer_starts
        gdeps = (starts[-ahead],) if len(starts) >= ahead else ()
        idx = [len(prog)]
        self._coll(prog, "zero", f"{phase}.zero3_gather", spec, ("z3", layer, mb, phase, g[0]),
                   layer, mb, phase, dense_b, stream="comm", deps=gdeps)
        eg = self.expert_dp_group(rank)
        if len(eg) > 1 and expert_b > 0:
            espec = self._spec(("z3e", layer, eg),
                               lambda: CollectiveSpec("all_gather", eg, expert_b))
            idx.append(len(prog))
            self._coll(prog, "zero", f"{phase}.zero3_gather_experts", espec,
                       ("z3e", layer, mb, phase, eg[0]), layer, mb, phase, expert_b,
                       stream="comm", deps=gdeps)
        return tuple(idx)

    def _gradients(self, prog: list[Op], rank: int, stage: int, last_bwd: dict[int, int],
                   parts: list[tuple] | None = None) -> None:
        """Gradient buckets, optimizer and ZeRO-1/2 gathers of ``rank``. ``parts``
        (default: the rank's one stage): per model chunk it holds, ``(layers in bucket
        order, first, last, dense group, expert group, tag)``; a chunk held by two ranks
        (DualPipe's two copies) reduces over both copies' groups."""
        lay = self.lay
        if parts is None:
            # dense gradients reduce over DP x CP (Megatron-Core DATA_PARALLEL_GROUP_WITH_CP)
            dp_g, edp_g = lay.group_of(rank, "dp_cp"), self.expert_dp_group(rank)
            parts = [(sorted(last_bwd, key=last_bwd.get), stage == 0, stage == self.pp - 1,
                      dp_g, edp_g, "")]
        wb = self.spec.weight_bytes
        bucket = self.scn.schedule.dp_bucket_bytes
        overlap = self.scn.overlap.dp_overlap
        end_bwd = max(last_bwd.values()) if last_bwd else len(prog) - 1
        grad_op = "all_reduce" if self.zero == 0 else "reduce_scatter"
        reduce_ops: list[int] = []
        shard_d = shard_e = 0.0
        gathers = []
        for order, first, last, dg, eg, ptag in parts:
            extra_dense, _ = rank_params(self.spec, [], tp=self.tp, ep=self.ep, first=first,
                                         last=last)
            total_dense = total_expert = 0.0
            acc_d = acc_e = 0.0
            n_bucket = 0
            for j, layer in enumerate(order):
                d, e = self._layer_param_bytes(layer)
                acc_d += d
                acc_e += e
                total_dense += d
                total_expert += e
                final = j == len(order) - 1
                if final:
                    acc_d += extra_dense * wb
                    total_dense += extra_dense * wb
                if acc_d + acc_e < bucket and not final:
                    continue
                dep = (last_bwd[layer] if overlap else end_bwd,)
                for grp, nbytes, tag in ((dg, acc_d, "dense"), (eg, acc_e, "experts")):
                    if len(grp) > 1 and nbytes > 0:
                        spec = CollectiveSpec(grad_op, grp, nbytes)
                        reduce_ops.append(len(prog))
                        key = ("dp", tag, n_bucket, grp[0]) + ((ptag,) if ptag else ())
                        self._coll(prog, "dp", f"dp.{ptag}bucket{n_bucket}.{tag}", spec, key,
                                   layer, -1, "bwd", nbytes, stream="comm", deps=dep)
                n_bucket += 1
                acc_d = acc_e = 0.0
            # optimizer over this rank's shard of master weights (ZeRO>=1 shards them)
            shard_d += total_dense / wb / (len(dg) if self.zero >= 1 else 1)
            shard_e += total_expert / wb / (len(eg) if self.zero >= 1 else 1)
            gathers += [(dg, total_dense, "dense", ptag), (eg, total_expert, "experts", ptag)]
        deps = tuple(reduce_ops) or ((end_bwd,) if end_bwd >= 0 else ())
        opt_idx = len(prog)
        self._compute(prog, "opt.adam", -1, -1, "opt", ("opt", shard_d + shard_e),
                      lambda: recipe.optimizer(shard_d + shard_e), deps=deps)
        if self.zero in (1, 2):
            for grp, nbytes, tag, ptag in gathers:
                if len(grp) > 1 and nbytes > 0:
                    spec = CollectiveSpec("all_gather", grp, nbytes)
                    key = ("zgather", tag, grp[0]) + ((ptag,) if ptag else ())
                    self._coll(prog, "zero", f"opt.{ptag}param_gather.{tag}", spec, key, -1,
                               -1, "opt", nbytes, stream="comm", deps=(opt_idx,))
