"""Who sends the teacher's outputs to whom, and how long the network takes.

A step's ``R = D x m`` sequences (``D`` data-parallel replicas of the student, ``m =
microbatches x micro_batch_size`` each) are dealt in contiguous blocks: student replica
``d`` trains on sequences ``[d·m, (d+1)·m)``, teacher group ``g`` (of ``G = gpus /
teacher_tp``) computes ``[g·q, (g+1)·q)`` with ``q = ceil(R / G)``. The loss runs on the
student's last pipeline stage: each of a replica's receivers there (its TP x CP ranks)
needs its vocabulary slice (full logits) or the top-k pairs whose index falls in it, of
its ``1 / cp`` of the tokens. Teacher rank ``j`` of ``tp_t`` holds vocabulary slice
``j``; it sends receiver ``i`` (of ``tp_s``) the part of its slice that overlaps the
receiver's: for full logits the logits there, for top-k that fraction of the pairs (the
pairs it holds in its own slice). The bytes add up to :func:`moesim.distill.outputs.
output_bytes` of the step's tokens.

A pair whose sender is its receiver (a colocated teacher whose group is the replica's
TP group) is read from HBM: no flow. Every other pair is one flow of the max-min flow
network (:class:`moesim.network.FlowNetwork`), all started together; the transfer lasts
until the last byte arrives (path latencies included).
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from moesim.network import FlowNetwork


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def receivers(layout) -> list[list[int]]:
    """Per student data-parallel replica: its last-stage ranks (TP x CP), TP-major."""
    c = layout.coords
    last = layout.pp - 1
    out = []
    for d in range(layout.dp):
        ranks = np.flatnonzero((c["dp"] == d) & (c["pp"] == last))
        out.append(sorted(int(r) for r in ranks))
    return out


def pair_bytes_matrix(layout, teacher_gpus: list[int], tp_t: int, seq_bytes: float,
                      m: int) -> dict[tuple[int, int], float]:
    """(teacher GPU, student GPU) -> bytes of one step; GPUs are indices into the
    topology's GPU list. ``seq_bytes``: the outputs of one sequence."""
    recv = receivers(layout)
    d_count = len(recv)
    total_rows = d_count * m
    groups = len(teacher_gpus) // tp_t
    q = math.ceil(total_rows / groups)
    tp_s = layout.tp
    c = layout.coords
    out: dict[tuple[int, int], float] = {}
    for g in range(groups):
        g0, g1 = g * q, min((g + 1) * q, total_rows)
        for d in range(d_count):
            rows = _overlap(g0, g1, d * m, (d + 1) * m)
            if rows <= 0:
                continue
            share = rows * seq_bytes / layout.cp
            for j in range(tp_t):
                src = teacher_gpus[g * tp_t + j]
                for r in recv[d]:
                    i = int(c["tp"][r])
                    f = _overlap(j / tp_t, (j + 1) / tp_t, i / tp_s, (i + 1) / tp_s)
                    if f > 0:
                        out[(src, r)] = out.get((src, r), 0.0) + share * f
    return out


def transfer(topo, pairs: dict[tuple[int, int], float]) -> dict:
    """Run the pairs' flows on ``topo``; local pairs are HBM reads. Returns seconds,
    bytes over the network and bytes read locally, flows and the busiest receiver's
    bytes."""
    local = sum(b for (s, d), b in pairs.items() if s == d)
    remote = [(s, d, b) for (s, d), b in pairs.items() if s != d and b > 0]
    per_dst: dict[int, float] = {}
    for (_s, d), b in pairs.items():
        per_dst[d] = per_dst.get(d, 0.0) + b
    time_s = 0.0
    if remote:
        env = simpy.Environment()
        net = FlowNetwork(env, topo)
        gpus = topo.gpus
        done = net.transfer_many([(gpus[s], gpus[d], b) for s, d, b in remote])
        env.run(until=done)
        time_s = float(env.now)
    return {"time_s": time_s, "network_bytes": float(sum(b for _s, _d, b in remote)),
            "hbm_bytes": float(local), "flows": len(remote),
            "max_received_bytes": max(per_dst.values(), default=0.0)}
