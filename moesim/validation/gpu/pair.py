"""A simulated DualPipe forward+backward pair, read the way a GPU trace of one is read.

DeepSeek's profile (and any trace of one ``overlapped_forward_backward`` of
deepseek-ai/DualPipe) holds one forward chunk and one full backward chunk of another
micro-batch, interleaved, with the pipeline communication left out. This module takes a
simulated step of a ``schedule.kind: dualpipe | dualpipev`` scenario and keeps, on one
rank, the spans of that rank's overlapped ``F&B`` item (the last one in its order, a
steady-state pair): the forward of micro-batch ``mb`` and the backward (``B`` and ``W``)
of micro-batch ``bmb``, of the stages' layers only (the embedding and LM head, layer
-1, and the pipeline receives, sends and bubbles are left out).

Figures (seconds), matched to :func:`moesim.validation.gpu.summary.summarize`'s:

- ``span_s``: first kept span's start to the last one's end;
- ``stream_busy_s``: ``compute`` = union of the kept spans on the ``compute`` stream,
  ``comm`` = union of those on the ``ep`` stream (the DeepEP kernels, waits for late
  peers included: a DeepEP kernel spins on its peers while it runs); ``exposed_comm_s``
  = the ``comm`` union minus its overlap with the ``compute`` union;
- ``phases``: per trace annotation name and layer k (the k-th layer in execution order,
  as the trace's k-th annotation of a name: the backward runs its layers last to first)
  ``busy_s`` (summed span time of the part), ``comm_s`` (of ``dispatch``/``combine``).

Parts (the names :mod:`moesim.program.build` gives the ops): ``attn(F)`` = ``fwd.attn``
+ ``fwd.router`` (DeepSeek's trace launches the gate inside ``attn(F)``), ``mlp(F)`` =
``fwd.experts`` + ``fwd.unpermute``, ``dispatch(F)``/``combine(F)`` = ``fwd.dispatch``/
``fwd.combine``; ``attn(B)`` = ``bwd.attn`` + ``bwd.router``, ``attn(W)`` =
``bwd.w_attn``, ``mlp(B)`` = ``bwd.experts`` + ``bwd.unpermute``, ``mlp(W)`` =
``bwd.w_experts`` + ``bwd.w_mlp``, ``dispatch(B)``/``combine(B)`` = ``bwd.dispatch``/
``bwd.combine`` (the backward of the dispatch and of the combine, as DeepSeek names
them).

The measured side by stream role (:func:`measured_streams`): a stream whose kernel time
is mostly communication kernels is a communication stream, every other one a compute
stream; ``compute``/``comm`` = the union of the intervals of the streams of that role.
"""

from __future__ import annotations

from typing import Any

from moesim.schedule.dualpipe import KINDS as DUAL_KINDS
from moesim.schedule.dualpipe import make_dual_order
from moesim.validation.gpu.summary import length, overlap, union

PARTS: dict[str, tuple[str, ...]] = {
    "attn(F)": ("fwd.attn", "fwd.router"), "mlp(F)": ("fwd.experts", "fwd.unpermute"),
    "dispatch(F)": ("fwd.dispatch",), "combine(F)": ("fwd.combine",),
    "attn(B)": ("bwd.attn", "bwd.router"), "attn(W)": ("bwd.w_attn",),
    "mlp(B)": ("bwd.experts", "bwd.unpermute"), "mlp(W)": ("bwd.w_experts", "bwd.w_mlp"),
    "dispatch(B)": ("bwd.dispatch",), "combine(B)": ("bwd.combine",),
}
PART_OF = {name: part for part, names in PARTS.items() for name in names}
SKIP_KINDS = ("pp", "bubble")


def fb_item(order: Any, pos: int) -> Any | None:
    """The last ``F&B`` item of pipeline position ``pos`` in a DualPipe(V) order, or
    None when it has none."""
    pairs = [it for it in order.items[pos] if it.kind == "F&B"]
    return pairs[-1] if pairs else None


def pair_spans(spans: list, rank: int, item: Any) -> list:
    """The spans of ``item`` (an ``F&B``) on ``rank``: the forward of ``item.mb`` and
    the backward of ``item.bmb``, layer ops only (each micro-batch passes a rank once
    per direction, so micro-batch and pass name the pair's ops)."""
    out = []
    for s in spans:
        if s.rank != rank or s.layer < 0 or s.kind in SKIP_KINDS:
            continue
        if (s.phase == "fwd" and s.microbatch == item.mb) or \
                (s.phase == "bwd" and s.microbatch == item.bmb):
            out.append(s)
    return sorted(out, key=lambda s: (s.start_s, s.end_s))


