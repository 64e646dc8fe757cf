"""One DeepEP-style expert-parallel exchange as a collective (the exact engine's side).

:class:`EPExchangeSpec` carries a planned dispatch or combine
(:func:`moesim.ep.plan.plan_ep_exchange`): the flows of its RDMA and NVLink stages, the
SMs its kernels hold, and the per-rank bounds the links do not give. The
:class:`~moesim.collectives.communicator.Communicator` runs it when every member has
arrived (a normal dispatch starts with the group-wide count exchange, DeepEP
``notify_dispatch``; the low-latency kernels are launched by every rank in the same
step): after ``notify_s`` all flows of all stages start together (the stages are a
chunked pipeline, not phases) and a rank is done at
``max(its last flow delivered, start + sm_s[rank]) + fill_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class EPExchangeSpec:
    """``group``: global ranks, EP rank i = ``group[i]``; ``matrix[i, j]``: bytes EP rank i
    sends EP rank j, all stages together (RDMA and NVLink pairs never coincide);
    ``sm_s[i]``: the SM-throughput bound of rank i
    (seconds); ``fill_s``: pipeline fill and drain; ``notify_s``: the count exchange and
    host sync before the data moves (0 for combine and the low-latency kernels)."""

    group: tuple[int, ...]
    kernel: str
    ep_op: str                                   # ep_dispatch | ep_combine
    matrix: Any = field(compare=False, repr=False)
    sm_s: Any = field(compare=False, repr=False)
    fill_s: float = 0.0
    notify_s: float = 0.0
    sms: int = 0
    op: str = "ep_exchange"

    def byte_matrix(self) -> np.ndarray:
        """Bytes between EP ranks, all stages together."""
        return self.matrix


def run(comm, key, st):
    """simpy process: the exchange of ``st.spec`` once every member has arrived."""
    spec: EPExchangeSpec = st.spec
    env = comm.env
    if spec.notify_s > 0:
        yield env.timeout(spec.notify_s)
    start = env.now
    g = spec.group
    pending = {r: 0 for r in g}
    events = []
    src, dst = np.nonzero(spec.matrix)
    for s, d, b in zip(src.tolist(), dst.tolist(), spec.matrix[src, dst].tolist(), strict=True):
        ev = comm.network.transfer(comm.gpus[g[s]], comm.gpus[g[d]], b, tag=key)
        pending[g[s]] += 1
        pending[g[d]] += 1
        events.append((ev, g[s], g[d]))
    pos = {r: i for i, r in enumerate(g)}
    others = list(g)

    def done(r: int) -> None:    # r's flows are delivered: its SM bound, then fill/drain
        t = max(env.now, start + float(spec.sm_s[pos[r]])) + spec.fill_s
        ev = env.timeout(t - env.now)
        ev.callbacks.append(lambda _e: comm._finish(key, st, r, others))

    def delivered(src: int, dst: int) -> None:
        for r in (src, dst):
            pending[r] -= 1
            if pending[r] == 0:
                done(r)

    for r in g:
        if pending[r] == 0:
            done(r)
    for ev, src, dst in events:
        if ev.callbacks is None:
            delivered(src, dst)
        else:
            ev.callbacks.append(lambda _e, s=src, d=dst: delivered(s, d))
