"""Sanity bounds on the numbers a topology is made of, and the largest cluster this
simulator builds.

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
#: Most GPUs a topology may have (nodes x GPUs per node). Measured with the fast path
#: (the cheaper engine) on a 4-layer, 4-micro-batch slice of DeepSeek-V3 on a shared
#: 2-core machine: 2,048 GPUs 4.8 s and 0.29 GB (docs/fast-path.md), 4,096 GPUs 10.4 s
#: and 0.43 GB, 8,192 GPUs 38.9 s and 1.35 GB: time and memory grow about 3x per
#: doubling, so beyond 8,192 GPUs even a small slice takes minutes and several GB, and
#: a full model hours (docs/scenarios.md, "Size limits").
MAX_GPUS = 8192


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


def check_gpus(n_gpus: int, source: str, field: str, got: Any) -> None:
    """Refuse a cluster over MAX_GPUS before it is built."""
    if n_gpus > MAX_GPUS:
        raise InputError(source, field, f"at most {MAX_GPUS} GPUs in the cluster ({n_gpus} "
                         "asked: beyond that one simulated step needs more time and memory "
                         "than one machine has; docs/scenarios.md, Size limits)", got)
