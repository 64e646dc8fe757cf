"""The simpy side of collectives: members join, data moves through a network model.

Every member of a collective calls :meth:`Communicator.join` with the same hashable
``key`` (e.g. ``("ep_dispatch", layer, microbatch, group_index)``) and the same
:class:`CollectiveSpec`. The returned event succeeds, for that rank, when that rank's
part is done; its value is a :class:`CollectiveRecord`.

Start rules:

* ring / tree / hierarchical collectives and send_recv start when every member has
  arrived, then run their phases (:mod:`moesim.collectives.algorithms`) one after
  the other, each phase through ``network.transfer_many``; a rank is done at the end
  of the last phase in which it sends or receives.
* with ``nccl`` (:class:`moesim.collectives.nccl.choice.NcclTuning`, the scenario's
  ``overlap.nccl_tuning``), a ring collective NCCL would run with another protocol or
  algorithm than ring/Simple holds NCCL's latency term first, then runs its phases with
  bytes / the protocol's efficiency and no link latency
  (:mod:`moesim.collectives.nccl.choice`).
* a ``direct`` all_to_all(_v) works pairwise like NCCL grouped send/recv: the transfer
  i→j starts once both i and j have arrived; a rank is done when all its sends and
  receives are delivered. Its relevant peers are those it exchanges nonzero bytes with.

A communicator belongs to one run; it holds no global state.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from moesim.collectives import ep_exchange
from moesim.collectives.algorithms import (
    Phase,
    check_matrix,
    check_op_algo,
    default_algo,
    expand,
    uniform_matrix,
)


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective. ``group``: global ranks (send_recv: ``(src, dst)``); ``nbytes``:
    bytes in the nccl-tests sense (see algorithms); ``matrix``: source × destination
    bytes for all_to_all_v, indexed by position in ``group``; ``algo`` None = default;
    ``root``: global rank for broadcast (default group[0])."""

    op: str
    group: tuple[int, ...]
    nbytes: float = 0.0
    matrix: Any = field(default=None, compare=False, repr=False)
    algo: str | None = None
    root: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "group", tuple(int(r) for r in self.group))
        object.__setattr__(self, "algo", check_op_algo(self.op, self.algo))
        if self.matrix is not None:
            m = check_matrix(self.matrix, len(self.group)).copy()
            m.setflags(write=False)
            object.__setattr__(self, "matrix", m)

    def byte_matrix(self) -> np.ndarray:
        """Source × destination bytes of an all_to_all(_v)."""
        if self.op == "all_to_all":
            return uniform_matrix(len(self.group), self.nbytes)
        return check_matrix(self.matrix, len(self.group))


@dataclass(frozen=True)
class CollectiveRecord:
    """What one rank saw of one collective. Times in seconds of simulated time."""

    rank: int
    arrivals: dict[int, float]   # when each member joined (so far, for direct all-to-all)
    start_s: float               # when this rank's data could start moving (arrival + wait_s)
    end_s: float                 # when this rank's part was done
    blocking_rank: int           # the member whose late arrival this rank waited for, or -1
    wait_s: float                # max(0, latest relevant peer arrival - own arrival)


@dataclass
class _State:
    spec: CollectiveSpec
    events: dict[int, simpy.Event] = field(default_factory=dict)
    arrivals: dict[int, float] = field(default_factory=dict)
    order: dict[int, int] = field(default_factory=dict)     # join order, to break ties
    pending: dict[int, int] = field(default_factory=dict)   # direct: undelivered flows per rank
    peers: dict[int, set[int]] = field(default_factory=dict)  # direct: nonzero partners
    matrix: np.ndarray | None = None
    frozen: dict[int, float] | None = None  # last snapshot of arrivals handed out
    done: int = 0
    pos: dict[int, int] | None = None      # direct: group position of each rank
    out: list[list[tuple[int, float]]] | None = None   # direct: (j, bytes) i sends, by i
    into: list[list[tuple[int, float]]] | None = None  # direct: (i, bytes) j receives, by j


