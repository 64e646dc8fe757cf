"""One MoE dispatch or combine on a topology: :func:`simulate_ep` (the CLI's engine).

Samples every token's top-k experts (:func:`moesim.gating.tokens.sample_choices`),
counts the exact (token, node) and (token, GPU) copies, plans the exchange for the
chosen kernel (:func:`moesim.ep.plan.plan_ep_exchange`) and times it
(:func:`moesim.ep.timing.time_plan`). Pure: no simpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from moesim.compute.devices import GPU_LAUNCH_OVERHEAD_S, get_device
from moesim.ep import hybridep
from moesim.ep.messages import check_message
from moesim.ep.plan import DEFAULT_SMS, check_kernel, check_nvl_peers, plan_ep_exchange
from moesim.ep.timing import time_plan
from moesim.errors import InputError
from moesim.gating.config import RoutingConfig
from moesim.gating.placement import make_placement
from moesim.gating.tokens import dedup_counts, sample_choices

_SRC = "command line"


def ep_layout(topo: Any, ranks: Sequence[int] | None) -> tuple[list[str], int]:
    """GPUs of the EP group in rank order and EP ranks per node.

    The group must hold the same number of GPUs on every node it touches, listed
    node by node, so EP rank r sits on node r // ranks_per_node and its rail peer on
    node b is EP rank b · ranks_per_node + r % ranks_per_node."""
    n_world = len(topo.gpus)
    group = list(range(n_world)) if ranks is None else [int(r) for r in ranks]
    if not group or len(set(group)) != len(group):
        raise InputError(_SRC, "--ranks", "a non-empty list of distinct ranks", group)
    bad = [r for r in group if not 0 <= r < n_world]
    if bad:
        raise InputError(_SRC, "--ranks", f"ranks in 0..{n_world - 1}", bad[0])
    gpus = [topo.gpus[r] for r in group]
    hosts = [topo.host_of(g) for g in gpus]
    per: dict[int, int] = {}
    for h in hosts:
        per[h] = per.get(h, 0) + 1
    L = next(iter(per.values()))
    node_by_node = all(hosts[i] == hosts[(i // L) * L] for i in range(len(hosts)))
    if len(set(per.values())) != 1 or not node_by_node:
        raise InputError(_SRC, "--ranks", "the same number of GPUs on every node, listed "
                         "node by node (EP rank r on node r // GPUs per node)", group)
    locs = [[topo.local_of(g) for g in gpus[i:i + L]] for i in range(0, len(gpus), L)]
    if any(lc != locs[0] for lc in locs):
        raise InputError(_SRC, "--ranks", "the same local GPU indices on every node "
                         "(DeepEP's rail peer is the GPU with the same local index)", group)
    return gpus, L


def simulate_ep(topo: Any, op: str, kernel: str, *, tokens: int, hidden: int, experts: int,
                top_k: int, dtype: str, routing: RoutingConfig | None = None,
                ranks: Sequence[int] | None = None, sms: int = DEFAULT_SMS,
                seed: int = 0) -> dict:
    """Simulate one ``op`` (ep_dispatch | ep_combine) of ``tokens`` tokens per rank.
    ``kernel`` ``hybridep``: DeepEP's normal copies on the links, each rank done no
    sooner than its (token, node) payload at HybridEP's published H100 rate
    (:mod:`moesim.ep.hybridep`, as the engines price it); its RDMA bytes are that payload.

    Returns a JSON-able dict (see docs/deepep.md for every field)."""
    hybrid = kernel == "hybridep"
    if hybrid:
        check_kernel(op, "deepep", DEFAULT_SMS)
        if isinstance(sms, bool) or not isinstance(sms, int | np.integer):
            raise InputError(_SRC, "--sms", "an integer number of SMs", sms)
    else:
        check_kernel(op, kernel, sms)
    for name, v, lo in (("--tokens", tokens, 1), ("--hidden", hidden, 1),
                        ("--experts", experts, 1), ("--top-k", top_k, 1), ("--seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
            raise InputError(_SRC, name, f"an integer >= {lo}", v)
    check_message(dtype, int(hidden), int(top_k))
    cfg = routing or RoutingConfig()
    gpus, L = ep_layout(topo, ranks)
    n = len(gpus)
    if hybrid:
        hybridep.check_layout(str(getattr(topo, "device", None)), L, _SRC, "--kernel")
        hybridep.rate_Bps(n, int(sms), op, dtype, _SRC, hybridep.CLI_FIELDS)
    else:
        check_nvl_peers(kernel, L)
    if experts % n:
        raise InputError(_SRC, "--experts", f"a multiple of the {n} EP ranks", experts)
    if top_k > experts:
        raise InputError(_SRC, "--top-k", f"at most --experts ({experts})", top_k)
    placement = make_placement(experts, n, source=_SRC)
    choices = sample_choices(cfg, n_experts=experts, top_k=top_k, tokens_per_rank=[tokens] * n,
                             placement=placement, ranks_per_node=L, seed=seed, source=_SRC)
    counts = dedup_counts(choices, placement.home, L)
    plan = plan_ep_exchange(counts, op, "deepep" if hybrid else kernel, dtype, hidden, top_k,
                            DEFAULT_SMS if hybrid else sms)
    launch_s = _launch_s(topo)
    tm = time_plan(plan, topo, gpus, launch_s)
    rdma_rank = plan.rdma_bytes_per_rank
    if hybrid:       # the links' time or the published rate, whichever ends last
        bound = hybridep.bound_s(counts.node_tokens, hidden, op, dtype, int(sms), _SRC,
                                 hybridep.CLI_FIELDS)
        rank_t = np.maximum(tm.rank_net_s, bound) * ((tm.rank_net_s > 0) | (bound > 0))
        tm = dataclasses.replace(tm, time_s=float(rank_t.max(initial=0.0)),
                                 rank_time_s=rank_t, rank_sm_s=bound, fill_drain_s=0.0)
        rdma_rank = hybridep.payload_bytes(counts.node_tokens, hidden, dtype)
    r = int(np.argmax(tm.rank_time_s))
    t = tm.time_s
    rdma_b = float(rdma_rank[r])
    nvl_b = float(plan.nvl_bytes_per_rank[r])
    return {
        "op": op, "kernel": kernel, "ranks": n, "ranks_per_node": L, "tokens": tokens,
        "hidden": hidden, "experts": experts, "top_k": top_k, "dtype": dtype,
        "max_nodes": cfg.max_nodes, "routing": cfg.kind,
        "time_s": t, "notify_s": tm.notify_s, "total_s": t + tm.notify_s,
        "rdma_GBps": rdma_b / t / 1e9 if t > 0 else 0.0,
        "nvl_GBps": nvl_b / t / 1e9 if t > 0 else 0.0,
        "rdma_bytes_per_rank": rdma_b, "nvl_bytes_per_rank": nvl_b,
        "rdma_bytes_mean": float(rdma_rank.mean()),
        "nvl_bytes_mean": float(plan.nvl_bytes_per_rank.mean()),
        "bytes_per_token": plan.bytes_per_token,
        "sms": int(sms) if hybrid else (plan.sms if kernel != "nccl" else None),
        "sm_bound_s": float(tm.rank_sm_s.max(initial=0.0)),
        "fill_drain_s": tm.fill_drain_s,
        "slowest_rank": r, "rank_time_s": [float(x) for x in tm.rank_time_s],
        "flows": tm.flows, "solves": tm.solves,
        "token_gpu_copies": int(counts.gpu_tokens.sum()),
        "token_node_copies": int(counts.node_tokens.sum()),
        "token_expert_pairs": int(counts.pair_tokens.sum()),
    }


def _launch_s(topo: Any) -> float:
    dev = getattr(topo, "device", None)
    return get_device(dev).launch_overhead_s if dev else GPU_LAUNCH_OVERHEAD_S
