"""The fast engine's TP communication beside the GEMMs (``overlap.tp_comm``): the closed
forms of :mod:`moesim.program.tp_overlap` for the pieces the exact engine runs.

A sequence-parallel exchange of the layer (``{phase}.tp_attn``, ``{phase}.tp_mlp``: one
reduce-scatter and one all-gather on a dense layer, one of them on an MoE layer) is
priced collective by collective: a reduce-scatter beside the last GEMM of the compute op
before it, an all-gather beside the first GEMM of the op after it, as the exact
program's neighbours are (the same ops, in the same order); an exchange with no such
neighbour is exposed whole. The slowed GEMM's extra time (TE's SM margin) is compute.
"""

from __future__ import annotations

from moesim.program import tp_overlap as tpo
from moesim.program.folding import sp_exchange


def _next_in_chunk(c, layer: int) -> bool:
    """Whether the layer after ``layer`` in its chunk is ``layer + 1``."""
    chunk = next((ch for ch in c.chunks if layer in ch), ())
    i = list(chunk).index(layer) if layer in chunk else -1
    return 0 <= i < len(chunk) - 1 and chunk[i + 1] == layer + 1


def _partner(chain, layer: int, phase: str, which: str, op: str):
    """(key, maker) of the compute op the collective sits beside, or None."""
    c = chain.c
    moe = c.spec.is_moe_layer(layer)
    if op == "reduce_scatter":                    # the op just before
        if which == "attn":
            return chain.attn_op(layer, phase) if phase == "fwd" else (
                None if moe else chain.ffn_op(phase))
        if phase == "fwd":
            return None if moe else chain.ffn_op(phase)
        # backward, before this layer's FFN/MoE: the next layer's attention backward
        ok = (layer < c.spec.layers and not c.rc.mods(layer) and _next_in_chunk(c, layer))
        return chain.attn_op(layer + 1, phase) if ok else None
    if which == "attn":                           # all-gather: the op just after
        return chain.ffn_op(phase) if phase == "fwd" else chain.attn_op(layer, phase)
    if phase == "fwd":
        ok = layer < c.spec.layers and _next_in_chunk(c, layer)
        return chain.attn_op(layer + 1, phase) if ok else None
    return None if moe else chain.ffn_op(phase)


def charge(chain, s: int, name: str, layer: int, mb: int, phase: str) -> bool:
    """Charge the exchange ``name`` of ``layer`` on stage ``s``; False: not handled
    (recorded pairs, a forward-only chain), the caller charges it as before."""
    c = chain.c
    if chain.rec is not None or getattr(chain, "sb", None) is not None or not c.sp:
        return False
    which = "attn" if name.endswith("tp_attn") else "mlp"
    group = tuple(c.res.layout.group_of(chain.groups[s][0], "tp"))
    sms = int(getattr(c.res.device, "sms", 0) or 0)
    c.tp_bytes(chain.groups[s])
    # the exchange's collectives in program order (moesim.program.folding)
    for op, nbytes in sp_exchange(c.spec, c.tokens, layer, phase, which, True):
        whole = c.rings.time(op, group, nbytes)
        part = _partner(chain, layer, phase, which, op)
        kernels = () if part is None else _kernels(c, *part)
        gi = tpo.gemm_at(kernels, op == "reduce_scatter") if kernels else -1
        extra, exposed = 0.0, whole
        if gi >= 0:
            g = c.timer.model.time_s(kernels[gi])
            how = tpo.method(op, phase)
            if how == "ring_exchange":
                step = c.rings.time("all_gather", group, nbytes / (c.tp - 1))
                exposed = tpo.ring_s(g, step, c.tp)
            else:
                g2 = tpo.slowed(g, sms)
                extra = g2 - g
                exposed = (tpo.pipeline_s(g2, c.rings.time(op, group, nbytes / tpo.
                                                           PIPELINE_SPLITS))
                           if how == "pipeline" else tpo.bulk_s(g2, whole))
        if extra > 0:
            a = chain.t[s]
            chain.out[s].acc["compute"] += extra
            chain._span(s, "compute", f"{phase}.tp_gemm_margin", a, a + extra, layer, mb,
                        phase)
            chain.t[s] = a + extra
        if exposed > 0:
            chain._charge_tp(s, exposed, f"{phase}.sp_{which}_{op}", layer, mb, phase)
    return True


def _kernels(c, key: tuple, make) -> tuple:
    c.timer(key, make)
    return c.timer.kernels_for(key)
