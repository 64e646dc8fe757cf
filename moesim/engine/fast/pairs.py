"""Two overlapped schedule items on the fast path: the exact builder's interleaving,
evaluated with per-rank numpy vectors (no simpy).

The exact engine runs a pair (:func:`moesim.program.overlap.interleave` for static
pairs, :func:`moesim.program.dualpipe_build.pair_items` for DualPipe's ``F&B`` and
a2a-1f1b) on two streams: the compute stream runs the items' segments alternately
(a segment ends at each EP all-to-all: segment 0 of the first, segment 0 of the
second, segment 1 of the first, ...), the ``ep`` stream runs the all-to-alls in that
same order, one at a time. Here the chain records each item's ops
(:class:`~moesim.engine.fast.pipeline.Chain` with ``rec`` set) and :func:`run_pair`
list-schedules them with the same rules:

- a compute op starts when the previous compute-stream op ends; the first op after
  an all-to-all of its item also waits for that all-to-all's end;
- an all-to-all joins when its segment's last op has ended and the ``ep`` stream is
  free (previous all-to-all ended); it starts moving data when its partners have
  joined and ends as the fast network times it (the chain's ``_a2a`` rule);
- an EP kernel holds f = s/S of the SMs from its join to its end: compute on the
  rank runs at 1 - f of its rate meanwhile (piecewise closed form: full rate before
  the kernel joins, 1 - f while it runs, full rate after);
- with ``overlap.gemm_sms: left_by_ep`` a recorded compute op carries its pinned
  seconds p·w (its FP8 GEMMs, on the SMs the EP kernels leave for the whole step:
  :mod:`moesim.compute.pinned_sms`): a second of its work takes p + (1 - p)/(1 - f)
  while the kernel runs, the exact engine's rate for an even mix of pinned and other
  kernels (:mod:`moesim.engine.exact.execute`);
- the breakdown follows :func:`moesim.engine.breakdown.rank_breakdown`: while the
  compute stream waits, a running transfer is exposed communication of its kind, a
  kernel waiting for its partners is a stall, anything else is idle; communication
  under compute counts as compute.

Kernels join only at compute-op boundaries (the next segment of an item waits for its
previous all-to-all, which ended no earlier than the one before it on the ``ep``
stream), so the kernel a compute op can overlap is the last one that joined.
"""

from __future__ import annotations

import numpy as np

from moesim.engine.fast.lazy import fast_kernels

#: overlapped compute ops timed on numpy before the compiled loop
#: (:func:`moesim.engine.fast.jit_loops.slowed`, numba) takes over
JIT_AFTER_CALLS = 5000

_jit: dict[str, object] = {"calls": 0, "kernel": None}


def _compiled(name: str):
    """The compiled loop ``name`` of :mod:`moesim.engine.fast.jit_loops` (``slowed``:
    :meth:`_Pair._slowed`; ``idle_split``: :meth:`_Pair._idle_to`), or None (numpy):
    after ``JIT_AFTER_CALLS`` calls, the switch as
    :func:`moesim.engine.fast.lazy.fast_kernels` reads it."""
    mod = fast_kernels(_jit, JIT_AFTER_CALLS)
    return None if mod is None else getattr(mod, name)