class Communicator:
    """Runs collectives among ``gpus`` (``gpus[rank]`` is the GPU name) on ``network``."""

    def __init__(self, env: simpy.Environment, network: Any, gpus: Sequence[str],
                 rank_host: Sequence[int] | None = None, nccl: Any = None) -> None:
        self.env = env
        self.nccl = nccl if rank_host is not None else None
        self.network = network
        self.gpus = list(gpus)
        self.rank_host = None if rank_host is None else [int(h) for h in rank_host]
        self._active: dict[Hashable, _State] = {}
        # a network that can call back at delivery without a per-flow event (FlowNetwork)
        self._send = getattr(network, "send", None)

    # ------------------------------------------------------------ public
    def join(self, key: Hashable, rank: int, spec: CollectiveSpec) -> simpy.Event:
        """Rank ``rank`` arrives at collective ``key``; returns its completion event."""
        st = self._active.get(key)
        if st is None:
            st = self._active[key] = self._new_state(spec)
        elif st.spec != spec:
            raise ValueError(f"collective {key!r}: rank {rank} joined with {spec}, "
                             f"others with {st.spec}")
        if rank not in spec.group:
            raise ValueError(f"collective {key!r}: rank {rank} is not in group {spec.group}")
        if rank in st.events:
            raise ValueError(f"collective {key!r}: rank {rank} joined twice")
        ev = self.env.event()
        st.events[rank] = ev
        st.arrivals[rank] = self.env.now
        st.order[rank] = len(st.order)
        if st.matrix is not None:
            self._join_direct(key, st, rank)
        elif len(st.events) == len(spec.group):
            if spec.op == "ep_exchange":
                self.env.process(ep_exchange.run(self, key, st))
            else:
                self.env.process(self._run_phased(key, st))
        return ev

    # ------------------------------------------------------------ helpers
    def _new_state(self, spec: CollectiveSpec) -> _State:
        bad = [r for r in spec.group if not 0 <= r < len(self.gpus)]
        if bad:
            raise ValueError(f"ranks {bad} out of range 0..{len(self.gpus) - 1}")
        st = _State(spec)
        if spec.op == "ep_exchange":       # a planned DeepEP exchange: starts when all arrive
            return st
        if spec.op in ("all_to_all", "all_to_all_v") and spec.algo == "direct":
            m = spec.byte_matrix()
            st.matrix = m
            g = spec.group
            n = len(g)
            nz = (m > 0) & ~np.eye(n, dtype=bool)
            src, dst = np.nonzero(nz)                   # row-major: by sender, then receiver
            vals = m[src, dst].tolist()
            out: list[list[tuple[int, float]]] = [[] for _ in range(n)]
            into: list[list[tuple[int, float]]] = [[] for _ in range(n)]
            for i, j, b in zip(src.tolist(), dst.tolist(), vals, strict=True):
                out[i].append((j, b))
                into[j].append((i, b))
            st.out, st.into = out, into
            st.pos = {r: i for i, r in enumerate(g)}
            for i, r in enumerate(g):
                partners = sorted({j for j, _ in out[i]} | {j for j, _ in into[i]})
                st.peers[r] = {g[j] for j in partners}
                st.pending[r] = len(out[i]) + len(into[i])
        return st

    def _record(self, st: _State, rank: int, relevant: Sequence[int], end: float) -> Any:
        own = st.arrivals[rank]
        if st.frozen is None or len(st.frozen) != len(st.arrivals):
            st.frozen = dict(st.arrivals)  # shared by records until another member arrives
        late = max(relevant, key=lambda r: (st.arrivals[r], st.order[r]), default=None)
        wait = 0.0
        blocking = -1
        if late is not None and st.arrivals[late] > own:
            wait = st.arrivals[late] - own
            blocking = late
        return CollectiveRecord(rank=rank, arrivals=st.frozen, start_s=own + wait,
                                end_s=end, blocking_rank=blocking, wait_s=wait)

    def _finish(self, key: Hashable, st: _State, rank: int, relevant: Sequence[int]) -> None:
        st.events[rank].succeed(self._record(st, rank, relevant, self.env.now))
        st.done += 1
        if st.done == len(st.spec.group):
            del self._active[key]

    def _phases(self, spec: CollectiveSpec, scale: float = 1.0) -> list[Phase]:
        return expand(spec.op, spec.group, spec.nbytes * scale, algo=spec.algo,
                      root=spec.root, matrix=spec.matrix, rank_host=self.rank_host)

    def _tuned(self, spec: CollectiveSpec):
        """NCCL's choice for ``spec`` where it changes the pricing, else None."""
        if self.nccl is None or spec.algo != default_algo(spec.op):
            return None
        return self.nccl.for_group(spec.op, spec.group, spec.nbytes, self.rank_host)

    def _run_phased(self, key: Hashable, st: _State):
        spec = st.spec
        tuned = self._tuned(spec)
        phases = self._phases(spec, 1.0 if tuned is None else 1.0 / tuned.bw_efficiency)
        last = {r: -1 for r in spec.group}
        for i, phase in enumerate(phases):
            for s, d, _ in phase:
                last[s] = last[d] = i
        others = list(spec.group)
        for r in spec.group:
            if last[r] < 0:
                self._finish(key, st, r, others)
        if tuned is not None and phases:
            yield self.env.timeout(tuned.latency_s)
        for i, phase in enumerate(phases):
            flows = [(self.gpus[s], self.gpus[d], b) for s, d, b in phase]
            if tuned is None:
                yield self.network.transfer_many(flows, tag=key)
            else:   # NCCL's latency term replaces the links'
                yield self.network.transfer_many(flows, tag=key, latency=False)
            for r in spec.group:
                if last[r] == i:
                    self._finish(key, st, r, others)

    def _join_direct(self, key: Hashable, st: _State, rank: int) -> None:
        g = st.spec.group
        assert st.pos is not None and st.out is not None and st.into is not None
        i = st.pos[rank]
        arrived = st.events
        # the flows with every partner already here, in group order of the partner:
        # i -> p before p -> i (as a walk over the group would start them)
        sends = {j: b for j, b in st.out[i] if g[j] in arrived and j != i}
        recvs = {j: b for j, b in st.into[i] if g[j] in arrived and j != i}
        for j in sorted(sends.keys() | recvs.keys()):
            p = g[j]
            b = sends.get(j)
            if b is not None:
                self._start_flow(key, st, rank, p, b)
            b = recvs.get(j)
            if b is not None:
                self._start_flow(key, st, p, rank, b)
        if st.pending[rank] == 0:
            self._finish(key, st, rank, ())

    def _start_flow(self, key: Hashable, st: _State, src: int, dst: int, nbytes: float) -> None:
        def delivered(_ev: simpy.Event | None = None) -> None:
            for r in (src, dst):
                st.pending[r] -= 1
                if st.pending[r] == 0:
                    self._finish(key, st, r, sorted(st.peers[r]))

        if self._send is not None:   # no per-flow event: the callback runs at delivery
            self._send(self.gpus[src], self.gpus[dst], nbytes, delivered)
            return
        ev = self.network.transfer(self.gpus[src], self.gpus[dst], nbytes, tag=key)
        if ev.callbacks is None:  # already processed
            delivered()
        else:
            ev.callbacks.append(delivered)
