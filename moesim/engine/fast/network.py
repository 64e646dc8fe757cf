"""Contention-aware times of collectives for the fast path: closed forms, and the flow
network (simpy, imported lazily) for the all-to-alls of small multi-host groups.

A direct all-to-all-v (:meth:`_Incidence.flow_finish`): every link of a flow's path
shares its capacity among its flows by processor sharing (max-min on one link: a flow
of s bytes among flows started with it ends after Σ_j min(s_j, s) / capacity), with
staggered starts grouped into a few levels; a flow ends at its latest end over its
links, plus its path's latency; a rank is done when all flows it sends or receives
are done. One node (each flow crossing its two GPUs' NVLink ports) matches the
flow-level engine to 1e-9; flows held back by two links in turn (relayed to another
node's NIC) are not (measured in tests/test_fast_path.py and docs/fast-path.md).

Phased collectives (:meth:`FastNetwork.phases_time`) are charged the *link bound*:
every link carries the bytes of the phase's flows routed over it, a flow is done when
the most loaded link on its path has drained at that link's capacity, plus latency.

Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from moesim.collectives.algorithms import expand
from moesim.engine.fast import flow_a2a
from moesim.engine.fast.lazy import fast_kernels

#: all-to-alls of groups larger than this use the staggered link bound instead of
#: per-link processor sharing: sharing sorts every link's flows per all-to-all, which
#: on deepseek-v3-2048 (EP64, 27,840 all-to-alls of 4,032 flows per chain) took the
#: run from 53.7 s to 63-67 s wall (docs/fast-path.md); every fidelity case checked
#: against the exact engine has at most 16 members
SHARING_MAX_MEMBERS = 32

#: all-to-alls of groups spanning more than one host and with at most this many
#: members run flow by flow on the flow-level max-min network (exact, as the exact
#: engine's communicator: flow i→j starts when both have arrived, a member is done
#: when all its flows are delivered). Per-link sharing misses the coupling of a flow
#: relayed over NVLink to another GPU's NIC (worst per-rank stall 1.52 % of the step
#: off on the 128-GPU fidelity case with sharing, 0.51 % with this; docs/fast-path.md).
#: Groups within one host keep sharing, which is exact there.
EXACT_MAX_MEMBERS = 32

#: flows the fast path may run flow by flow on the flow network in one step (about
#: 30 s of CPU on the development machine); a step that would run more (counted before
#: it starts by :func:`exact_flow_estimate`, e.g. Qwen3-235B on 256 GPUs: EP32 over 4
#: nodes, 94 layers x 128 micro-batches, about 49 million) times those all-to-alls by
#: per-link processor sharing instead, and says so in the summary's shortcuts
EXACT_FLOW_BUDGET = 1_000_000

#: all-to-alls timed by the staggered link bound before the compiled loops
#: (:mod:`moesim.engine.fast.jit_loops`, numba) take over, unless numba is imported already:
#: importing numba costs about a second of CPU, more than a small run's link bounds
JIT_AFTER_CALLS = 2000

_jit: dict[str, object] = {"calls": 0, "kernel": None}


def _compiled_drain(levels: bool = False):
    """The compiled equal-arrivals link bound (``levels``: the staggered one of
    members arriving apart, ``drain_level_ends``), or None (numpy): after
    ``JIT_AFTER_CALLS`` calls, or at once when numba is imported already (e.g. by the
    routing sampler: its import, the cost the threshold waits out, is paid); the switch
    as :func:`moesim.engine.fast.lazy.fast_kernels` reads it."""
    mod = fast_kernels(_jit, JIT_AFTER_CALLS, eager=True)
    if mod is None:
        return None
    return mod.drain_level_ends if levels else mod.drain_equal_ends   # type: ignore[attr-defined]


def _start_levels(matrix: np.ndarray, arrivals: np.ndarray, k_max: int):
    """(flat bytes, flat start times max(arrival_i, arrival_j), mask of flows with bytes,
    start levels τ) of an all-to-all; τ = the distinct arrivals from the earliest start
    of a flow with bytes on (every start is an arrival), or ``k_max`` quantiles of them;
    τ is None when no flow has bytes."""
    flat = np.asarray(matrix, dtype=float).ravel()
    a = np.asarray(arrivals, dtype=float)
    start = np.maximum(a[:, None], a[None, :]).ravel()
    live = flat > 0
    if not live.any():
        return flat, start, live, None
    taus = np.unique(a)
    taus = taus[taus >= start[live].min()]
    if len(taus) > k_max:
        taus = taus[np.unique(np.linspace(0, len(taus) - 1, k_max).round().astype(int))]
    return flat, start, live, taus


class _Incidence:
    """Routes of every ordered pair of a group, as flat (pair, link) arrays."""

    def __init__(self, topo, gpus: Sequence[str], group: Sequence[int]) -> None:
        n = len(group)
        pair_of: list[int] = []
        link_of: list[int] = []
        lat = np.zeros(n * n)
        lat_all = topo.latency_s
        # numpy sums fewer than 8 float64s one by one from 0.0: the same sum here
        lat_l = lat_all.tolist() if lat_all.dtype == np.float64 else None
        for i, a in enumerate(group):
            for j, b in enumerate(group):
                if i == j:
                    continue
                path = topo.route(gpus[a], gpus[b])
                p = i * n + j
                pair_of.extend([p] * len(path))
                link_of.extend(path)
                if lat_l is not None and len(path) < 8:
                    x = 0.0
                    for lk in path:
                        x += lat_l[lk]
                    lat[p] = x
                else:
                    lat[p] = float(lat_all[list(path)].sum()) if path else 0.0
        links, local = np.unique(np.asarray(link_of, dtype=np.int64), return_inverse=True)
        self.n = n
        self.pair = np.asarray(pair_of, dtype=np.int64)
        self.link = local.astype(np.int64)
        self.cap = np.asarray(topo.capacity_Bps, dtype=float)[links]
        self.lat = lat
        self.n_links = len(links)
        # (n*n, hops) local link ids, padded with n_links (a slot that is never busy)
        hops = np.bincount(self.pair, minlength=n * n)
        pad = np.full((n * n, max(int(hops.max(initial=0)), 1)), self.n_links, dtype=np.int64)
        col = np.arange(len(self.pair)) - np.repeat(np.cumsum(hops) - hops, hops)
        pad[self.pair, col] = self.link
        self.pad_t = np.ascontiguousarray(pad.T).astype(np.intp)   # (hops, n*n)
        # per link, its pairs sorted (padded with the pair n*n, which never carries
        # bytes); links with the same pairs share one row, at the lowest capacity (its
        # processor-sharing ends are the latest); for every pair and hop, the flat
        # position of that (row, pair) entry
        per = np.bincount(self.link, minlength=self.n_links)
        width = max(int(per.max(initial=0)), 1)
        by = np.lexsort((self.pair, self.link))
        lk = self.link[by]
        c = np.arange(len(lk)) - np.repeat(np.cumsum(per) - per, per)
        slot = np.full((self.n_links, width), n * n, dtype=np.intp)
        slot[lk, c] = self.pair[by]
        rows, row_of = np.unique(slot, axis=0, return_inverse=True)
        row_of = row_of.ravel()
        cap_row = np.full(len(rows), np.inf)
        np.minimum.at(cap_row, row_of, self.cap)
        self.slot = rows
        self.slot_flat = rows.ravel()
        self.row_off = (np.arange(len(rows)) * width)[:, None]
        self.inv_cap = (1.0 / cap_row)[:, None]
        self.row_idx = np.arange(len(rows))[:, None]
        self.col_flat = np.tile(np.arange(width), len(rows))
        self.inv_cap_flat = np.repeat(1.0 / cap_row, width)
        key = self.slot_flat + np.repeat(np.arange(len(rows)), width) * (n * n + 1)
        flat_pos = np.searchsorted(key, row_of[self.link] * (n * n + 1) + self.pair)
        pos = np.full((n * n, pad.shape[1]), rows.size, dtype=np.intp)
        pos[self.pair, col] = flat_pos
        self.pos_t = np.ascontiguousarray(pos.T)                      # (hops, n*n)

    def finish(self, matrix: np.ndarray, arrivals: np.ndarray, k_max: int = 6) -> np.ndarray:
        """Per member: when all its flows are done, flow i→j starting at
        max(arrival_i, arrival_j); see :meth:`flow_finish` (groups of more than
        ``SHARING_MAX_MEMBERS``: :meth:`drain_finish`)."""
        a = np.asarray(arrivals, dtype=float)
        if self.n > SHARING_MAX_MEMBERS:
            equal = bool(len(a)) and bool(np.all(a == a[0]))
            kernel = _compiled_drain(levels=not equal)
            if kernel is not None and equal:     # the same bits as drain_finish (tested)
                return kernel(np.ascontiguousarray(matrix, dtype=float).ravel(),
                              self.pad_t, self.cap, self.lat, self.n, float(a[0]))
            if kernel is not None:
                flat, start, live, taus = _start_levels(matrix, a, k_max)
                if taus is None:
                    return a.copy()
                return kernel(flat, start, taus, self.pad_t, self.cap, self.lat, self.n, a)
            f_pair, live = self.drain_finish(matrix, a, k_max)
        else:
            f_pair, live = self.flow_finish(matrix, a, k_max)
        if f_pair is None:
            return a.copy()
        f_pair = np.where(live, f_pair, -np.inf).reshape(self.n, self.n)
        end = np.maximum(f_pair.max(axis=1), f_pair.max(axis=0))
        return np.maximum(end, a)

    def drain_finish(self, matrix: np.ndarray, arrivals: np.ndarray, k_max: int = 6):
        """Like :meth:`flow_finish`, by the *staggered link bound*: every link drains
        like a work-conserving queue, done at max over start levels τ of τ + (bytes of
        its flows starting at or after τ) / capacity; a flow ends when every link of
        its path has drained, plus its path latency (so members of one all-to-all end
        nearly together; cheaper: no sort)."""
        a = np.asarray(arrivals, dtype=float)
        if len(a) and np.all(a == a[0]):     # one start level: the same sums, less work
            flat = np.asarray(matrix, dtype=float).ravel()
            live = flat > 0
            if not live.any():
                return None, live
            nzp = np.flatnonzero(flat)
            hops = self.pad_t[:, nzp]
            load = np.bincount(hops.T.ravel(), weights=np.repeat(flat[nzp], len(hops)),
                               minlength=self.n_links + 1)[:self.n_links]
            f_link = np.append(np.where(load > 0, a[0] + load / self.cap, -np.inf), -np.inf)
            f_nz = f_link.take(hops[0])
            for row in hops[1:]:
                np.maximum(f_nz, f_link.take(row), out=f_nz)
            f_pair = np.full(len(flat), -np.inf)
            f_pair[nzp] = np.maximum(f_nz, a[0]) + self.lat[nzp]
            return f_pair, live
        flat, start, live, taus = _start_levels(matrix, arrivals, k_max)
        if taus is None:
            return None, live
        # only pairs with bytes: each link's sum keeps its order (pairs ascending) and
        # drops only zeros, so the loads are the same floats as over every pair
        nzp = np.flatnonzero(flat)
        hops = self.pad_t[:, nzp]                                   # (hops, pairs)
        idx = hops.T.ravel()                                        # pair by pair
        w = np.where(start[nzp][None, :] >= taus[:, None], flat[nzp][None, :], 0.0)
        load = np.stack([np.bincount(idx, weights=np.repeat(wk, len(hops)),
                                     minlength=self.n_links + 1)[:self.n_links]
                         for wk in w], axis=1)                               # (links, K)
        drain = np.where(load > 0, taus[None, :] + load / self.cap[:, None], -np.inf)
        f_link = np.append(drain.max(axis=1), -np.inf)
        f_nz = f_link.take(hops[0])
        for row in hops[1:]:            # max over the hops of each pair's path
            np.maximum(f_nz, f_link.take(row), out=f_nz)
        f_pair = np.full(len(flat), -np.inf)      # pairs without bytes: not live
        f_pair[nzp] = np.maximum(f_nz, start[nzp]) + self.lat[nzp]
        return f_pair, live

    def flow_finish(self, matrix: np.ndarray, arrivals: np.ndarray, k_max: int = 6):
        """(n*n,) end of every flow i→j (start max(arrival_i, arrival_j)) and the mask of
        flows with bytes; (None, mask) when no flow has bytes.

        Each link shares its capacity among its flows by processor sharing (max-min on
        one link). Starts are grouped into up to ``k_max`` levels τ (the distinct
        arrivals, or that many quantiles of them). A flow of s bytes starting at level
        τ_l ends on a link at τ_l + (Σ_j min(s_j, s) + min(B_l, N_l · s)) / C, the sum
        over the flows j of its own level (when it ends, those no larger than it have
        ended and the others have sent as much as it); B_l the bytes of earlier levels
        still queued at τ_l (the link drained as a work-conserving queue), N_l their
        number, each holding it back by at most s. Flows of later levels are not
        counted. A flow ends at its latest end over the links of its path, plus its
        path latency.
        Vectorized: one sort of each link's flows by (level, size) per call, prefix
        sums within each level (``slot``: (rows, width) pair ids per link)."""
        flat, start, live, taus = _start_levels(matrix, arrivals, k_max)
        if taus is None:
            return None, live
        every = bool(live.all())
        k = len(taus)
        size = np.zeros(len(flat) + 1)                          # the pad pair: 0 bytes
        size[:-1] = flat
        lev = np.full(len(flat) + 1, k)     # no bytes: a level of its own, sorted last
        if every:
            lev[:-1] = np.searchsorted(taus, start, side="right") - 1
        else:
            lev[:-1][live] = np.searchsorted(taus, start[live], side="right") - 1
        s_raw, l_raw = size.take(self.slot), lev.take(self.slot)
        order = (np.argsort(l_raw + s_raw * (0.5 / size[:-1].max()), axis=1)
                 + self.row_off).ravel()
        s_flat = s_raw.ravel().take(order)                       # by (level, size) per row
        lv = l_raw.ravel().take(order).reshape(s_raw.shape)
        rows, width = s_raw.shape
        cell = (self.row_idx * (k + 1) + lv).ravel()              # (row, level) of each entry
        cnt = np.bincount(cell, minlength=rows * (k + 1)).reshape(rows, k + 1)
        n_incl = np.cumsum(cnt, axis=1)
        # bytes before each entry (flat, all rows) and before each (row, level) group
        cz = np.zeros(len(s_flat) + 1)
        np.cumsum(s_flat, out=cz[1:])
        row0 = self.row_off[:, 0]
        at_end = cz.take(row0[:, None] + n_incl)                  # (rows, k+1)
        at_start = at_end - np.diff(at_end, axis=1, prepend=cz.take(row0)[:, None])
        # backlog of earlier levels at each τ_l: the link as a work-conserving queue,
        # busy until max over m < l of τ_m + (bytes of levels m..l-1) / C
        w = (at_start[:, :k] - at_start[:, :1]) * self.inv_cap      # (rows, k) seconds
        busy = np.maximum.accumulate(taus[None, :] - w, axis=1)[:, :-1] + w[:, 1:]
        backlog = np.zeros((rows, k + 1))
        backlog[:, 1:k] = np.maximum(0.0, busy - taus[None, 1:]) / self.inv_cap
        # per entry (flat): its level's bytes up to it, its level's flows after it, the
        # flows and queued bytes of the earlier levels
        same = cz[1:] - at_start.ravel().take(cell) \
            + s_flat * (n_incl.ravel().take(cell) - 1 - self.col_flat)
        n0 = (n_incl - cnt).ravel().take(cell)
        held = np.minimum(backlog.ravel().take(cell), n0 * s_flat)
        f = np.append(taus, np.inf).take(lv.ravel()) + (same + held) * self.inv_cap_flat
        f[lv.ravel() == k] = -np.inf
        back = np.empty(f.size)
        back[order] = f                                           # original slot order
        f_link = np.append(back, -np.inf)
        f_pair = f_link.take(self.pos_t[0])
        for row in self.pos_t[1:]:      # max over the hops of each pair's path
            np.maximum(f_pair, f_link.take(row), out=f_pair)
        return np.maximum(f_pair, start) + self.lat, live

    def pair_times(self, matrix: np.ndarray) -> np.ndarray:
        """(n, n) seconds until flow i→j is done under the link bound (0: no flow)."""
        flat = np.asarray(matrix, dtype=float).ravel()
        load = np.bincount(self.link, weights=flat[self.pair], minlength=self.n_links)
        t_link = load / self.cap
        t_pair = np.zeros(self.n * self.n)
        np.maximum.at(t_pair, self.pair, t_link[self.link])
        out = np.where(flat > 0, t_pair + self.lat, 0.0)
        return out.reshape(self.n, self.n)


class FastNetwork:
    """Link-bound times over ``topo`` (a :class:`moesim.topology.Topology`) for ranks
    mapped to ``gpus``; incidences and collective times are memoized per group."""

    def __init__(self, topo, gpus: Sequence[str], rank_host: Sequence[int],
                 coalesce_rtol: float = 0.0) -> None:
        self.topo = topo
        self.coalesce_rtol = coalesce_rtol   # the exact all-to-alls' flow network (0: exact)
        self.gpus = list(gpus)
        self.rank_host = list(rank_host)
        self._inc: dict[tuple[int, ...], _Incidence] = {}
        self._coll: dict[tuple, float] = {}
        self._p2p: dict[tuple[int, int], tuple[float, float]] = {}
        self._hosts: dict[tuple[int, ...], bool] = {}
        self._env = None     # simpy environment and FlowNetwork of exact_finish, lazily
        self._flow = None
        self.exact_ok = True  # False: over EXACT_FLOW_BUDGET, multi-host groups share per link
        self.held = flow_a2a.HeldSends()   # pipeline sends for the next exact_finish

    def incidence(self, group: Sequence[int]) -> _Incidence:
        inc = self._inc.get(group) if isinstance(group, tuple) else None
        if inc is None:
            key = tuple(int(r) for r in group)
            inc = self._inc.get(key)
            if inc is None:
                inc = self._inc[key] = _Incidence(self.topo, self.gpus, key)
        return inc

    def a2a_rank_times(self, group: Sequence[int], matrix: np.ndarray) -> np.ndarray:
        """Per member (group order): seconds from a common start until all of its
        sends and receives of a direct all-to-all-v with ``matrix`` are done."""
        t = self.incidence(group).pair_times(matrix)
        return np.maximum(t.max(axis=1), t.max(axis=0))

    def a2a_finish(self, group: Sequence[int], matrix: np.ndarray,
                   arrivals: np.ndarray) -> np.ndarray:
        """Per member: end of a direct all-to-all-v whose members arrive at ``arrivals``:
        flow by flow on the max-min network for groups over several hosts of at most
        ``EXACT_MAX_MEMBERS`` (:meth:`exact_finish`), else :meth:`_Incidence.finish`."""
        if len(group) > EXACT_MAX_MEMBERS or not self.exact_ok:
            return self.incidence(group).finish(matrix, arrivals)
        key = tuple(int(r) for r in group)
        if self._multi_host(key):
            return self.exact_finish(key, matrix, arrivals)
        return self.incidence(key).finish(matrix, arrivals)

    def ll_pair_finish(self, group: Sequence[int], tokens: np.ndarray, bd: float, bc: float):
        """A DeepEP low-latency dispatch and combine from (token, expert) messages
        ``tokens`` (n, n), starting together at 0, in one compiled call
        (:func:`moesim.engine.fast.jit_loops.ll_pair_ends`): (dispatch bytes, the combine's
        before its transpose, dispatch ends, combine ends), the same floats as two
        :meth:`a2a_finish` calls; None where those would not take that compiled bound."""
        if len(group) <= EXACT_MAX_MEMBERS and self.exact_ok:
            return None
        inc = self.incidence(group)
        mod = fast_kernels(_jit, JIT_AFTER_CALLS, eager=True)
        if inc.n <= SHARING_MAX_MEMBERS or mod is None:
            return None
        m_d, m_c = np.empty((inc.n, inc.n)), np.empty((inc.n, inc.n))
        ends = mod.ll_pair_ends(np.ascontiguousarray(tokens, dtype=np.int64), float(bd),   # type: ignore[attr-defined]
                                float(bc), inc.pad_t, inc.cap, inc.lat, 0.0, m_d, m_c)
        return m_d, m_c, *ends

    def stateless(self, group: Sequence[int]) -> bool:
        """Whether :meth:`a2a_finish` on ``group`` is a pure function of its arguments:
        :meth:`exact_finish` is not (its simpy clock moves on, so the same exchange
        may round differently later), so its calls can be neither skipped nor reused."""
        if len(group) > EXACT_MAX_MEMBERS or not self.exact_ok:
            return True
        return not self._multi_host(tuple(int(r) for r in group))

    def exact_flow_estimate(self, chains, moe_layers: int, microbatches: int) -> int:
        """Flows :meth:`exact_finish` would run in a step of ``chains`` (per chain the EP
        group of every stage), ``moe_layers`` MoE layers spread over the stages, each
        micro-batch timing four all-to-alls per layer (dispatch and combine, forward
        and backward) of at most n (n - 1) flows."""
        total = 0
        for groups in chains:
            per_stage = moe_layers / max(len(groups), 1)
            for g in groups:
                n = len(g)
                if n <= EXACT_MAX_MEMBERS and self._multi_host(tuple(int(r) for r in g)):
                    total += int(per_stage * microbatches * 4 * n * (n - 1))
        return total

    def _multi_host(self, group: tuple[int, ...]) -> bool:
        hit = self._hosts.get(group)
        if hit is None:
            hit = self._hosts[group] = len({self.rank_host[r] for r in group}) > 1
        return hit

    def exact_finish(self, group: Sequence[int], matrix: np.ndarray,
                     arrivals: np.ndarray) -> np.ndarray:
        """Per member: end of a direct all-to-all-v on the flow-level network, with the
        held pipeline sends it meets (:func:`moesim.engine.fast.flow_a2a.exact_finish`)."""
        return flow_a2a.exact_finish(self, group, matrix, arrivals)

    def hold_send(self, key: tuple, src: tuple[int, ...], dst: tuple[int, ...],
                  start: np.ndarray, end: np.ndarray, nbytes: float,
                  on_end: Callable[[np.ndarray], None] | None = None) -> None:
        """Hold a pipeline send for the next :meth:`exact_finish` of either group
        (:func:`moesim.engine.fast.flow_a2a.hold_send`)."""
        flow_a2a.hold_send(self, key, src, dst, start, end, nbytes, on_end)

    def phases_time(self, phases) -> float:
        """Seconds of phases run one after the other, each charged its link bound."""
        total = 0.0
        topo, gpus = self.topo, self.gpus
        cap, lat_all = np.asarray(topo.capacity_Bps, float), topo.latency_s
        seen: dict[tuple, float] = {}
        for ph in phases:
            sig = tuple(ph)
            hit = seen.get(sig)
            if hit is None:
                load: dict[int, float] = {}
                paths = []
                for s, d, b in ph:
                    path = topo.route(gpus[s], gpus[d])
                    paths.append((path, b))
                    for lk in path:
                        load[lk] = load.get(lk, 0.0) + b
                hit = 0.0
                for path, _b in paths:
                    if path:
                        t = max(load[lk] / cap[lk] for lk in path)
                        hit = max(hit, t + float(lat_all[list(path)].sum()))
                seen[sig] = hit
            total += hit
        return total

    def collective_time(self, op: str, group: Sequence[int], nbytes: float,
                        algo: str | None = None, matrix: np.ndarray | None = None) -> float:
        """Seconds of a phased collective (ring/tree/hierarchical) started together."""
        key = (op, tuple(group), float(nbytes), algo)
        hit = self._coll.get(key) if matrix is None else None
        if hit is None:
            hit = self.phases_time(expand(op, group, nbytes, algo=algo, matrix=matrix,
                                          rank_host=self.rank_host))
            if matrix is None:
                self._coll[key] = hit
        return hit

    def p2p_time(self, src: int, dst: int, nbytes: float, share: float = 1.0) -> float:
        """One flow on its path, with ``share`` - 1 equal flows on its bottleneck:
        latency + bytes × share / bottleneck capacity."""
        hit = self._p2p.get((src, dst))
        if hit is None:
            path = list(self.topo.route(self.gpus[src], self.gpus[dst]))
            if not path:
                hit = (0.0, np.inf)
            else:
                hit = (float(self.topo.latency_s[path].sum()),
                       float(np.asarray(self.topo.capacity_Bps, float)[path].min()))
            self._p2p[(src, dst)] = hit
        return 0.0 if not np.isfinite(hit[1]) else hit[0] + nbytes * share / hit[1]
