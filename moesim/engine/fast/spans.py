"""Which ranks keep their spans on the fast path (pure).

A fast-path run covers every rank in its per-rank breakdowns but keeps spans (the
timeline, the stall table, the critical path) for a few ranks only: the
``span_ranks`` lowest ranks, recorded on the first pass, and the ranks that explain
the step, recorded by running their chains again once every rank's stall is known:

- the *focus chain*: the chain (the EP groups of one (tp, edp) coordinate across the
  pipeline stages) holding the most-stalled rank of the step; in it, per stage, the
  most-stalled rank and the most-loaded hot rank;
- up to 512 GPUs, also every hot rank, in up to ``MAX_EXTRA_CHAINS`` more chains.

Running a chain again costs what its first run did (routing included), so larger
runs re-run the focus chain only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moesim.trace.spans import Span

MAX_EXTRA_CHAINS = 3
ALL_HOT_MAX_WORLD = 512


def choose_span_ranks(chains: list[list[tuple[int, ...]]], stall: np.ndarray,
                      load: np.ndarray, hot: list[int], want: set[int], world: int
                      ) -> tuple[dict[int, set[int]], dict]:
    """(chain index -> ranks to record on a second run, description for the summary).
    ``stall``/``load``: per rank (seconds, tokens received); ``hot``: the hot ranks;
    ``want``: ranks whose spans the first pass kept. Ranks not in any chain (mirrors
    of identical replicas) are never chosen."""
    chain_of = {r: ci for ci, groups in enumerate(chains) for g in groups for r in g}
    in_chains = np.asarray(sorted(chain_of), dtype=np.int64)
    if len(in_chains) == 0:
        return {}, {"ranks": sorted(want), "rule": "no chain ran"}
    # the most-stalled rank (ties: lowest rank) picks the focus chain
    top = int(in_chains[np.argmax(stall[in_chains])])
    focus = chain_of[top]
    picked: list[int] = []
    hot_set = set(hot)
    for g in chains[focus]:
        ga = np.asarray(g)
        s_rank = int(ga[np.argmax(stall[ga])])
        if stall[s_rank] > 0:
            picked.append(s_rank)
        hg = [r for r in g if r in hot_set]
        if hg:
            picked.append(max(hg, key=lambda r: (load[r], -r)))
    extra: list[int] = []
    if world <= ALL_HOT_MAX_WORLD:
        extra = [r for r in sorted(hot_set) if r in chain_of]
    rerun: dict[int, set[int]] = {}
    for r in [*picked, *extra]:
        if r in want:
            continue
        ci = chain_of[r]
        if ci != focus and ci not in rerun and len(set(rerun) - {focus}) >= MAX_EXTRA_CHAINS:
            continue
        rerun.setdefault(ci, set()).add(r)
    kept = sorted(want | {r for rs in rerun.values() for r in rs} | {r for r in picked
                                                                       if r in want})
    rule = (f"the {len(want)} lowest ranks; in the chain of the most-stalled rank "
            f"{top} (its EP groups across the pipeline stages), per stage the "
            "most-stalled rank and the most-loaded hot rank"
            + ("; every hot rank in up to "
               f"{MAX_EXTRA_CHAINS} more chains" if world <= ALL_HOT_MAX_WORLD else ""))
    return rerun, {"ranks": kept, "lowest": sorted(want), "focus_chain": focus,
                   "most_stalled_rank": top, "per_stage": picked, "rule": rule}


def add_spans(out: list, ranks, pos, kind: str, name: str, a, b, layer, mb, phase, stream,
              kw: dict) -> None:
    """Append the spans of positions ``pos`` (of group ``ranks``) for an op from ``a`` to
    ``b`` (per position); array values in ``kw`` are per position too. A wait (stall,
    bubble) of zero length leaves no span."""
    waits = kind in ("stall", "bubble")
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    names = [k for k, v in kw.items() if isinstance(v, np.ndarray)]
    if len(pos) <= 4 and a.ndim == b.ndim == 1 and all(kw[k].ndim == 1 for k in names):
        # a few kept ranks: read their entries only (the same values as tolist's)
        al, bl = {e: a.item(e) for e in pos}, {e: b.item(e) for e in pos}
        arrays = {k: {e: kw[k].item(e) for e in pos} for k in names}
    else:
        al, bl = a.tolist(), b.tolist()
        arrays = {k: kw[k].tolist() for k in names}
    for e in pos:
        if bl[e] > al[e] or not waits:
            extra = dict(kw)
            for k, v in arrays.items():
                extra[k] = v[e]
            out.append(Span(rank=ranks[e], stream=stream, kind=kind, name=name,
                            start_s=al[e], end_s=bl[e], layer=layer, microbatch=mb,
                            phase=phase, **extra))


def moved_ends(out: list, n0: int, pos, end) -> None:
    """The spans :func:`add_spans` appended from ``out[n0]`` on for positions ``pos`` (an
    op that leaves no zero-length span out) end at ``end`` (per position) instead."""
    for i, e in enumerate(pos):
        out[n0 + i] = dataclasses.replace(out[n0 + i], end_s=float(end[e]))
