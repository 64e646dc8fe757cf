"""Kernel time of an :class:`~moesim.ep.plan.EpPlan` on a topology (pure numpy).

Model
-----
* **Links.** All flows of all stages start together (DeepEP's RDMA and NVLink stages
  run concurrently, chunk by chunk) and share the topology's links max-min fairly
  (:func:`moesim.network.maxmin.maxmin_rates`), re-solved whenever a flow ends, so
  a skewed exchange sees link contention. A rank's network time is the end of the
  last flow it sends or receives, plus the longest path latency of each stage.
* **Pipeline fill/drain.** One chunk per channel of each stage
  (``EpPlan.fill_drain``) at the channel's share of that medium's rate (the rate of
  the rank's own NIC, resp. NVLink port, divided by ``sms / 2`` channels).
* **SMs.** A rank's SMs copy ``sm_write_bytes``; each SM writes at most
  :data:`SM_WRITE_BPS`, so the kernel takes at least ``sm_write_bytes / (sms ·
  SM_WRITE_BPS)``. A rank's kernel time is the larger of its network time and that
  bound, plus fill/drain.
* **Notify.** Before a normal dispatch, ``latency`` counts of one-way RDMA and
  NVLink latencies (of the topology's paths) and kernel launches / host syncs (the
  device's launch overhead) make ``notify_s``; it is reported apart from the
  kernel time because DeepEP's tests time the dispatch kernel alone
  (``bench_kineto(..., ('dispatch', 'notify'))`` in ``tests/legacy/test_internode.py``).

Bandwidth as DeepEP reports it: ``rdma_GBps = rdma_bytes_per_rank / time_s`` and
``nvl_GBps = nvl_bytes_per_rank / time_s``, the bytes a rank logically moves over
that medium (its own node's / own GPU's share included), taken for the rank with the
longest time ("bottleneck bandwidth", deepseek-ai/DeepEP README and
tests/legacy/test_internode.py, test_intranode.py, test_low_latency.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moesim.ep.plan import EpPlan
from moesim.network.maxmin import maxmin_pairs

#: per-SM write bandwidth, bytes/s: 50 GB/s on SM90, the figure DeepEP's own SM-count
#: model uses (deepseek-ai/DeepEP deep_ep/buffers/elastic.py, get_theoretical_num_sms,
#: ``sm_write_gbs: float = 50``; reads: ``sm_read_gbs = 200``, never the bound here as
#: every byte an SM writes it read once)
SM_WRITE_BPS = 50e9
#: relative slack under which flows ending together are retired in one event (exact)
END_RTOL = 1e-9
#: the slack :func:`time_plan` uses: ends at most 0.1 % of the kernel time early
COALESCE_RTOL = 1e-3


@dataclass(frozen=True, eq=False)
class EpTiming:
    time_s: float               # kernel time (the slowest rank), notify excluded
    notify_s: float             # count exchange + host sync before a normal dispatch
    rank_time_s: np.ndarray     # (S,) each rank's kernel time
    rank_net_s: np.ndarray      # (S,) network part
    rank_sm_s: np.ndarray       # (S,) SM-throughput bound
    fill_drain_s: float
    flows: int
    solves: int


def flow_finish_times(paths: Sequence[Sequence[int]], nbytes: np.ndarray,
                      capacity_Bps: np.ndarray, rtol: float = END_RTOL) -> tuple[np.ndarray, int]:
    """End time of each flow when all start at t = 0 and share links max-min fairly.

    After each solve the flows due to end within ``rtol · T`` of the first end retire
    together, T the busiest link's bytes / capacity (a lower bound of the makespan):
    each flow ends at most that much early and its unsent tail is dropped
    (:data:`END_RTOL` is exact up to rounding; :data:`COALESCE_RTOL` trades a measured
    error for far fewer solves when thousands of flows end at distinct times).
    Returns (finish times in s, number of max-min solves); a flow with no links
    (same GPU) ends at 0."""
    rem = np.asarray(nbytes, dtype=float).copy()
    n = rem.shape[0]
    finish = np.zeros(n)
    lens = np.array([len(p) for p in paths], dtype=np.int64)
    pair_flow = np.repeat(np.arange(n, dtype=np.int64), lens)
    pair_link = np.fromiter((lk for p in paths for lk in p), dtype=np.int64,
                            count=int(lens.sum()))
    alive = (rem > 0) & (lens > 0)
    cap = np.asarray(capacity_Bps, dtype=float)
    load = np.bincount(pair_link, weights=rem[pair_flow], minlength=cap.shape[0])
    used = load > 0
    window = rtol * float((load[used] / cap[used]).max(initial=0.0))
    t, solves = 0.0, 0
    while alive.any():
        keep = alive[pair_flow]
        ids = np.flatnonzero(alive)
        local = np.cumsum(alive) - 1          # flow id -> position among the alive
        rate = maxmin_pairs(local[pair_flow[keep]], pair_link[keep], ids.size, capacity_Bps)
        solves += 1
        left = rem[ids] / rate
        dt = float(left.min())
        done = left <= dt + window
        t += dt
        rem[ids] -= rate * dt
        finish[ids[done]] = t
        rem[ids[done]] = 0.0
        alive[ids[done]] = False
    return finish, solves


def time_plan(plan: EpPlan, topo: Any, gpus: Sequence[str], launch_s: float,
              rtol: float = COALESCE_RTOL) -> EpTiming:
    """Kernel time of ``plan`` with EP rank i on GPU ``gpus[i]`` of ``topo`` (flows
    retire with slack ``rtol``, see :func:`flow_finish_times`)."""
    n = plan.ranks
    flows = [(s, d, b, st.name) for st in plan.stages for s, d, b in st.flows]
    paths = [topo.route(gpus[s], gpus[d]) for s, d, _b, _n in flows]
    finish, solves = flow_finish_times(paths, np.array([f[2] for f in flows]),
                                       topo.capacity_Bps, rtol)
    lat = {st.name: max((float(topo.latency_s[list(p)].sum())
                         for (_s, _d, _b, name), p in zip(flows, paths, strict=True)
                         if name == st.name), default=0.0) for st in plan.stages}
    net = np.zeros(n)
    for (s, d, _b, _name), f in zip(flows, finish, strict=True):
        net[s] = max(net[s], f)
        net[d] = max(net[d], f)
    net += sum(lat.values()) * (net > 0)
    sm = plan.sm_write_bytes / (plan.sms * SM_WRITE_BPS) if plan.sms else np.zeros(n)
    nic, nvl = medium_rates(topo, gpus)
    chan = max(plan.sms // 2, 1)
    fill = sum(b * chan / (nic if m == "rdma" else nvl) for m, b in plan.fill_drain)
    busy = (net > 0) | (sm > 0)
    rank_t = (np.maximum(net, sm) + fill) * busy
    hop = path_latencies(topo, gpus)
    notify = (plan.latency["rdma_hops"] * hop["rdma"] + plan.latency["nvl_hops"] * hop["nvl"]
              + plan.latency["launches"] * launch_s)
    return EpTiming(float(rank_t.max(initial=0.0)), float(notify), rank_t, net, sm,
                    float(fill), len(flows), solves)


def medium_rates(topo: Any, gpus: Sequence[str]) -> tuple[float, float]:
    """(NIC rate, NVLink rate) of the first EP GPU, bytes/s: the bottleneck link of its
    path to a GPU on another node (resp. the same node); inf where there is none."""
    ends = _probe_peers(topo, gpus)
    out = []
    for peer in ends:
        p = list(topo.route(gpus[0], peer)) if peer is not None else []
        out.append(float(topo.capacity_Bps[p].min()) if p else float("inf"))
    return out[0], out[1]


def path_latencies(topo: Any, gpus: Sequence[str]) -> dict[str, float]:
    """One-way latency (s) from the first EP GPU to a GPU on another node with the
    same local index ("rdma") and to another GPU of its node ("nvl")."""
    remote, local = _probe_peers(topo, gpus)
    out = {}
    for name, peer in (("rdma", remote), ("nvl", local)):
        p = list(topo.route(gpus[0], peer)) if peer is not None else []
        out[name] = float(topo.latency_s[p].sum()) if p else 0.0
    return out


def _probe_peers(topo: Any, gpus: Sequence[str]) -> tuple[str | None, str | None]:
    g0 = gpus[0]
    h0, l0 = topo.host_of(g0), topo.local_of(g0)
    remote = next((g for g in gpus if topo.host_of(g) != h0 and topo.local_of(g) == l0), None)
    if remote is None:
        remote = next((g for g in topo.gpus if topo.host_of(g) != h0
                       and topo.local_of(g) == l0), None)
    local = next((g for g in gpus if g != g0 and topo.host_of(g) == h0), None)
    return remote, local
