"""The flow network's state: one slot per flow, its (flow, link) pairs, per-link counts.

Per slot (a flow's bytes left are rem - rate * (t - tref) until its next change):
bytes left as of its last rate change, that time, its rate (0 once finished), its
predicted finish (inf: none), size, path latency, start time, the links of its whole
route (rows of one float array, :data:`REM` ... :data:`NPATH`), transfer group and
whether it is still sending. Pairs are kept in slot order; slot s's pairs are
``pstart[s]:pstart[s+1]``: the links of its route that can be a bottleneck (the
shadow links of :mod:`moesim.network.shadow` left out; the choices between the
compiled and numpy paths and between whole and incremental re-solves count the whole
routes' links, so they do not depend on it). Running
flows per link and in all are counted as flows start and finish, and a link -> running
flows index is built when the incremental re-solve needs it (and again once half of
those it lists have finished). Finished slots are compacted away once they are half
of all slots.

:meth:`Slots.step` is one event: the flows due to finish leave, zero-byte new flows
are done at once, the rates are re-solved (:func:`moesim.network.jit_loops.step`
compiled, or the numpy path here and in :mod:`moesim.network.incremental`; the same
rates up to rounding), and the next finish time is returned. No simpy here.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from moesim.network import incremental, jit
from moesim.network.maxmin import CAP_FLOOR

#: rows of :attr:`Slots.f`
REM, TREF, RATE, TFIN, SIZE, PLAT, START, NPATH = range(8)

#: what the events did, summed (:attr:`Slots.stats`, ``FlowNetwork.counters()``): events
#: with a re-solve, flows and (flow, link) pairs re-solved, max-min rounds, pairs passed
#: over by those rounds, links reached by the incremental closure, link -> flows index
#: entries walked (closure and residual capacity), rates that changed (by more than
#: :data:`CHANGE_RTOL` relative; a new flow counts), whole re-solves
COUNTERS = ("solves", "flows", "pairs", "rounds", "round_pairs", "links", "walked", "changed",
            "whole", "candidates")

#: the compiled kernels are loaded (importing numba and its cached code: about 0.9 s of
#: CPU on the development machine) once a network has taken this many events or holds
#: this many pairs; small runs stay on numpy. Both paths give the same rates up to
#: rounding (within 1e-12, tested), so a run may switch between them at any event.
JIT_AFTER_EVENTS = 2000
JIT_AFTER_PAIRS = 20000


def _nonzero(mask: np.ndarray) -> np.ndarray:
    return mask.nonzero()[0]


class Slots:
    """Flow slots and pairs over links of capacity ``cap`` (bytes/s)."""

    def __init__(self, cap: np.ndarray) -> None:
        self.cap = cap
        self.n_links = len(cap)
        self.n = 0                                     # slots in use
        self.f = np.zeros((8, 64))
        self.f[TFIN] = np.inf
        self.group = np.zeros(64, dtype=np.int64)
        self.alive = np.zeros(64, dtype=bool)
        self.np = 0                                    # pairs in use
        self.np_route = 0                              # their routes' links (NPATH)
        self.pf = np.zeros(256, dtype=np.int64)
        self.pl = np.zeros(256, dtype=np.int64)
        self.pstart = np.zeros(65, dtype=np.int64)
        self.lcnt = np.zeros(self.n_links, dtype=np.int64)   # running flows per link
        # running flows, their pairs, whether the link -> running flows index is valid,
        # its entries (flows crossing link l are lidx[lptr[l]:lptr[l+1]]; lidx has room
        # for every pair), their routes' links (NPATH summed)
        self.counts = np.zeros(5, dtype=np.int64)
        self.lptr = np.zeros(self.n_links + 1, dtype=np.int64)
        self.lidx = np.zeros(256, dtype=np.int64)
        self.ws: list[np.ndarray] | None = None              # compiled step's scratch
        self._params: tuple[tuple, np.ndarray] | None = None  # compiled step's constants
        self.done_bytes = np.zeros(self.n_links)             # bytes of slots compacted away
        self.events = 0
        self.stats = np.zeros(len(COUNTERS), dtype=np.int64)  # see COUNTERS

    @property
    def n_alive(self) -> int:
        return int(self.counts[0])

    # ---- growth ---------------------------------------------------------------
    def add(self, paths: Sequence[np.ndarray], sizes: Sequence[float], gids: Sequence[int],
            now: float, plats: Sequence[float], nroute: Sequence[int]) -> int:
        """New running flows in slots (compiled once the kernels are loaded, else numpy;
        the same state): ``paths`` the links they are solved over, ``plats`` their routes'
        latencies, ``nroute`` their routes' lengths; returns the first new slot."""
        first, m = self.n, len(sizes)
        if first + m > len(self.alive):
            cap = max(first + m, 2 * len(self.alive))
            f = np.zeros((8, cap))
            f[TFIN] = np.inf
            f[:, :first] = self.f[:, :first]
            self.f = f
            for name in ("group", "alive"):
                old = getattr(self, name)
                new = np.zeros(cap, dtype=old.dtype)
                new[:first] = old[:first]
                setattr(self, name, new)
            pst = np.zeros(cap + 1, dtype=np.int64)
            pst[:first + 1] = self.pstart[:first + 1]
            self.pstart = pst
        end = first + m
        kern = jit.kernels(load=False)
        if kern is not None:   # compiled: the same state
            links = np.concatenate(paths)
            p0 = self.np
            self._grow_pairs(p0 + len(links))
            nr = np.array(nroute, dtype=np.int64)
            kern.add(self.f, self.group, self.alive, self.pstart, self.pf, self.pl, self.lcnt,
                     self.counts, np.array(plats, dtype=float), nr, links,
                     np.fromiter(map(len, paths), np.int64, m), np.array(sizes, dtype=float),
                     np.array(gids, dtype=np.int64), first, p0, now)
            self.n, self.np = end, p0 + len(links)
            self.np_route += int(nr.sum())
            return first
        size = np.asarray(sizes, dtype=float)
        f = self.f
        f[REM, first:end] = size
        f[SIZE, first:end] = size
        f[RATE, first:end] = 0.0
        f[TREF, first:end] = now
        f[TFIN, first:end] = np.inf
        f[START, first:end] = now
        f[PLAT, first:end] = plats
        f[NPATH, first:end] = nroute
        self.group[first:end] = gids
        self.alive[first:end] = True
        lens = list(map(len, paths))
        local = np.repeat(np.arange(first, end, dtype=np.int64), lens)   # slot of each pair
        links = np.concatenate(paths)
        n_links = len(links)
        p0, p1 = self.np, self.np + n_links
        self._grow_pairs(p1)
        self.pf[p0:p1] = local
        self.pl[p0:p1] = links
        self.pstart[first + 1:end + 1] = list(accumulate(lens, initial=p0))[1:]
        self.lcnt += np.bincount(links, minlength=self.n_links)
        counts = self.counts
        counts[0] += m
        counts[1] += n_links
        counts[4] += int(f[NPATH, first:end].sum())
        self.np_route += int(f[NPATH, first:end].sum())
        self.n, self.np = end, p1
        self.counts[2] = 0   # the index is stale
        return first

    def _grow_pairs(self, n_pairs: int) -> None:
        """Room for ``n_pairs`` pairs (and as many link -> flows index entries)."""
        if n_pairs > len(self.pf):
            p0, pcap = self.np, max(n_pairs, 2 * len(self.pf))
            for name in ("pf", "pl", "lidx"):
                old = getattr(self, name)
                new = np.zeros(pcap, dtype=np.int64)
                new[:p0] = old[:p0]
                setattr(self, name, new)

    def compact(self) -> None:
        """Drop finished slots once they are half of all (their bytes go to done_bytes)."""
        n = self.n
        if n < 64 or self.counts[0] * 2 > n:
            return
        alive = self.alive[:n]
        pf, pl = self.pf[:self.np], self.pl[:self.np]
        keep_pair = alive[pf]
        dead = ~keep_pair
        self.done_bytes += np.bincount(pl[dead], weights=self.f[SIZE, pf[dead]],
                                       minlength=self.n_links)
        new_id = np.cumsum(alive) - 1
        m = int(keep_pair.sum())
        self.pf[:m] = new_id[pf[keep_pair]]
        self.pl[:m] = pl[keep_pair]
        self.np = m
        lens = np.diff(self.pstart[:n + 1])[alive]
        k = len(lens)
        self.pstart[1:k + 1] = np.cumsum(lens)
        self.f[:, :k] = self.f[:, :n][:, alive]
        self.f[:, k:n] = 0.0
        self.f[TFIN, k:n] = np.inf
        self.group[:k] = self.group[:n][alive]
        self.alive[:k] = True
        self.alive[k:n] = False
        self.n = k
        self.np_route = int(self.f[NPATH, :k].sum())
        self.counts[2] = 0

    def restore(self, shadow: np.ndarray, master: np.ndarray) -> None:
        """Put shadow link ``shadow[i]`` back into every slot crossing ``master[i]``
        (which carried the same flows so far), after it, with its count and the bytes
        of the slots compacted away."""
        for a, m in zip(shadow.tolist(), master.tolist(), strict=True):
            pf, pl = self.pf[:self.np], self.pl[:self.np]
            at = (pl == m).nonzero()[0] + 1
            if len(at):
                slot = pf[at - 1]
                pf2, pl2 = np.insert(pf, at, slot), np.insert(pl, at, a)
                self._grow_pairs(self.np + len(at))
                self.np += len(at)
                self.pf[:self.np], self.pl[:self.np] = pf2, pl2
                n = self.n
                self.pstart[1:n + 1] += np.cumsum(np.bincount(slot, minlength=n))
            self.lcnt[a] = self.lcnt[m]
            self.counts[1] += self.lcnt[m]
            self.done_bytes[a] = self.done_bytes[m]
        self.counts[2] = 0

    def link_bytes(self, now: float) -> np.ndarray:
        """Bytes carried per link (slots compacted away, then the others' progress)."""
        out = self.done_bytes.copy()
        if self.np:
            f, n = self.f, self.n
            left = f[REM, :n] - f[RATE, :n] * (now - f[TREF, :n])
            sent = np.where(self.alive[:n], f[SIZE, :n] - left, f[SIZE, :n])
            out += np.bincount(self.pl[:self.np], weights=sent[self.pf[:self.np]],
                               minlength=self.n_links)
        return out

    # ---- one event ------------------------------------------------------------
    def step(self, now: float, first_new: int, tol: float, rtol: float, incremental_on: bool,
             small_pairs: int) -> tuple[np.ndarray, int, int, float]:
        """Finish the due flows, re-solve; returns (finished slots: the due ones then the
        zero-byte new ones, how many were due, rates re-solved (-1: no solve), next
        finish time or inf)."""
        self.events += 1
        kern = jit.kernels(load=self.events > JIT_AFTER_EVENTS or self.np_route > JIT_AFTER_PAIRS)
        if kern is not None:
            n = self.n
            ws = self.ws
            if ws is None or len(ws[0]) < n:
                ws = self._workspace(n)
            key = (rtol, incremental_on, small_pairs)
            params = self._params
            if params is None or params[0] != key:
                params = self._params = (key, np.array(
                    [rtol, float(incremental_on), small_pairs, incremental.CANDIDATE_FRACTION,
                     incremental.THRESHOLD_MARGIN, CAP_FLOOR, incremental.CHANGE_RTOL]))
            n_done, n_old, n_res, wake = kern.step(
                now, first_new, tol, n, self.np, self.f, self.alive, self.pstart, self.pf,
                self.pl, self.lptr, self.lidx, self.cap, self.lcnt, self.counts, params[1],
                self.stats, *ws)
            return ws[1][:n_done], n_old, n_res, wake
        return self._step_numpy(now, first_new, tol, rtol, incremental_on, small_pairs)

    def _workspace(self, n_slots: int) -> list[np.ndarray]:
        """The compiled step's scratch: per slot (room for ``n_slots``) hit flags and
        finished slots; per link a count, residual capacity and frozen load, and seen
        flags (zero between events)."""
        ws = self.ws
        if ws is None:
            m = self.n_links
            ws = self.ws = [np.zeros(64, dtype=bool), np.zeros(64, dtype=np.int64),
                            np.zeros(m, dtype=np.int64), np.zeros((2, m)),
                            np.zeros(m, dtype=bool)]
        if len(ws[0]) < n_slots:
            size = max(n_slots, 2 * len(ws[0]))
            ws[0] = np.zeros(size, dtype=bool)
            ws[1] = np.zeros(size, dtype=np.int64)
        return ws

    def _step_numpy(self, now: float, first_new: int, tol: float, rtol: float,
                    incremental_on: bool, small_pairs: int) -> tuple[np.ndarray, int, int, float]:
        n, f = self.n, self.f
        tfin, rate = f[TFIN, :n], f[RATE, :n]
        if rtol > 0:   # also flows whose remaining time is <= rtol x age
            old = _nonzero(tfin[:first_new] - now <= tol + rtol * (now - f[START, :first_new]))
        else:
            old = _nonzero(tfin[:first_new] <= now + tol)
        r_done = float(rate[old].min()) if len(old) else np.inf
        zero = first_new + _nonzero(f[SIZE, first_new:n] == 0.0)
        done = np.concatenate((old, zero))
        alive = self.alive[:n]
        pf, pl, pstart = self.pf[:self.np], self.pl[:self.np], self.pstart[:n + 1]
        if len(done):
            alive[done] = False
            rate[done] = 0.0
            tfin[done] = np.inf
            links = pl[incremental.ranges(pstart[done], pstart[done + 1])]
            self.lcnt -= np.bincount(links, minlength=self.n_links)
            self.counts[:2] -= (len(done), len(links))
            self.counts[4] -= int(f[NPATH, done].sum())
        has_new = self.counts[0] > 0 and bool(alive[first_new:].any())
        n_res = -1
        if has_new or len(old):
            whole = not (incremental_on and self.counts[4] > small_pairs)
            if not whole and (not self.counts[2] or 2 * self.counts[1] < self.counts[3]):
                lptr, lidx = incremental.link_index(pf, pl, alive, self.n_links)
                self.lptr[:] = lptr
                self.lidx[:len(lidx)] = lidx
                self.counts[2:4] = (1, len(lidx))
            idx = incremental.solve(now, pstart, pf, pl, self.lptr, self.lidx, self.cap, alive,
                                    rate, f[REM, :n], f[TREF, :n], tfin, self.lcnt, old,
                                    first_new if has_new else n, r_done, int(self.counts[0]),
                                    whole, self.stats)
            n_res = len(idx)
        wake = float(tfin.min()) if self.counts[0] else np.inf
        return done, len(old), n_res, wake
