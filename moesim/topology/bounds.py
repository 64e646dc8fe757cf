"""Sanity bounds on the numbers a topology is made of, and the largest cluster this
simulator builds (measured, see MAX_GPUS).

These are not hardware figures: they keep a typo (``1e300``, a missing decimal
point) from reaching the flow solver, where it would overflow float arithmetic or
exhaust memory, and say so in one line before anything is built.
"""

from __future__ import annotations

import math
from typing import Any

from moesim.errors import InputError

#: Largest link rate accepted, GB/s per direction: 10^9 GB/s = 10^18 bytes/s, six
#: orders above any link a GPU cluster has, small enough that bytes / rate and
#: rate * seconds stay far from float overflow.
MAX_LINK_GBPS = 1e9
#: Largest per-link latency accepted, µs: one second (10^6 µs) per hop.
MAX_LINK_LATENCY_US = 1e6
#: Most GPUs a topology routed from its structure may have (nodes x GPUs per node): 2^17.
#: Measured on a shared 2-core machine (benchmarks/bench_topology_scale.py,
#: docs/results/topology-scale.md, load average about 8): building the graph, the link
#: arrays and the structural router of a three-tier rail-optimized fabric grows linearly
#: with the GPUs: superpod-h100-16k (16,384 GPUs, 139,264 links) 0.7 s CPU, 0.11 GB of
#: Python heap (0.22 GB resident); 32,768 GPUs 1.6 s, 0.23 GB; superpod-h100-100k
#: (100,000 GPUs, 1,107,520 links) 5.4 s, 0.85 GB (1.03 GB resident); 131,072 GPUs
#: (1,572,864 links) 7.8 s, 1.22 GB (1.43 GB resident); 10^5 routes 0.3-0.9 s at any
#: size. The topology no longer bounds a step; past 2^17 GPUs nothing has been measured
#: (nor the layout and engines above it), so a larger cluster is refused rather than
#: left to run for an unknown time and memory (docs/scenarios.md, "Size limits").
MAX_GPUS = 131072
#: Most GPUs of a topology routed by graph search (explicit graphs, PCIe trees, NICs on
#: PCIe switches: moesim.topology.link_routing.GraphRouter, one Dijkstra per
#: destination): on the 8,192-GPU dgx-h100 fabric (114,688 links) one destination's tree
#: took 36 ms CPU on the shared 2-core machine, so a step that reaches every GPU builds
#: 8,192 trees in about 5 minutes; twice the GPUs (and links) would take four times that.
MAX_SEARCHED_GPUS = 8192


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def check_bandwidth(v: Any, source: str, field: str) -> float:
    """A link rate in GB/s: a finite number in (0, MAX_LINK_GBPS]."""
    if not _number(v) or not math.isfinite(v) or not 0 < v <= MAX_LINK_GBPS:
        raise InputError(source, field, f"a bandwidth > 0 and <= {MAX_LINK_GBPS:.0e} GB/s", v)
    return float(v)


def check_latency(v: Any, source: str, field: str) -> float:
    """A per-link latency in µs: a finite number in [0, MAX_LINK_LATENCY_US]."""
    if not _number(v) or not math.isfinite(v) or not 0 <= v <= MAX_LINK_LATENCY_US:
        raise InputError(source, field, f"a latency >= 0 and <= {MAX_LINK_LATENCY_US:.0e} µs "
                         "(one second)", v)
    return float(v)


def check_efficiency(v: Any, source: str, field: str) -> float:
    """Achievable / line rate: a number in (0, 1]."""
    if not _number(v) or not 0 < v <= 1:
        raise InputError(source, field, "an efficiency in (0, 1]", v)
    return float(v)


def check_gpus(n_gpus: int, source: str, field: str, got: Any, searched: bool = False) -> None:
    """Refuse a cluster over MAX_GPUS (MAX_SEARCHED_GPUS when routed by graph search)
    before it is built."""
    limit = MAX_SEARCHED_GPUS if searched else MAX_GPUS
    if n_gpus > limit:
        why = ("routes found by graph search, one per destination" if searched
               else "the largest cluster whose cost was measured")
        raise InputError(source, field, f"at most {limit} GPUs in the cluster ({n_gpus} "
                         f"asked: {why}; docs/scenarios.md, Size limits)", got)
