"""Tensor-parallel communication overlapped with the GEMMs beside it (pure; docs/model.md,
"TP communication beside the GEMMs").

Transformer Engine's userbuffers (Megatron ``--tp-comm-overlap``, which needs sequence
parallelism): NVIDIA/TransformerEngine d0067d0, transformer_engine/pytorch/module/base.py
``initialize_ub`` gives every TP GEMM a method and a default configuration:

- ``ring_exchange`` for the all-gathers before ``qkv_fprop``, ``fc1_fprop`` and the
  backward's ``proj_dgrad``, ``fc2_dgrad``: ``num_splits`` = tp chunks; the GEMM on the
  local chunk runs while the next chunk arrives peer to peer on the copy engine
  (``use_ce``, ``num_sm`` 1, no SM margin): tp GEMM chunks of G/tp, tp − 1 steps of c
  (one ring step) back to back, so the pair takes G + (tp − 1)·max(0, c − G/tp);
- ``pipeline`` for the reduce-scatters after ``proj_fprop``, ``fc2_fprop``: the GEMM in
  ``num_splits`` = 4 chunks, chunk k's reduce-scatter (C/4) on the communication stream
  under chunk k + 1's GEMM: the pair takes G' + C/n + (n − 1)·max(0, C/n − G'/n);
- ``bulk`` for the backward's ``qkv_dgrad``/``fc1_dgrad`` reduce-scatter beside the
  ``*_wgrad`` GEMM: max(G', C).

``pipeline`` and ``bulk`` give the communication kernels 16 SMs with ``set_sm_margin``:
the GEMM is launched on ``sm_count − 16`` SMs for its whole length
(transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp ``_math_sms``), so
G' = G·S/(S − 16) (:func:`slowed`).

Which GEMM a collective of moesim's sequence-parallel layer sits beside, by position (both
engines): a reduce-scatter beside the *last* GEMM of the compute op just before it
(forward ``pipeline``, backward ``bulk``: the wgrad of qkv or fc1), an all-gather beside
the *first* GEMM of the compute op just after it (``ring_exchange``), when that op is a
layer's attention or dense FFN (:data:`PARTNERS`); any other collective stays exposed.
In the backward of an MoE layer the exchange after the next layer's attention is a
reduce-scatter (the gradient of the forward's all-gather) and the one before this
layer's attention an all-gather (:func:`moesim.program.folding` with the switch on).
"""

from __future__ import annotations

from dataclasses import replace

from moesim.collectives.communicator import CollectiveSpec
from moesim.program.ops import Op

#: TE's default num_splits for ``pipeline`` (base.py ``get_default_config``)
PIPELINE_SPLITS = 4
#: TE's default num_sm for ``pipeline`` and ``bulk`` (set_sm_margin: taken from the GEMM)
COMM_SMS = 16
#: compute ops a TP collective can sit beside
PARTNERS = ("fwd.attn", "fwd.ffn", "bwd.attn", "bwd.ffn")
WAIT = "tp_wait"


def enabled(scn) -> bool:
    return bool(getattr(scn.overlap, "tp_comm", False))


def is_gemm(k) -> bool:
    return "gemm" in k.name and k.m > 0 and k.n > 0 and k.k > 0


def gemm_at(kernels, last: bool) -> int:
    """Index of the first (``last`` False) or last GEMM kernel in ``kernels``; -1: none."""
    idx = [i for i, k in enumerate(kernels) if is_gemm(k)]
    return (idx[-1] if last else idx[0]) if idx else -1


def slowed(gemm_s: float, sm_total: int) -> float:
    """A GEMM launched on ``sm_total − COMM_SMS`` SMs (TE's SM margin)."""
    return gemm_s * sm_total / (sm_total - COMM_SMS) if sm_total > COMM_SMS else gemm_s


def pipeline_s(gemm_s: float, chunk_s: float, n: int = PIPELINE_SPLITS) -> float:
    """Exposed seconds of a reduce-scatter pipelined in ``n`` chunks of ``chunk_s`` under
    a GEMM of ``gemm_s`` (already slowed): C/n + (n − 1)·max(0, C/n − G/n)."""
    return chunk_s + (n - 1) * max(0.0, chunk_s - gemm_s / n)


def ring_s(gemm_s: float, step_s: float, tp: int) -> float:
    """Exposed seconds of a ring-exchange all-gather of tp − 1 steps of ``step_s`` beside
    a GEMM of ``gemm_s`` in tp chunks: (tp − 1)·max(0, c − G/tp)."""
    return (tp - 1) * max(0.0, step_s - gemm_s / tp)


def bulk_s(gemm_s: float, coll_s: float) -> float:
    """Exposed seconds of a collective of ``coll_s`` beside a whole GEMM of ``gemm_s``."""
    return max(0.0, coll_s - gemm_s)


def method(coll_op: str, phase: str) -> str:
    if coll_op == "all_gather":
        return "ring_exchange"
    return "pipeline" if phase == "fwd" else "bulk"


def chunk_specs(spec: CollectiveSpec, how: str, tp: int) -> list[CollectiveSpec]:
    """The collective as its overlapped pieces: 4 reduce-scatters of C/4 (pipeline);
    tp − 1 ring steps, each an all-gather of C/(tp − 1) (one step's bytes per rank on
    two ranks; with more ranks each piece pays tp − 1 link latencies); bulk: itself."""
    if how == "pipeline":
        return [CollectiveSpec(spec.op, spec.group, spec.nbytes / PIPELINE_SPLITS)] \
            * PIPELINE_SPLITS
    if how == "ring_exchange":
        return [CollectiveSpec("all_gather", spec.group, spec.nbytes / (tp - 1))] * (tp - 1)
    return [spec]


