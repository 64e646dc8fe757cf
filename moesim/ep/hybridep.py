"""HybridEP's dispatch and combine priced from its published H100 rates (pure).

HybridEP (NVIDIA's kernels in deepseek-ai/DeepEP's ``hybrid_ep`` branch; Megatron-Core's
``moe_flex_dispatcher_backend: hybridep``) moves the same copies as DeepEP's normal
kernels, one RDMA copy per (token, node) and NVLink forwarding per (token, GPU), but
copies with TMA instructions on a few SMs instead of through the SMs' loads and stores
(deepseek-ai/DeepEP ``docs/README_Hybrid-EP.md``). Its kernels are not modelled here
instruction by instruction; their published rates are used instead:

:data:`H100_GBPS` is the README's H100 table at 41cad944 ("HybridEP Performance Results
(IB Bandwidth in GB/s)": 4096 tokens a rank, hidden 7168, top-8, random uniform routing,
8 local experts, 4/8/16 SMs, 16/32/64 ranks), the torch API columns, which are what
Megatron-Core calls. Its benchmark counts a rank's bytes as DeepEP's tests do
(``tests/test_hybrid_ep.py``, ``count_rdma_send_from_routing_map``): the rank's
(token, node) copies, its own node included, at ``2·H`` bytes each in BF16 and
``2·H·(1 + 4/128)/2`` in FP8 (the test's ``fp8_factor``). So a rank's exchange takes at
least :func:`bound_s` = its copies' bytes / the published rate, the rate the benchmark
measured for the whole exchange (its NVLink forwarding included) under the same count.

Between the published points the rate is interpolated linearly in log2(ranks) and in
SMs; from 16 SMs up the 16-SM row is used (the README stops there, and its rates level
off from 8 SMs); below 4 SMs, or outside 16-64 ranks of 8 GPUs a node on H100, there is
no published rate and the kind is refused. The benchmark's hidden size is 7168: at a
smaller hidden size the per-token costs weigh more, so its rate is an upper bound there
and the times a lower bound (docs/deepep.md).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from moesim.errors import InputError

#: published H100 rates, GB/s, torch API: (ranks, SMs) -> (dispatch FP8, dispatch BF16,
#: combine BF16). deepseek-ai/DeepEP docs/README_Hybrid-EP.md at 41cad944, "H100 Platform"
H100_GBPS: dict[tuple[int, int], tuple[float, float, float]] = {
    (16, 4): (28.09, 37.08, 42.47),
    (16, 8): (44.87, 57.74, 56.96),
    (16, 16): (48.26, 54.47, 53.35),
    (32, 4): (32.58, 44.88, 43.60),
    (32, 8): (41.23, 46.54, 50.68),
    (32, 16): (42.10, 47.36, 52.53),
    (64, 4): (30.42, 40.63, 41.00),
    (64, 8): (35.71, 41.46, 47.68),
    (64, 16): (35.01, 41.24, 46.57),
}
RANKS = (16, 32, 64)
SMS = (4, 8, 16)
#: GPUs a node held in the published runs (DGX H100; the README does not say otherwise)
RANKS_PER_NODE = 8
#: the devices the table was measured on
DEVICES = ("H100",)
#: FP8 bytes per BF16 byte as the benchmark counts them (tests/test_hybrid_ep.py)
FP8_FACTOR = (1 + 4 / 128) / 2


#: the fields an error names: (kind, SMs, combine dtype), in a scenario and on the command
#: line (``moesim collective``)
SCENARIO_FIELDS = ("parallel.ep_backend.kind", "parallel.ep_backend.sms", "routing.combine_dtype")
CLI_FIELDS = ("--kernel", "--sms", "--dtype")


def _column(op: str, dtype: str, src: str, field: str) -> int:
    if op == "ep_dispatch":
        return 0 if dtype == "fp8" else 1
    if dtype != "bf16":
        raise InputError(src, field, "bf16 for a HybridEP combine (its combine runs in BF16 "
                         "only: tests/test_hybrid_ep.py)", dtype)
    return 2


def _interp(x: float, xs: tuple[float, ...], ys: list[float]) -> float:
    return float(np.interp(x, xs, ys))


@cache     # every exchange of a step asks for one of a few rates
def rate_Bps(ranks: int, sms: int, op: str, dtype: str, src: str = "parallel.ep_backend",
             fields: tuple[str, str, str] = SCENARIO_FIELDS) -> float:
    """The published rate (bytes/s) of ``op`` in ``dtype`` on ``ranks`` EP ranks and
    ``sms`` SMs, interpolated in log2(ranks) and SMs (SMs above 16 at the 16-SM rate).
    ``fields``: what an error names (:data:`SCENARIO_FIELDS`, :data:`CLI_FIELDS`)."""
    if not RANKS[0] <= ranks <= RANKS[-1]:
        raise InputError(src, fields[0], f"an EP group of {RANKS[0]} to {RANKS[-1]} ranks for "
                         "hybridep (its published H100 rates: 16, 32 and 64 ranks)",
                         f"{ranks} ranks")
    if sms < SMS[0]:
        raise InputError(src, fields[1], f"at least {SMS[0]} SMs for hybridep (its published "
                         "rates: 4, 8 and 16 SMs)", sms)
    col = _column(op, dtype, src, fields[2])
    s = min(float(sms), float(SMS[-1]))
    by_ranks = [_interp(s, SMS, [H100_GBPS[(r, m)][col] for m in SMS]) for r in RANKS]
    return _interp(np.log2(ranks), tuple(np.log2(RANKS)), by_ranks) * 1e9


def payload_bytes(node_tokens: np.ndarray, hidden: int, dtype: str) -> np.ndarray:
    """Per EP rank, the bytes the benchmark counts: (token, node) copies, own node
    included, × 2·H (BF16) or × 2·H·FP8_FACTOR (FP8). ``node_tokens[i, n]``: rank i's
    tokens that go to node n."""
    per_copy = 2.0 * hidden * (FP8_FACTOR if dtype == "fp8" else 1.0)
    return np.asarray(node_tokens, dtype=float).sum(axis=1) * per_copy


def bound_s(node_tokens: np.ndarray, hidden: int, op: str, dtype: str, sms: int,
            src: str = "parallel.ep_backend",
            fields: tuple[str, str, str] = SCENARIO_FIELDS) -> np.ndarray:
    """Per EP rank, the exchange's time at the published rate: its payload / the rate."""
    n = int(np.asarray(node_tokens).shape[0])
    return payload_bytes(node_tokens, hidden, dtype) / rate_Bps(n, sms, op, dtype, src, fields)


def check_layout(device: str, ranks_per_node: int, src: str,
                 field: str = "parallel.ep_backend.kind") -> None:
    """The published rates are H100's with 8 GPUs a node: refuse anything else."""
    if str(device) not in DEVICES:
        raise InputError(src, field, "hybridep on " + " or ".join(DEVICES) + " (its published "
                         "rates are H100's; nccl, deepep or deepep-ll elsewhere)", device)
    if ranks_per_node != RANKS_PER_NODE:
        raise InputError(src, field, f"hybridep with {RANKS_PER_NODE} EP ranks on each node "
                         "(its published H100 rates)", f"{ranks_per_node} a node")
