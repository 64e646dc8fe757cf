"""The hot-expert study's training step with EPLB's redundant experts: the rows, the
replicas' gradient all-reduce priced alone, the table and its reading
(``benchmarks/hot_expert_study.py`` runs them and writes the page)."""

from __future__ import annotations

import sys
import time

from moesim.engine.fast.dp import RingCost
from moesim.program.build import Builder


def replica_sync(res) -> dict:
    """The replicas' gradient all-reduces of the first EP group
    (:class:`moesim.program.replica_grads.ReplicaGrads`): per GPU the bytes of the
    all-reduces it joins and their time priced alone, one after another, on the topology
    (the fast engine's ring pricing); the GPU with the longest, and the all-reduces' count."""
    rg = Builder(res, 0).grads.replicas
    if rg is None:
        return {"count": 0, "bytes": 0.0, "ms": 0.0, "gpu": -1, "per": 0.0}
    topo = res.topology
    gpus = list(topo.gpus)
    rings = RingCost(topo, gpus, [topo.host_of(g) for g in gpus])
    group = tuple(int(r) for r in res.layout.ep_groups[0])
    layers = sorted(rg.moe_index)
    per_b, per_t = {}, {}
    count = 0
    for layer in layers:
        for grp, nbytes in rg.group_syncs(group, layer):
            count += 1
            t = rings.time("all_reduce", grp, nbytes)
            for r in grp:
                per_b[r] = per_b.get(r, 0.0) + nbytes
                per_t[r] = per_t.get(r, 0.0) + t
    gpu = max(per_t, key=per_t.get)
    return {"count": count, "bytes": per_b[gpu], "ms": per_t[gpu] * 1e3, "gpu": gpu,
            "per": rg.expert_bytes}


REDUNDANT = [
    ("EPLB global, 0 redundant", 0, "global"),
    ("EPLB global, 32 redundant", 32, "global"),
    ("EPLB global, 64 redundant", 64, "global"),
    ("EPLB global, 128 redundant", 128, "global"),
    ("EPLB hierarchical (8 groups), 64 redundant", 64, "hierarchical"),
]


def redundant_rows(row) -> list[dict]:
    """The rows of :data:`REDUNDANT`, each ``row(label, routing)`` on the hot step."""
    out = []
    for label, n, mode in REDUNDANT:
        t = time.perf_counter()
        pl = {"kind": "eplb", "mode": mode, "redundant": n}
        if mode == "hierarchical":
            pl["groups"] = 8
        out.append(row(label, {"placement": pl}))
        print(f"{label}: step {out[-1]['step_ms']:.1f} ms ({time.perf_counter() - t:.1f} s "
              "wall)", file=sys.stderr)
    return out