def _is_sp(op: Op) -> bool:
    return (op.coll is not None and op.kind == "tp" and ".sp_" in op.name
            and op.coll.op in ("reduce_scatter", "all_gather"))


def _partner(prog: list[Op], i: int, lo: int) -> int:
    """The compute op collective ``prog[i]`` sits beside, or -1."""
    j = i - 1 if prog[i].coll.op == "reduce_scatter" else i + 1
    if j < lo or j >= len(prog):
        return -1
    p = prog[j]
    if not (p.is_compute and p.name in PARTNERS and p.layer >= 0 and p.kernels
            and gemm_at(p.kernels, False) >= 0):
        return -1
    return j


def rewrite(prog: list[Op], start: int, last_bwd: dict[int, int], res, model) -> None:
    """Rewrite ``prog[start:]`` (one schedule item) for the exact engine: every
    sequence-parallel collective beside a partner GEMM becomes its overlapped pieces on
    the ``tp_ub`` stream, the GEMM its chunks; deps and ``last_bwd`` are remapped."""
    tp, sm_total = res.scenario.parallel.tp, int(getattr(res.device, "sms", 0) or 0)
    ag_of: dict[int, int] = {}        # partner -> the all-gather before its first GEMM
    rs_of: dict[int, int] = {}        # partner -> the reduce-scatter after its last GEMM
    for i in range(start, len(prog)):
        if _is_sp(prog[i]) and (j := _partner(prog, i, start)) >= 0:
            (ag_of if prog[i].coll.op == "all_gather" else rs_of).setdefault(j, i)
    for j in [j for j in rs_of if j in ag_of]:     # one GEMM cannot serve both
        if gemm_at(prog[j].kernels, False) == gemm_at(prog[j].kernels, True):
            del rs_of[j]
    if not ag_of and not rs_of:
        return
    coll_of = {i: j for j, i in (*ag_of.items(), *rs_of.items())}
    out: list[Op] = prog[:start]
    where: dict[int, int] = {}
    chunks: dict[int, list[int]] = {}      # partner -> (before its RS GEMM, GEMM chunks)

    def put(op: Op) -> int:
        out.append(op)
        return len(out) - 1

    def piece(coll: Op, k: int, spec, n: int, deps) -> int:
        return put(replace(coll, stream="tp_ub", coll=spec, key=coll.key + ("ub", k),
                           nbytes=coll.nbytes / n, sms=0, deps=deps))

    def split(j: int, ag: Op | None) -> int:
        """Emit partner ``prog[j]`` in pieces; returns the index of its last piece."""
        op = replace(prog[j], deps=tuple(where.get(d, d) for d in prog[j].deps))
        ks = op.kernels
        first, last = gemm_at(ks, False), gemm_at(ks, True)
        t = [model.time_s(k) for k in ks]
        rest_s, rest_f = op.duration_s, op.flops
        if ag is not None:              # kernels before the first GEMM, then the ring
            pre_s = sum(t[:first])
            head = put(replace(op, duration_s=pre_s, flops=0.0))
            specs = chunk_specs(ag.coll, "ring_exchange", tp)
            steps = [piece(ag, k, sp, len(specs), (head,) if k == 0 else ())
                     for k, sp in enumerate(specs)]
            for k in range(tp):
                put(replace(op, duration_s=t[first] / tp, flops=ks[first].flops / tp,
                            deps=(steps[k - 1],) if k else (), kernels=()))
            where[ag_of[j]] = steps[-1]
            rest_s -= pre_s + t[first]
            rest_f -= ks[first].flops
        if j not in rs_of:
            return put(replace(op, duration_s=rest_s, flops=rest_f, deps=(), kernels=())) \
                if ag is not None else put(op)
        n = PIPELINE_SPLITS if method("reduce_scatter", op.phase) == "pipeline" else 1
        g = t[last]
        body = put(replace(op, duration_s=rest_s - g, flops=rest_f - ks[last].flops,
                           deps=() if ag is not None else op.deps,
                           kernels=() if ag is not None else ks))
        chunks[j] = [body] + [put(replace(op, duration_s=slowed(g, sm_total) / n, deps=(),
                                          flops=ks[last].flops / n, kernels=()))
                              for _ in range(n)]
        return chunks[j][-1]

    for i in range(start, len(prog)):
        op = prog[i]
        if i in coll_of and prog[i].coll.op == "all_gather":
            where[coll_of[i]] = split(coll_of[i], op)      # the partner, with the ring
        elif i in coll_of:                                 # the RS after its partner
            j = coll_of[i]
            how = method("reduce_scatter", op.phase)
            specs = chunk_specs(op.coll, how, tp)
            last = -1
            for k, sp in enumerate(specs):
                last = piece(op, k, sp, len(specs),
                             (chunks[j][0],) if how == "bulk" else (chunks[j][k + 1],))
            where[i] = last
            put(Op(stream="compute", kind="compute", name=f"{op.phase}.{WAIT}",
                   deps=(last,), layer=op.layer, microbatch=op.microbatch, phase=op.phase))
        elif i in ag_of:
            continue                                       # emitted with its all-gather
        elif i in rs_of:
            where[i] = split(i, None)
        else:
            where[i] = put(replace(op, deps=tuple(where.get(d, d) for d in op.deps)))
    prog[:] = out
    for layer, idx in list(last_bwd.items()):
        if idx >= start:
            last_bwd[layer] = where.get(idx, idx)
