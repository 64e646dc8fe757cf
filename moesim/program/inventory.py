"""One layer's kernels on one rank, op by op and pass by pass (pure: no simpy).

What ``moesim kernels`` prints and ``moesim validate`` compares kernel class by kernel
class: the op lists :mod:`moesim.program.build` (and the fast engine) price, for one
micro-batch of ``micro_batch_size · seq_len / cp`` tokens per rank and balanced routing
(each of the rank's ``n_experts / ep`` experts receives ``tokens / tp · top_k · ep /
n_experts`` rows, the mean of any routing).

Passes: ``fwd``; ``dgrad`` (the input-gradient part ``B`` of the backward, after the
forward kernels ``memory.recompute`` re-runs: op ``bwd.recompute``); ``wgrad`` (its
weight-gradient part ``W``): :func:`moesim.model.costs.backward_part`.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.compute.base import Kernel
from moesim.program import recipe, recompute
from moesim.program.layer_plan import LayerKernels, LayerPlan

PASSES = ("fwd", "dgrad", "wgrad")


@dataclass(frozen=True)
class OpKernels:
    op: str                      # the program op that launches them (fwd.attn, bwd.experts, ...)
    kernels: tuple[Kernel, ...]


def balanced_rows(res) -> tuple[int, int]:
    """(local experts, rows per local expert) of one micro-batch under balanced routing;
    with an EPLB placement its slots, ``(E + redundant) / ep`` per rank."""
    spec, par = res.model, res.scenario.parallel
    if not spec.moe:
        return 0, 0
    sch = res.scenario.schedule
    tokens = sch.micro_batch_size * sch.seq_len // max(res.layout.cp, 1)
    ep_tokens = max(1, tokens // par.tp)
    # EPLB's redundant copies: (E + redundant) / ep slots per rank, each its share
    eplb = getattr(getattr(res, "routing", None), "placement", None)
    slots = spec.n_experts + (eplb.redundant if eplb is not None else 0)
    local = max(slots // max(par.ep, 1), 1)
    rows = ep_tokens * spec.top_k * par.ep // slots
    return local, int(rows)


def sequence_parallel(res) -> bool:
    """Whether the norms and residual adds run on the rank's sequence shard: sequence
    parallelism over a TP group (as :class:`moesim.program.build.Builder` reads it)."""
    par = res.scenario.parallel
    return bool(par.sequence_parallel) and par.tp > 1


def layer_ops(res, layer: int, pass_: str) -> list[OpKernels]:
    """The ops of ``layer`` in ``pass_`` with their kernels, in execution order: the
    compute steps of the layer's template (:class:`moesim.program.layer_plan.LayerPlan`,
    the order both engines run), each with the kernels :class:`LayerKernels` gives it;
    the routed experts with balanced rows."""
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
    spec, scn = res.model, res.scenario
    tp, sch = scn.parallel.tp, scn.schedule
    cp, etp = max(res.layout.cp, 1), max(res.layout.etp, 1)
    tokens = sch.micro_batch_size * sch.seq_len // cp
    phase = "fwd" if pass_ == "fwd" else "bwd"
    part = {"dgrad": "B", "wgrad": "W"}.get(pass_)
    ep_tokens = max(1, tokens // tp)
    lk = LayerKernels(spec, tokens, sch.seq_len, tp, ep_tokens, ep_tokens * spec.top_k,
                      etp=etp, sp=sequence_parallel(res))

    def pick(ks: list[Kernel]) -> tuple[Kernel, ...]:
        return tuple(ks if part is None else recipe.backward_part(ks, part))

    out = []
    for st in _compute_steps(LayerPlan(spec).steps(layer, phase)):
        if st.kind == "recompute":
            if pass_ == "dgrad":     # the forward kernels recomputation re-runs first
                out.append(OpKernels(st.name, tuple(_recomputed(res, layer, tokens))))
        elif st.kind == "experts":
            local, rows = balanced_rows(res)
            out.append(OpKernels(st.name, pick(
                [k for _ in range(local) for k in recipe.expert(spec, rows * etp, etp,
                                                                phase)])))
        else:
            out.append(OpKernels(st.name, pick(lk.op(st, layer)[1]())))
    return [o for o in out if o.kernels]


#: the template's steps that run kernels of the layer's own (the rest move bytes, or
#: re-run the forward as ``bwd.recompute`` does; ``bwd.recompute_experts`` is counted
#: in ``bwd.recompute``)
_COMPUTE = ("recompute", "attn", "ffn", "mtp", "router", "experts", "post")


def _compute_steps(steps) -> list:
    """The compute steps of a layer's template, the MoE block's included, in order."""
    out = []
    for st in steps:
        if st.kind == "moe":
            out += _compute_steps(st.block)
        elif st.kind in _COMPUTE:
            out.append(st)
    return out


def _recomputed(res, layer: int, tokens: int) -> list[Kernel]:
    """The forward kernels ``memory.recompute`` re-runs in the layer's backward (the first
    layer of a stage chunk: :mod:`moesim.program.recompute`), routed experts included when
    their whole forward is re-run (``moe``, full)."""
    spec, scn = res.model, res.scenario
    mem, tp = scn.memory, scn.parallel.tp
    mods = recompute.recomputes(mem.recompute, mem.recompute_modules, mem.recompute_method,
                                mem.recompute_num_layers, 0)
    if not mods:
        return []
    ep_tokens = max(1, tokens // tp)
    ks = recipe.recompute_layer(
        spec, layer, mods, tokens=tokens, seq_len=scn.schedule.seq_len, tp=tp,
        ep_tokens=ep_tokens, sent=ep_tokens * spec.top_k, sp=sequence_parallel(res))
    if spec.is_moe_layer(layer) and ("full" in mods or "moe" in mods):
        local, rows = balanced_rows(res)
        etp = max(res.layout.etp, 1)
        ks += [k for _ in range(local)
               for k in recipe.expert(spec, rows * etp, etp, "fwd")]
    return ks


def price(model, kernel: Kernel) -> tuple[float, str, str]:
    """(seconds, source, detail) of a kernel: the compute model's provenance when it has
    one (a kernel catalog: ``moesim.compute.catalog.price``), else its name."""
    try:
        from moesim.compute.catalog import price as catalog_price
    except ImportError:
        catalog_price = None
    if catalog_price is not None:
        p = catalog_price(model, kernel)
        return p.time_s, p.source, p.detail
    return model.time_s(kernel), getattr(model, "name", type(model).__name__), ""


def step_pricing(res) -> dict:
    """What priced the step's kernels: every layer's kernels in every pass for one
    micro-batch (balanced routing), each layer kind weighted by how many layers (MTP
    layers included) the model has; the embedding, heads and optimizer are left out. ``roofline_kernels`` / ``roofline_fraction``: the kernels (and their share of
    that compute time) the roofline priced, a kernel catalog covering the rest."""
    spec = res.model
    kinds: dict[bool, tuple[int, int]] = {}
    for i in range(getattr(spec, "blocks", spec.layers)):   # MTP layers included
        moe = spec.is_moe_layer(i)
        first, n = kinds.get(moe, (i, 0))
        kinds[moe] = (first, n + 1)
    n_all = n_roof = 0
    t_all = t_roof = 0.0
    for first, n in kinds.values():
        for p in PASSES:
            for o in layer_ops(res, first, p):
                for k in o.kernels:
                    t, src, _ = price(res.compute, k)
                    roof = src.startswith("roofline")
                    n_all += n
                    t_all += n * t
                    n_roof += n * roof
                    t_roof += n * t * roof
    return {"kernels": n_all, "roofline_kernels": n_roof,
            "roofline_fraction": t_roof / t_all if t_all > 0 else 0.0,
            "compute_model": getattr(res.compute, "name", type(res.compute).__name__),
            "counted": "every layer's kernels in fwd, dgrad and wgrad for one micro-batch, "
                       "balanced routing"}