def redundant_table(rows: list[dict]) -> list[str]:
    base = rows[0]
    out = ["| setting | expert slots per GPU | step (ms) | vs 0 redundant | EPLB plan max/mean | "
           "max/mean GPU tokens | stall (ms, mean) | gradient all-reduce (ms, mean: dense "
           "+ replicas, in the step) | replica all-reduces per step | replica all-reduce "
           "bytes on the busiest GPU (GB) | its replica all-reduces priced alone (ms) | "
           "peak memory per GPU (GB) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, (_, n, _) in zip(rows, REDUNDANT, strict=True):
        y = r["sync"]
        oom = " (OOM)" if r["oom"] else ""
        out.append(f"| {r['label']} | {(256 + n) // 32} | {r['step_ms']:.1f} | "
                   f"{r['step_ms'] - base['step_ms']:+.1f} ms | {r['plan']} | "
                   f"{r['gpu_mm']:.2f} | {r['stall_ms']:.1f} | {r['dp_ms']:.1f} | "
                   f"{y['count']} | {y['bytes'] / 1e9:.3f} | {y['ms']:.1f} | "
                   f"{r['peak_gb']:.2f}{oom} |")
    return out


def redundant_analysis(rows: list[dict], params: int, layers_full: int) -> str:
    r = {x["label"]: x for x in rows}
    z, a, b, c = (r[f"EPLB global, {n} redundant"] for n in (0, 32, 64, 128))
    hier = r["EPLB hierarchical (8 groups), 64 redundant"]
    per = a["sync"]["per"]
    slot = params * (2 + 2 + 12)           # BF16 weight + BF16 gradient + Adam (fp32 x 3)
    h = 0.9 / 26
    return f"""
A training step takes redundant experts the way training systems that replicate hot
experts run them (FlexMoE, arXiv:2304.03946): each replica holds a copy of the expert's
weights, the expert's tokens are split among its replicas (EPLB's logical -> physical map,
as serving splits them), and after the backward pass the replicas' gradients are summed
by one all-reduce among the GPUs holding them (one per layer and replica set, before the
data-parallel reduce), so the copies stay identical; every replica keeps its own
optimizer state and takes the same update ([routing guide](../routing.md)). Each
replica's gradient is one expert, {params:,} parameters x 2 B (BF16) = {per:,.0f} B.

- **What the plan buys.** With 26 hot experts of {h:.2%} each, EP32's mean GPU share is
  3.125 %: re-packing leaves one hot expert per GPU, {z['plan']}. 32 redundant slots give
  every hot expert a second replica and 6 a third, 58 hot replicas for 32 GPUs, so some
  GPU still holds two halves of hot experts: the plan stays at {a['plan']}. 64: {b['plan']};
  128: {c['plan']}.
- **What the step does.** {z['step_ms']:.1f} ms with re-packing only; {a['step_ms']:.1f},
  {b['step_ms']:.1f} and {c['step_ms']:.1f} ms with 32, 64 and 128 redundant experts
  ({a['step_ms'] - z['step_ms']:+.1f}, {b['step_ms'] - z['step_ms']:+.1f} and
  {c['step_ms'] - z['step_ms']:+.1f} ms). The replicas' gradient all-reduce is what they
  add: in global mode a hot expert's replicas sit on GPUs of different nodes, so each
  all-reduce crosses InfiniBand; the busiest GPU joins {a['sync']['bytes'] / 1e9:.2f},
  {b['sync']['bytes'] / 1e9:.2f} and {c['sync']['bytes'] / 1e9:.2f} GB of them, priced
  alone {a['sync']['ms']:.1f}, {b['sync']['ms']:.1f} and {c['sync']['ms']:.1f} ms; in the
  step the gradient phase (dense all-reduce + replicas, mean per GPU) grows from
  {z['dp_ms']:.1f} to {a['dp_ms']:.1f}, {b['dp_ms']:.1f} and {c['dp_ms']:.1f} ms. On this
  4-layer step there is little backward left to hide it behind.
- **What it costs in memory.** Each extra slot per GPU holds an expert with its gradient
  and its own Adam state: {params:,} x (2 + 2 + 12) B = {slot / 1e9:.3f} GB per MoE layer;
  the peak grows from {z['peak_gb']:.2f} to {a['peak_gb']:.2f}, {b['peak_gb']:.2f} and
  {c['peak_gb']:.2f} GB per GPU (the H800's capacity: {z['cap_gb']:.2f} GB). On the full {layers_full}-MoE-layer
  DeepSeek-V3 one more slot per GPU is {slot * layers_full / 1e9:.1f} GB without ZeRO,
  the reason a trainer would shard that optimizer state (moesim models it per replica).
- **Hierarchical** with 8 groups and 64 redundant: {hier['step_ms']:.1f} ms, plan
  {hier['plan']}: the replicas stay in the hot node, so their all-reduces run on NVLink
  ({hier['sync']['ms']:.1f} ms priced alone on the busiest GPU) but the node's imbalance
  stays.
"""


def full_moe_layers() -> int:
    """MoE layers of the shipped DeepSeek-V3 preset (58 of 61)."""
    from moesim.model import PRESETS

    spec = PRESETS["deepseek-v3"]
    return sum(1 for i in range(spec.layers) if spec.is_moe_layer(i))
