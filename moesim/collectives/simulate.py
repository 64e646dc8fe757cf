"""Simulate one collective on a topology: ``simulate_collective`` (the CLI's engine)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from moesim.collectives.algorithms import check_matrix, check_op_algo
from moesim.collectives.communicator import CollectiveRecord, CollectiveSpec, Communicator
from moesim.collectives.cost import algbw_Bps, bus_factor, effective_size
from moesim.errors import InputError

MODELS = ("flow", "analytical")


def rank_hosts(topo: Any) -> list[int]:
    """Node index (0, 1, ... in order of first appearance) of every rank of ``topo``."""
    index: dict[Any, int] = {}
    return [index.setdefault(topo.host_of(g), len(index)) for g in topo.gpus]


def make_network(env: simpy.Environment, topo: Any, model: str) -> Any:
    """The network model named ``model`` over ``topo``'s links."""
    if model == "flow":
        from moesim.network import FlowNetwork
        return FlowNetwork(env, topo)
    if model == "analytical":
        from moesim.network import AnalyticalNetwork
        return AnalyticalNetwork(env, topo)
    raise InputError("collective", "model", "one of " + ", ".join(MODELS), model)


def simulate_collective(topo: Any, op: str, nbytes: float = 0.0, algo: str | None = None,
                        ranks: Sequence[int] | None = None, model: str = "flow",
                        matrix: np.ndarray | Sequence[Sequence[float]] | None = None,
                        root: int | None = None, nccl: Any = None) -> dict:
    """Run one collective with every member arriving at t = 0.

    ``nccl``: price it as the engines do with ``overlap.nccl_tuning``
    (:class:`moesim.collectives.nccl.choice.NcclTuning`; default None: the flow network's
    phases with their link latencies).

    ``op`` all_to_all with a ``matrix`` becomes all_to_all_v. Returns a JSON-able dict:
    op, algo, ranks, n, bytes (nccl-tests S), time_s, algbw_GBps, busbw_GBps, model,
    flows (point-to-point transfers started), solves (rate re-computations of the flow
    model, 0 for the analytical one), link_bytes_max and wall_s.
    """
    if op == "all_to_all" and matrix is not None:
        op = "all_to_all_v"
    algo = check_op_algo(op, algo)
    n_world = len(topo.gpus)
    group = tuple(range(n_world)) if ranks is None else tuple(int(r) for r in ranks)
    for r in group:
        if not 0 <= r < n_world:
            raise InputError("collective", "ranks", f"ranks in 0..{n_world - 1}", r)
    if len(set(group)) != len(group) or not group:
        raise InputError("collective", "ranks", "a non-empty list of distinct ranks", group)
    if op == "send_recv" and len(group) != 2:
        raise InputError("collective", "ranks", "exactly two ranks (src, dst) for send_recv",
                         group)
    if op == "all_to_all_v":
        matrix = check_matrix(matrix, len(group))
    if not np.isfinite(nbytes) or nbytes < 0:
        raise InputError("collective", "bytes", "a finite size >= 0", nbytes)
    hosts = rank_hosts(topo)
    if algo == "hierarchical":  # validate the layout before building the network
        from moesim.collectives.algorithms import node_layout
        node_layout(group, hosts)

    wall0 = time.perf_counter()
    env = simpy.Environment()
    net = make_network(env, topo, model)
    comm = Communicator(env, _Counting(net), topo.gpus, rank_host=hosts, nccl=nccl)
    spec = CollectiveSpec(op, group, nbytes=float(nbytes), matrix=matrix, algo=algo, root=root)
    events = [comm.join("collective", r, spec) for r in group]
    env.run()
    records: list[CollectiveRecord] = [ev.value for ev in events]
    t = max((rec.end_s for rec in records), default=0.0)
    n = len(group)
    size = effective_size(op, n, nbytes, matrix)
    alg = algbw_Bps(size, t)
    lb = np.asarray(net.link_bytes(), dtype=float)
    return {
        "op": op, "algo": algo, "ranks": list(group), "n": n, "bytes": size,
        "time_s": t, "algbw_GBps": alg / 1e9, "busbw_GBps": alg * bus_factor(op, n) / 1e9,
        "model": model, "flows": comm.network.flows,
        "solves": int(getattr(net, "n_solves", 0)),  # max-min re-solves (flow model)
        "link_bytes_max": float(lb.max()) if lb.size else 0.0,
        "wall_s": time.perf_counter() - wall0,
    }


class _Counting:
    """Wraps a network model to count the point-to-point flows started."""

    def __init__(self, net: Any) -> None:
        self.net = net
        self.env = net.env
        self.flows = 0

    def transfer(self, src: str, dst: str, nbytes: float, key: int = 0, tag: Any = None):
        self.flows += 1
        return self.net.transfer(src, dst, nbytes, key=key, tag=tag)

    def transfer_many(self, flows, key: int = 0, tag: Any = None, **kw):
        self.flows += len(flows)
        return self.net.transfer_many(flows, key=key, tag=tag, **kw)

    def link_bytes(self) -> np.ndarray:
        return self.net.link_bytes()
