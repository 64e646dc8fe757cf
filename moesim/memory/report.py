"""Memory of each pipeline stage and rank of a resolved scenario (pure).

Shared by ``moesim memory`` (one row per stage, balanced routing) and the step
summary (one row per rank, with the tokens each rank's experts actually received,
so the rank of a hot expert shows its larger token buffers). Activations alive come
from the schedule (:func:`moesim.schedule.pipeline.make_order`): at a stage's peak,
chunk ``c`` holds ``alive[c]`` micro-batches' activations of its own layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from moesim.errors import InputError
from moesim.gating.eplb_placement import experts_held
from moesim.memory.checkpoint import checkpoint_spec
from moesim.memory.model import memory_per_rank
from moesim.schedule.a2a_overlap import a2a_1f1b_order, flatten
from moesim.schedule.dualpipe import KINDS as DUAL_KINDS
from moesim.schedule.dualpipe import make_dual_order, peak_alive
from moesim.schedule.layout_string import stage_chunks
from moesim.schedule.pipeline import make_order

# bytes per element of the dispatched tokens: bf16 2; fp8 1 plus one fp32 scale per 128
# values (DeepSeek-V3 report §3.3: 7168 + 224 bytes per token for hidden 7168)
DISPATCH_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0 + 4.0 / 128}
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "token_buffers",
              "recompute_workspace")


class StageMemory:
    """Memory rows of a resolved scenario; ``rank_row`` caches identical ranks."""

    def __init__(self, res) -> None:
        scn, lay = res.scenario, res.layout
        if res.model is None or res.device is None:
            raise InputError(scn.source, "model", "a model and device the memory model can "
                             "read (moesim.model and moesim.compute.devices)", None)
        self.res = res
        self.spec = checkpoint_spec(res.model, scn.compute)   # compute.weights / sparsity
        sch, par = scn.schedule, scn.parallel
        self.v = v = par.vpp if sch.kind == "interleaved" else 1
        # DualPipe(V): row s is pipeline rank s, holding two stages of the model
        self.dual = (make_dual_order(sch.kind, par.pp, sch.microbatches)
                     if sch.kind in DUAL_KINDS else None)
        if self.dual is not None:
            self.order = None
        elif scn.overlap.kind == "a2a-1f1b":   # one more warm-up forward (Megatron-Core)
            self.order = flatten(a2a_1f1b_order(par.pp, sch.microbatches, v))
        else:
            self.order = make_order(sch.kind, par.pp, sch.microbatches, v)
        self.common = dict(
            micro_batch_tokens=sch.tokens_per_microbatch, seq_len=sch.seq_len, tp=par.tp,
            pp=par.pp, ep=par.ep, dp=lay.dp, zero=par.zero, recompute=scn.memory.recompute,
            attention_kernel=scn.memory.attention, grad_dtype=scn.memory.grad_dtype,
            param_dtype=None if scn.memory.param_dtype == "bf16" else scn.memory.param_dtype,
            recompute_modules=scn.memory.recompute_modules,
            recompute_method=scn.memory.recompute_method,
            recompute_num_layers=scn.memory.recompute_num_layers,
            activation_dtype=scn.memory.activation_dtype,
            cp=par.cp, etp=par.etp, sequence_parallel=bool(par.sequence_parallel),
            device=res.device, source=scn.source,
            dispatch_bytes_per_elem=DISPATCH_BYTES[scn.routing.dispatch_dtype])
        rt = res.routing      # replicas' weights, gradients and optimizer states too
        if res.model.moe and (rt.placement is not None or rt.replicate):
            self.common["experts_per_rank"] = experts_held(
                rt, n_experts=res.model.n_experts, ep=par.ep, source=scn.source)
        self.chunks = stage_chunks(scn, res.model, par.pp * v if self.dual is None
                                   else self.dual.stages,  # virtual stage c*p + s
                                   dual=self.dual is not None)
        self._cache: dict[tuple, dict] = {}
        self._per_s: dict[tuple, object] = {}   # held stages and peaks per pipeline rank

    def held_stages(self, s: int) -> list[int]:
        """DualPipe(V): the model stages pipeline rank ``s`` holds (two)."""
        hit = self._per_s.get(("held", s))
        if hit is None:
            hit = self._per_s[("held", s)] = tuple(sorted(
                {st for it in self.dual.items[s] for _, _, st in it.parts()}))
        return list(hit)

    def stage_layers(self, s: int) -> list[int]:
        if self.dual is not None:
            return [i for st in self.held_stages(s) for i in self.chunks[st]]
        p = self.res.scenario.parallel.pp
        return [i for c in range(self.v) for i in self.chunks[c * p + s]]

    def peak_alive(self, s: int) -> tuple[int, list[int]]:
        """(activation sets alive at the stage's peak, per chunk at that moment)."""
        alive = [0] * self.v
        best, best_alive, total = -1, alive[:], 0
        for o in self.order[s]:
            alive[o.chunk] += 1 if o.kind == "F" else -1
            total += 1 if o.kind == "F" else -1
            if total > best:
                best, best_alive = total, alive[:]
        return best, best_alive

    def row(self, s: int, received: Sequence[int] | None = None) -> dict:
        """Bytes of one rank of stage ``s``; ``received``: tokens its experts receive per
        MoE layer of the stage (None: balanced routing)."""
        key = (s, None if received is None else tuple(received))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if self.dual is not None:
            d = self._dual_row(s, received)
            self._cache[key] = d
            return d
        p = self.res.scenario.parallel.pp
        spec = self.spec
        best, best_alive = self.peak_alive(s)
        layers = self.stage_layers(s)
        recv = list(received) if received else None
        mem = memory_per_rank(spec, stage=s, layers=layers, inflight_microbatches=1,
                              received_tokens=recv, **self.common)
        acts = 0.0
        for c in range(self.v):
            if best_alive[c] > 0:
                # the embedding's output and the loss's logits in their own chunks only
                ends = (c == 0 and s == 0, c == self.v - 1 and s == p - 1)
                acts += memory_per_rank(spec, stage=s, layers=list(self.chunks[c * p + s]),
                                        inflight_microbatches=best_alive[c],
                                        chunk_ends=ends, **self.common).activations
        d = mem.as_dict()
        d["activations"] = acts
        d["peak_bytes"] = sum(d[k] for k in CATEGORIES)
        d["oom"] = d["peak_bytes"] > d["capacity_bytes"]
        d["inflight"] = best
        d["layers"] = len(layers)
        self._cache[key] = d
        return d

    def _dual_row(self, s: int, received: Sequence[int] | None) -> dict:
        """Pipeline rank ``s`` of DualPipe(V): both held stages' weights, gradients and
        optimizer states (DualPipe: every stage on two ranks, 2x parameters), each
        stage's activation sets alive at the rank's peak of the order
        (:func:`moesim.schedule.dualpipe.peak_alive`: PP+1 for DualPipe), the larger
        stage's token buffers and workspace."""
        spec, d = self.spec, self.dual
        hit = self._per_s.get(("peak", s))
        if hit is None:     # the same for every rank of pipeline rank s
            hit = self._per_s[("peak", s)] = peak_alive(d, s)
        best, at_peak = hit[0], dict(hit[1])
        recv = list(received) if received else None
        common = dict(self.common, pp=d.stages)
        out: dict = {}
        for st in self.held_stages(s):
            layers = list(self.chunks[st])
            mine = None
            if recv is not None:
                n = sum(1 for i in layers if spec.is_moe_layer(i))
                mine, recv = recv[:n], recv[n:]
            # ZeRO shards a stage over every copy's data-parallel group
            copies = len({d.rank_of[k][st] for k in range(len(d.rank_of))})
            mem = memory_per_rank(spec, stage=st, layers=layers, received_tokens=mine or None,
                                  inflight_microbatches=max(at_peak.get(st, 0), 1),
                                  **dict(common, dp=common["dp"] * copies))
            m = mem.as_dict()
            if not at_peak.get(st, 0):
                m["activations"] = 0.0
            for k, v in m.items():
                if k in ("token_buffers", "recompute_workspace"):
                    out[k] = max(out.get(k, 0.0), v)
                elif k in ("weights", "gradients", "optimizer", "activations", "dense_params",
                           "expert_params"):
                    out[k] = out.get(k, 0.0) + v
                else:
                    out.setdefault(k, v)
        out["peak_bytes"] = sum(out[k] for k in CATEGORIES)
        out["oom"] = out["peak_bytes"] > out["capacity_bytes"]
        out["inflight"] = best
        out["layers"] = len(self.stage_layers(s))
        return out


def memory_table(res) -> dict:
    """Per-stage memory of one rank (bytes, balanced routing), plus the layout."""
    sm = StageMemory(res)
    scn, lay = res.scenario, res.layout
    sch, par = scn.schedule, scn.parallel
    rows = []
    for s in range(par.pp):
        ranks = [g[s] for g in lay.pp_groups]
        rows.append({"stage": s, "ranks": len(ranks), "first_rank": min(ranks), **sm.row(s)})
    return {"scenario": scn.name, "source": scn.source, "device": res.device.name,
            "layout": lay.describe(), "schedule": sch.kind, "microbatches": sch.microbatches,
            "vpp": sm.v, "recompute": scn.memory.recompute, "zero": par.zero,
            "warnings": list(res.warnings), "stages": rows}