def segments(ops: list[tuple]) -> list[list[tuple]]:
    """Split an item's recorded ops after each all-to-all."""
    out, cur = [], []
    for op in ops:
        cur.append(op)
        if op[0] == "a":
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def spread(mine: list[list[tuple]], other: list[list[tuple]]) -> list[list[tuple]]:
    """``mine`` (no all-to-all: dense layers) cut into ``len(other)`` runs of near-equal
    op counts when ``other`` has all-to-alls, as the exact builder's DualPipe pairs
    (:func:`moesim.program.dualpipe_build.pair_items`, ``split_dense``); else unchanged."""
    ops = [op for seg in mine for op in seg]
    if not other or any(op[0] == "a" for op in ops) or \
            not any(op[0] == "a" for seg in other for op in seg):
        return mine
    n = min(len(other), len(ops))
    cuts = [len(ops) * k // n for k in range(n + 1)]
    return [ops[cuts[k]:cuts[k + 1]] for k in range(n)]


def run_pair(ch, s: int, first: list[tuple], second: list[tuple],
             split_dense: bool = False) -> None:
    """Run two recorded items on position ``s`` of chain ``ch``, ``first``'s segment
    first at every step (``split_dense``: an item without all-to-alls spread over the
    other's segments, :func:`spread`). Sends recorded inline leave when their item's
    previous op ends; advances ``ch.t[s]`` to the pair's end."""
    sa, sb = segments(first), segments(second)
    if split_dense:
        sa, sb = spread(sa, sb), spread(sb, sa)
    order: list[tuple[int, tuple]] = []
    for k in range(max(len(sa), len(sb))):
        order += [(0, op) for op in (sa[k] if k < len(sa) else [])]
        order += [(1, op) for op in (sb[k] if k < len(sb) else [])]
    ex = _Pair(ch, s)
    for who, op in order:
        ex.step(who, op)
    for who in (0, 1):
        ex.settle(who)
    ch.t[s] = ex.tc


def pinned_slowdown(w, pinned, f: float) -> tuple[np.ndarray, np.ndarray]:
    """(p, x) for ``w`` seconds of work of which ``pinned`` are pinned GEMMs while a
    kernel holds the share ``f`` of the SMs: the pinned share p = pinned / w (clipped to
    [0, 1], 0 where w is 0) and the seconds one second of the work then takes,
    x = p + (1 - p)/(1 - f) (the exact engine's rate, :mod:`moesim.engine.exact.execute`;
    scalars or arrays)."""
    w = np.asarray(w, dtype=float)
    pinned = np.asarray(pinned, dtype=float)
    p = np.clip(np.divide(pinned, w, out=np.zeros(np.broadcast(w, pinned).shape),
                          where=w > 0), 0.0, 1.0)
    return p, p + (1.0 - p) / (1.0 - f)


def pinned_rate(w, pinned, f: float):
    """Rate of ``w`` seconds of work of which ``pinned`` are pinned GEMMs while a kernel
    holds the share ``f`` of the SMs: 1 / x (:func:`pinned_slowdown`); 1 - f where
    nothing is pinned (scalars or arrays)."""
    p, x = pinned_slowdown(w, pinned, f)
    r = np.where(p > 0, 1.0 / x, 1.0 - f)
    return float(r) if r.ndim == 0 else r


class _Pair:
    def __init__(self, ch, s: int) -> None:
        self.ch, self.s = ch, s
        self.acc = ch.out[s].acc
        self.tc = ch.t[s].copy()                 # compute stream
        self.te = self.tc.copy()                 # ep stream free
        self.dep: list[np.ndarray | None] = [None, None]   # pending all-to-all end
        self.last = [self.tc.copy(), self.tc.copy()]       # end of each item's last op
        self.kern: list[tuple] = []              # (join, start, end, kind) on the ep stream
        self.f = ch.c.ep_sm_frac

    # ------------------------------------------------------------ compute stream waits
    def _idle_to(self, t: np.ndarray) -> None:
        """Advance the compute stream to ``t``; label the wait from the ep stream."""
        g0, g1 = self.tc, np.maximum(self.tc, t)
        if self.kern and (g1 > g0).any():
            acc = self.acc
            kern = _compiled("idle_split")
            for j, st, e, kind in self.kern:
                if kern is not None and acc[kind] is not acc["stall"] and g0.ndim == 1:
                    kern(acc[kind], acc["stall"], j, st, e, g0, g1)   # the same bits
                    continue
                acc[kind] += np.maximum(0.0, np.minimum(e, g1) - np.maximum(st, g0))
                acc["stall"] += np.maximum(0.0, np.minimum(st, g1) - np.maximum(j, g0))
            # kernels over on every rank cannot overlap a later wait
            self.kern = [k for k in self.kern if (k[2] > g1).any()]
        self.tc = g1

    def settle(self, who: int) -> None:
        if self.dep[who] is not None:
            self._idle_to(self.dep[who])
            self.dep[who] = None

    def _slowed(self, a: np.ndarray, w, pinned=None) -> np.ndarray:
        """Duration of ``w`` seconds of full-rate compute starting at ``a`` (``pinned``:
        seconds of it not slowed, scalar or per rank; see the module docstring)."""
        if self.f <= 0 or not self.kern:
            return np.broadcast_to(np.asarray(w, dtype=float), a.shape) + 0.0
        j, _, e, _ = self.kern[-1]
        r = 1.0 - self.f if pinned is None else pinned_rate(w, pinned, self.f)
        kern = _compiled("slowed")
        if kern is not None and a.ndim == 1 and np.ndim(r) == 0:
            return kern(a, np.asarray(w, dtype=float).reshape(-1), j, e, float(r))
        pre = np.maximum(0.0, j - a)                  # full rate before the kernel joins
        win = np.maximum(0.0, e - np.maximum(a, j))   # at rate r while it runs
        w1 = np.maximum(0.0, w - pre)
        return np.where(w <= pre, w, pre + np.where(w1 <= win * r, w1 / r,
                                                    win + (w1 - win * r)))

    # ------------------------------------------------------------ one op
    def step(self, who: int, op: tuple) -> None:
        ch, s = self.ch, self.s
        kind = op[0]
        if kind == "s":                  # pipeline send: after the item's previous op
            keep = ch.t[s]
            ch.t[s] = self.last[who]
            ch._send(s, *op[1:])
            ch.t[s] = keep
            return
        if kind == "f":                  # bookkeeping at the item's previous op's end
            op[1](self.last[who])
            return
        if kind == "a":
            self._a2a(who, op)
            return
        self.settle(who)
        if kind == "w":                  # pipeline receive on the compute stream
            _, arr, name, src, layer, mb, phase = op
            keep = ch.t[s]
            ch.t[s] = self.tc
            ch._wait(s, arr, name, src, layer, mb, phase)
            self.tc = ch.t[s]
            ch.t[s] = keep
        elif kind == "tp":
            _, d, name, layer, mb, phase = op
            a = self.tc
            self.acc["tp"] += d
            ch._span(s, "tp", name, a, a + d, layer, mb, phase)
            self.tc = a + d
        else:                            # "c": compute, slowed under a running EP kernel
            w, name, layer, mb, phase, kw = op[1:7]
            a = self.tc
            d = self._slowed(a, w, op[7] if len(op) > 7 else None)
            self.acc["compute"] += d
            ch._span(s, "compute", name, a, a + d, layer, mb, phase, **kw)
            self.tc = a + d
        self.last[who] = self.tc

    def _a2a(self, who: int, op: tuple) -> None:
        _, kind, name, rec, layer, mb, phase = op
        ch, s = self.ch, self.s
        ready = self.last[who] if self.dep[who] is None else self.dep[who]
        join = np.maximum(ready, self.te)
        start, end, late = ch._a2a_times(s, name, rec, join)
        self.kern.append((join, start, end, kind))
        self.te = end
        self.dep[who] = end
        self.last[who] = end
        ch.out[s].ep_iv.append((start, end))
        ch._a2a_spans(s, kind, name, rec, layer, mb, phase, join, start, end, late,
                      stream="ep")