def pair_figures(kept: list) -> dict:
    """``span_s``, ``stream_busy_s`` {compute, comm}, ``exposed_comm_s`` and ``phases``
    {name: {layer: {busy_s, comm_s}}} of the kept spans (seconds)."""
    if not kept:
        return {"span_s": None, "stream_busy_s": None, "exposed_comm_s": None, "phases": {}}
    comp = union([(s.start_s, s.end_s) for s in kept if s.stream == "compute"])
    comm = union([(s.start_s, s.end_s) for s in kept if s.stream == "ep"])
    layers = {"fwd": sorted({s.layer for s in kept if s.phase == "fwd"}),
              "bwd": sorted({s.layer for s in kept if s.phase == "bwd"}, reverse=True)}
    phases: dict[str, dict[str, dict]] = {}
    for s in kept:
        part = PART_OF.get(s.name)
        if part is None:
            continue
        k = str(layers[s.phase].index(s.layer))
        row = phases.setdefault(part, {}).setdefault(k, {"busy_s": 0.0, "comm_s": 0.0})
        row["busy_s"] += s.dur_s
        if s.stream == "ep" or s.kind in ("ep_dispatch", "ep_combine", "stall"):
            row["comm_s"] += s.dur_s
    return {"span_s": max(s.end_s for s in kept) - min(s.start_s for s in kept),
            "stream_busy_s": {"compute": length(comp), "comm": length(comm)},
            "exposed_comm_s": length(comm) - overlap(comm, comp), "phases": phases}


def measured_streams(tr: Any) -> dict:
    """``stream_busy_s`` {compute, comm}, ``exposed_comm_s`` and the streams of each
    role, from a :class:`moesim.validation.gpu.trace.GpuTrace`."""
    by: dict[tuple, list] = {}
    for k in tr.kernels:
        by.setdefault((k.device, k.stream), []).append(k)
    role = {key: "comm" if 2 * sum(k.dur_s for k in ks if k.cls == "comm")
            > sum(k.dur_s for k in ks) else "compute" for key, ks in by.items()}
    iv = {r: union([(k.start_s, k.end_s) for key, ks in by.items() if role[key] == r
                    for k in ks]) for r in ("compute", "comm")}
    return {"stream_busy_s": {r: length(v) for r, v in iv.items()},
            "exposed_comm_s": length(iv["comm"]) - overlap(iv["comm"], iv["compute"]),
            "streams": {r: sorted(str(key[1]) for key in by if role[key] == r)
                        for r in ("compute", "comm")}}


def simulate_pair(res: Any, model: Any, rank: int) -> dict:
    """Simulate the resolved scenario ``res`` with compute model ``model`` on the exact
    engine and return :func:`pair_figures` of ``rank``'s F&B pair plus ``pair`` (rank,
    micro-batches and stages); ``{"pair": None, "reason": ...}`` when the scenario's
    schedule has no F&B pair on that rank or it runs on the fast engine (whose lockstep
    spans keep no per-stream EP kernels)."""
    from dataclasses import replace

    from moesim.wiring import simulate

    scn = res.scenario
    if scn.schedule.kind not in DUAL_KINDS:
        return {"pair": None, "reason": f"schedule.kind {scn.schedule.kind!r} has no "
                "DualPipe forward+backward pair (dualpipe or dualpipev)"}
    if scn.engine.mode != "exact":
        return {"pair": None, "reason": f"engine.mode {scn.engine.mode!r}: the pair is read "
                "from the exact engine's spans (DeepEP kernels on the ep stream), "
                "engine.mode: exact"}
    world = res.layout.world
    rank = rank if 0 <= rank < world else 0
    pos = int(res.layout.coords["pp"][rank])
    order = make_dual_order(scn.schedule.kind, scn.parallel.pp, scn.schedule.microbatches)
    item = fb_item(order, pos)
    if item is None:
        return {"pair": None, "reason": f"rank {rank} runs no overlapped F&B item in "
                "this order (more schedule.microbatches give it one)"}
    result = simulate(replace(res, compute=model))
    fig = pair_figures(pair_spans(result.spans, rank, item))
    fig["pair"] = {"rank": rank, "forward": {"microbatch": item.mb, "stage": item.stage},
                   "backward": {"microbatch": item.bmb, "stage": item.bstage},
                   "engine": scn.engine.mode}
    return fig
