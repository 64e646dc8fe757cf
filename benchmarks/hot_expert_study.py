"""The seed's question: "Your MoE router sends 90 % of tokens to 10 % of the experts. What
happens to the step, and how do you fix it without hurting the model?"

    python benchmarks/hot_expert_study.py
    python benchmarks/hot_expert_study.py --write-docs   # docs/studies/hot-expert-fixes.md

A reduced DeepSeek-V3 (the shipped preset's dimensions, 4 layers all MoE: 256 experts,
top-8) trains on 32 H800 GPUs (4 DGX H800 nodes, topologies/dgx-h800.yaml), EP32 (8
experts per GPU), 2 micro-batches of 4,096 tokens per GPU, FP8 GEMMs and dispatch, on
the fast engine. 26 experts (10.2 % of 256) take 90 % of the routed (token, expert)
assignments (``routing.kind: hot``). Each fix is one routing setting on that step:
capacity factor (tokens dropped), EPLB re-packing (``routing.placement`` with 0 redundant
experts, hierarchical and global), node-limited routing (``routing.max_nodes``), DeepEP's
kernels; the balanced router is the ceiling an auxiliary loss or bias balancing could
reach. Then the same step with N redundant experts: what the plan buys, the replicas'
gradient all-reduce it adds (priced alone on the topology, and in the step) and the
memory each replica's weights, gradients and optimizer states take. Then
serving (``deepseek-v3-decode-sglang``, DeepEP low-latency, the same 90/10 skew): EPLB
with N redundant experts, the step each buys and the memory each costs (weights per GPU,
KV room, largest batch: the summary's ``memory`` and ``eplb`` blocks); and the RL step.
Prints wall time, each figure with its unit. About three minutes on 2 busy CPUs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from hot_expert_redundant import (  # this folder
    full_moe_layers,
    redundant_analysis,
    redundant_rows,
    redundant_table,
    replica_sync,
)

from moesim.model.params import ffn_params
from moesim.outputs import write_text
from moesim.program.build import Builder
from moesim.scenario.read import build_scenario
from moesim.trace.report import full_summary
from moesim.wiring import resolve, simulate

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "studies" / "hot-expert-fixes.md"
HOT = {"kind": "hot", "hot_experts": 26, "hot_fraction": 0.9}
BASE = {
    "name": "hot-expert-study", "seed": 0,
    "cluster": {"topology": "dgx-h800", "nodes": 4, "device": "H800", "network": "flow"},
    "model": {"preset": "deepseek-v3", "layers": 4, "first_dense_layers": 0},
    "parallel": {"tp": 1, "pp": 1, "ep": 32},
    "schedule": {"kind": "1f1b", "microbatches": 2, "micro_batch_size": 1, "seq_len": 4096},
    "compute": {"kind": "catalog", "precision": "fp8"},
    "overlap": {"ep_comm_overlap": False, "dp_overlap": True},
    "memory": {"recompute": "none"},
    "engine": {"mode": "fast"},
}
WIRE = {"dispatch_dtype": "fp8", "combine_dtype": "bf16"}


DEEPEP = {"ep_backend": {"kind": "deepep", "sms": 20}}   # DeepEP normal kernels, 20 SMs


def resolved(routing: dict, parallel: dict | None = None):
    data = {**BASE, "routing": {**routing, **WIRE},
            "parallel": {**BASE["parallel"], **(parallel or {})}}
    return resolve(build_scenario(data, source="hot-expert-study"))


def gpu_tokens(res) -> np.ndarray:
    """(GPUs,) tokens each GPU of the first EP group computes in the step (all MoE layers
    and micro-batches, forward): the expert kernels' rows."""
    b = Builder(res, 0)
    group = tuple(res.layout.ep_groups[0])
    return sum(b.routes.route(0, group, layer, mb).rank_expert_tokens.sum(axis=1)
               for layer in b.routes.moe_layers
               for mb in range(res.scenario.schedule.microbatches))


def plan_figure(s: dict) -> str:
    """EPLB's own figure of merit from the summary's ``eplb`` block (mean over layers)."""
    e = s.get("eplb")
    return "–" if e is None else f"{e['max_over_mean_mean']:.3f} ({e['mode']})"


def row(label: str, routing: dict, parallel: dict | None = None) -> dict:
    res = resolved(routing, parallel)
    out = simulate(res)
    s = full_summary(out)
    b = s["breakdown_s"]
    tok = gpu_tokens(res)
    top = (s.get("stalls") or {}).get("top") or [{}]
    assigned = int(np.sum(s["experts"]["tokens_per_expert"]))
    return {"label": label, "step_ms": out.step_time_s * 1e3,
            "compute_ms": b["compute"] * 1e3, "a2a_ms": (b["ep_dispatch"] + b["ep_combine"]) * 1e3,
            "stall_ms": b["stall"] * 1e3, "gpu_mm": float(tok.max() / tok.mean()),
            "plan": plan_figure(s), "dropped": int(s["experts"]["dropped_total"]),
            "assigned": assigned, "lb": float(s["experts"]["lb_loss_mean"]),
            "reason": top[0].get("reason", "–"), "gib": s["memory"],
            "dp_ms": b["dp"] * 1e3, "peak_gb": s["memory"]["peak_bytes_max"] / 1e9,
            "oom": s["memory"]["oom"], "cap_gb": s["memory"]["capacity_bytes"] / 1e9,
            "sync": replica_sync(res)}


def table(rows: list[dict], base_ms: float) -> list[str]:
    out = ["| setting | step (ms) | vs hot | compute (ms, mean) | EP all-to-alls (ms, mean) | "
           "stall (ms, mean) | max/mean GPU tokens | EPLB plan max/mean | dropped "
           "(token, expert) | lb loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        drop = (f"{r['dropped']:,} ({r['dropped'] / r['assigned']:.1%})" if r["dropped"]
                else "0")
        out.append(f"| {r['label']} | {r['step_ms']:.1f} | {r['step_ms'] / base_ms:.2f}x | "
                   f"{r['compute_ms']:.1f} | {r['a2a_ms']:.1f} | {r['stall_ms']:.1f} | "
                   f"{r['gpu_mm']:.2f} | {r['plan']} | {drop} | {r['lb']:.2f} |")
    return out


CASES = [
    ("balanced router (uniform)", {"kind": "uniform"}),
    ("hot: 26 of 256 experts take 90 %", HOT),
    ("capacity factor 1.0", {**HOT, "capacity_factor": 1.0}),
    ("capacity factor 1.25", {**HOT, "capacity_factor": 1.25}),
    ("capacity factor 2.0", {**HOT, "capacity_factor": 2.0}),
    ("EPLB global, 0 redundant", {**HOT, "placement": {"kind": "eplb", "mode": "global"}}),
    ("EPLB hierarchical (8 groups), 0 redundant",
     {**HOT, "placement": {"kind": "eplb", "mode": "hierarchical", "groups": 8}}),
    ("EPLB global, 0 redundant, loads: trace",
     {**HOT, "placement": {"kind": "eplb", "mode": "global", "loads": "trace"}}),
    ("node-limited routing, max_nodes 2", {**HOT, "max_nodes": 2}),
    ("node-limited routing, max_nodes 1", {**HOT, "max_nodes": 1}),
    ("EPLB global 0 + max_nodes 2", {**HOT, "max_nodes": 2, "placement": {
        "kind": "eplb", "mode": "global"}}),
    ("DeepEP: hot", HOT, DEEPEP),
    ("DeepEP: max_nodes 2", {**HOT, "max_nodes": 2}, DEEPEP),
    ("DeepEP: max_nodes 1", {**HOT, "max_nodes": 1}, DEEPEP),
    ("DeepEP: EPLB global, 0 redundant", {**HOT, "placement": {"kind": "eplb",
                                                              "mode": "global"}}, DEEPEP),
]

def analysis(rows: list[dict]) -> str:
    """The reading of the training table, its figures taken from the rows."""
    r = {x["label"]: x for x in rows}
    bal, hot = r["balanced router (uniform)"], r["hot: 26 of 256 experts take 90 %"]
    cf1, cf2 = r["capacity factor 1.0"], r["capacity factor 2.0"]
    g0, hier = r["EPLB global, 0 redundant"], r["EPLB hierarchical (8 groups), 0 redundant"]
    nl1, dep, dep1 = (r["node-limited routing, max_nodes 1"], r["DeepEP: hot"],
                      r["DeepEP: max_nodes 1"])
    dep_e = r["DeepEP: EPLB global, 0 redundant"]
    h, c = 0.9 / 26, 0.1 / 230                     # a hot and a cold expert's share
    bound = (h + 7 * c) * 32                        # one hot + 7 cold experts on a GPU
    return f"""
## What the step does

The 26 hot experts live on GPUs 0-3 (contiguous placement, 8 experts per GPU: experts
0-25), so GPUs 0-2 compute 8 hot experts each: {hot['gpu_mm']:.2f}x the mean GPU's expert
rows. The step goes from {bal['step_ms']:.1f} ms (balanced router) to {hot['step_ms']:.1f}
ms ({hot['step_ms'] / bal['step_ms']:.2f}x). The summary's top stall cause names it:
"{hot['reason']}": the other GPUs finish their expert GEMMs and wait in the combine
all-to-all ({hot['stall_ms']:.1f} ms of stall per GPU on average), and the all-to-alls
themselves grow from {bal['a2a_ms']:.1f} to {hot['a2a_ms']:.1f} ms since 90 % of the
routed bytes converge on four GPUs' links.

## What each fix buys in training

- **Capacity factor** caps each (source GPU, expert) at ceil(tokens x top-k / experts x
  factor) (Megatron-Core's get_capacity): at 1.0 the step is {cf1['step_ms']:.1f} ms,
  faster than the balanced router, because {cf1['dropped'] / cf1['assigned']:.1%} of the
  (token, expert) assignments are dropped (they skip their expert: a change to the
  model's output, not a free fix); at 2.0, {cf2['dropped'] / cf2['assigned']:.1%} are
  dropped and the step is {cf2['step_ms']:.1f} ms.
- **EPLB re-packing** (``routing.placement`` with ``redundant: 0``) keeps every token
  and every GPU's expert count: it only moves whole experts between GPUs. Global mode
  spreads the hot experts one per GPU: {g0['step_ms']:.1f} ms ({g0['step_ms'] /
  bal['step_ms']:.2f}x the balanced step), max/mean GPU rows {g0['gpu_mm']:.2f}. By hand:
  a hot expert takes 0.9 / 26 = {h:.2%} of the assignments, a cold one 0.1 / 230 =
  {c:.3%}; a GPU with one hot and 7 cold experts holds {h + 7 * c:.3%} against a mean of
  1 / 32 = 3.125 %, {bound:.3f}x, the "EPLB plan" column (the summary's
  ``eplb.max_over_mean_mean``). Without replicas no placement does better than one hot
  expert on a GPU (1.108x), so this is the floor re-packing can reach here; the "max/mean
  GPU tokens" column is what the step computed (the routed draw, not the expected shares).
  The hierarchical mode with DeepSeek-V3's 8 expert groups does not help
  ({hier['step_ms']:.1f} ms, max/mean {hier['gpu_mm']:.2f}): all 26 hot experts are in
  group 0, which it keeps on one node, so that node's 8 GPUs share 90 % of the rows.
  With ``groups: 8``, EPLB's own choice (``mode: auto``) would be this hierarchical mode,
  since 4 nodes divide 8 groups: a skew concentrated in one group needs ``mode: global``.
- **Redundant experts** (``redundant > 0``): DeepSeek deploys them for inference
  (DeepSeek-V3 report §3.4.1-§3.4.2; deepseek-ai/EPLB calls itself "our deployed EP load
  balancing algorithm"); in training each replica's gradient must be summed with its
  other replicas'. The next section prices that on this step, serving's further below.
- **Node-limited routing** (``max_nodes``) limits the nodes a token's experts span. With
  NCCL's all-to-all (one copy per (token, expert)) it changes which experts share a
  token, not the counts per (source, expert): max_nodes 1 gives {nl1['step_ms']:.1f} ms,
  the same step. With DeepEP's normal kernels (one RDMA copy per (token, node)) it cuts
  inter-node bytes: {dep['step_ms']:.1f} ms without, {dep1['step_ms']:.1f} ms with
  max_nodes 1; the hot GPUs' rows, and the stall, stay.
- **DeepEP + EPLB re-packing** together: {dep_e['step_ms']:.1f} ms, the fastest
  setting that keeps every token ({dep_e['step_ms'] / hot['step_ms']:.2f}x the hot step,
  {dep_e['step_ms'] / bal['step_ms']:.2f}x the balanced NCCL step).
- **Aux-loss weight / bias balancing**: moesim's router takes the skew as given
  (``routing.kind``); it has no learned router whose balance an auxiliary-loss weight
  (Switch Transformers arXiv:2101.03961 §2.2) or DeepSeek-V3's bias-based,
  auxiliary-loss-free balancing (report §2.1.2) would move over training steps. The "lb
  loss" column is the Switch loss E x sum f_i P_i of the routing as drawn
  ({hot['lb']:.2f} hot, {bal['lb']:.2f} balanced); the balanced-router row,
  {bal['step_ms']:.1f} ms, is the most a perfectly effective balancing could buy (at a
  cost in model quality for an aux loss that moesim does not model).
"""


#: the study's layout: SGLang's decode scenario on EP64 over 8 nodes with no placement
#: (the scenario ships EP72 on 9 nodes with EPLB's 32 redundant experts; this study keeps
#: the EP64 layout it was written for, where 256 + N slots need N a multiple of 64)
EP64 = ["cluster.nodes=8", "serve.ep=64"]
HOT_SET = [*EP64, "routing.kind=hot", "routing.hot_experts=26", "routing.hot_fraction=0.9",
           "routing.placement=null"]
SERVE = "deepseek-v3-decode-sglang"


def eplb_set(redundant: int, mode: str = "global") -> list[str]:
    return [*HOT_SET, f"routing.placement={{kind: eplb, redundant: {redundant}, mode: {mode}}}"]


SERVE_CASES = [
    ("balanced router (uniform)", [*EP64, "routing.kind=uniform", "routing.placement=null"]),
    ("hot: 26 of 256 take 90 %", HOT_SET),
    ("EPLB global, 0 redundant", eplb_set(0)),
    ("EPLB global, 64 redundant", eplb_set(64)),
    ("EPLB global, 128 redundant", eplb_set(128)),
    ("EPLB global, 192 redundant", eplb_set(192)),
    ("EPLB hierarchical (8 groups), 64 redundant", eplb_set(64, "hierarchical, groups: 8")),
]
HOT_RL = ["routing.kind=hot", "routing.hot_experts=13", "routing.hot_fraction=0.9"]
RL_CASES = [
    ("shipped (uniform routing)", []),
    ("13 of 128 experts take 90 %", HOT_RL),
    ("13 of 128 take 90 %, EPLB 0 redundant",
     [*HOT_RL, "routing.placement={kind: eplb, redundant: 0}"]),
]


def cli_summary(cmd: str, name: str, sets: list[str]) -> dict:
    """``moesim CMD NAME --set ...``'s summary.json, run in its own process (one process
    running every serving and RL case in turn grew past 24 GB and was killed)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [cmd, name, "-o", tmp, "--quiet"]
        for x in sets:
            args += ["--set", x]
        done = subprocess.run([sys.executable, "-m", "moesim", *args], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"moesim {' '.join(args)} failed: {done.stderr.strip()}")
        return json.loads((Path(tmp) / "summary.json").read_text())


def serve_rows() -> list[dict]:
    out = []
    for label, sets in SERVE_CASES:
        t = time.perf_counter()
        s = cli_summary("serve", SERVE, sets)
        m, b, e = s["memory"], s["breakdown_s"], s.get("eplb")
        top = (s.get("stalls") or {}).get("top") or [{}]
        out.append({"label": label, "step_ms": s["step_time_s"] * 1e3,
                    "tps": s["tokens_per_s_per_gpu"], "compute_ms": b["compute"] * 1e3,
                    "a2a_ms": (b["ep_dispatch"] + b["ep_combine"]) * 1e3,
                    "plan": e and e["max_over_mean_mean"], "mode": e and e["mode"],
                    "slots": e["slots_per_gpu"] if e else 256 // s["serve"]["ep"],
                    "layers": len(s["experts"]["moe_layers"]),
                    "weights": m["weights_bytes"], "free": m["free_bytes"],
                    "kv_req": m["kv_per_request_bytes"], "batch": m["largest_batch_per_gpu"],
                    "reason": top[0].get("reason", "–"), "top": top[0]})
        print(f"serve {label}: step {out[-1]['step_ms']:.2f} ms "
              f"({time.perf_counter() - t:.1f} s wall)", file=sys.stderr)
    return out


def serve_table(rows: list[dict]) -> list[str]:
    hot, base = rows[1], rows[2]                       # hot; EPLB with 0 redundant
    out = ["| setting | expert slots per GPU | decode step (ms) | vs hot | output tokens/s "
           "per GPU | compute (ms, mean) | EP dispatch + combine (ms, mean) | EPLB plan "
           "max/mean | weights per GPU (GiB) | weights added vs 0 redundant (GB) | free "
           "for more KV at batch 256 (GiB) | largest batch (requests per GPU) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        plan = "–" if r["plan"] is None else f"{r['plan']:.3f} ({r['mode']})"
        out.append(f"| {r['label']} | {r['slots']} | {r['step_ms']:.2f} | "
                   f"{r['step_ms'] / hot['step_ms']:.2f}x | {r['tps']:,.0f} | "
                   f"{r['compute_ms']:.1f} | {r['a2a_ms']:.1f} | {plan} | "
                   f"{r['weights'] / 2**30:.2f} | "
                   f"{(r['weights'] - base['weights']) / 1e9:.2f} | {r['free'] / 2**30:.2f} | "
                   f"{r['batch']} |")
    return out


SERVE_INTRO = """## Serving: redundant experts, what they buy and what they cost

`moesim serve deepseek-v3-decode-sglang --set cluster.nodes=8 --set serve.ep=64` (DeepSeek-V3 decode on 64 H100, EP64, DeepEP's
low-latency kernels, 256 requests per GPU of 2,000 tokens of context, FP8 weights) with the same skew:
26 of 256 experts take 90 % of the routed assignments, and EPLB places redundant experts
as DeepSeek deploys them for decoding. EP64 takes N such that 256 + N is a multiple of 64 (32 is
refused: "expected a count making experts + redundant (256 + N) a multiple of ep = 64"),
so N = 0, 64, 128, 192: 4, 5, 6, 7 expert slots per GPU. Memory figures are the serving
summary's ``memory`` block (bytes per GPU), the plan's figure its
``eplb.max_over_mean_mean``; compute and all-to-all times are means over the 64 GPUs.
"""


def serve_analysis(rows: list[dict], params: int) -> str:
    r = {x["label"]: x for x in rows}
    bal, hot, e0 = rows[0], rows[1], r["EPLB global, 0 redundant"]
    e64, e128, e192 = (r[f"EPLB global, {n} redundant"] for n in (64, 128, 192))
    hier = r["EPLB hierarchical (8 groups), 64 redundant"]
    per_slot = params * e0["layers"] * 1                  # FP8 weights: 1 B per parameter
    lost = (e0["batch"] - e64["batch"], e0["batch"] - e128["batch"],
            e0["batch"] - e192["batch"])
    return f"""
- **The stall.** The skew takes the decode step from {bal['step_ms']:.2f} ms to
  {hot['step_ms']:.2f} ms ({hot['step_ms'] / bal['step_ms']:.2f}x): the hot experts sit
  on GPUs 0-6 (4 per GPU), and every other GPU waits in the low-latency dispatch and
  combine for them (EP dispatch + combine {bal['a2a_ms']:.1f} -> {hot['a2a_ms']:.1f} ms;
  the top stall: "{hot['reason']}", blocking rank {hot['top'].get('blocking_rank', '–')}).
- **Re-packing alone** (0 redundant): {e0['step_ms']:.2f} ms. At EP64 one hot expert
  (0.9 / 26 = 3.46 % of the assignments) is 2.2x a GPU's mean share (1 / 64 = 1.5625 %),
  so with whole experts the busiest GPU stays at {e0['plan']:.3f}x the mean (the plan).
- **64 redundant** (5 slots per GPU): {e64['step_ms']:.2f} ms
  ({e64['step_ms'] / hot['step_ms']:.2f}x the hot step, {e64['step_ms'] / bal['step_ms']:.2f}x
  the balanced one), plan max/mean {e64['plan']:.3f}; **128**: {e128['step_ms']:.2f} ms,
  {e128['plan']:.3f}; **192**: {e192['step_ms']:.2f} ms, {e192['plan']:.3f}.
- **The cost.** Each extra slot per GPU is one more expert in every one of the
  {e0['layers']} MoE layers: {params:,} parameters x 1 B (FP8) x {e0['layers']} =
  {per_slot / 1e9:.3f} GB per GPU by hand (in BF16, 88,080,384 B per replica per layer);
  the table's weights grow by {(e64['weights'] - e0['weights']) / 1e9:.3f},
  {(e128['weights'] - e0['weights']) / 1e9:.3f} and {(e192['weights'] - e0['weights']) / 1e9:.3f}
  GB. That room comes out of the KV cache: at {e0['kv_req'] / 2**20:.2f} MiB of KV per
  request, the largest batch per GPU drops from {e0['batch']} to {e64['batch']},
  {e128['batch']} and {e192['batch']} requests ({lost[0]}, {lost[1]} and {lost[2]} fewer).
  The shipped batch of 256 still fits in every row, so the step does not pay for it; a
  deployment running at its memory limit would.
- **Hierarchical mode** with DeepSeek-V3's 8 expert groups (``groups: 8``; ``mode: auto``
  would pick it, since 8 nodes divide 8 groups) and 64 redundant: {hier['step_ms']:.2f}
  ms, plan max/mean {hier['plan']:.3f}: the hot group stays on one node's 8 GPUs and its
  replicas too, the same trap as in training. The rows above set ``mode: global``.
"""


def in_short(rows: list[dict], srows: list[dict], rrows: list[dict]) -> list[str]:
    """The answer in five lines, its figures taken from both tables."""
    r = {x["label"]: x for x in rows}
    s = {x["label"]: x for x in srows}
    bal, hot = r["balanced router (uniform)"], r["hot: 26 of 256 experts take 90 %"]
    cf1, g0 = r["capacity factor 1.0"], r["EPLB global, 0 redundant"]
    dep_e = r["DeepEP: EPLB global, 0 redundant"]
    sb, sh = s["balanced router (uniform)"], s["hot: 26 of 256 take 90 %"]
    s0, s64 = s["EPLB global, 0 redundant"], s["EPLB global, 64 redundant"]
    return [
        "In short (figures from the tables below):", "",
        f"- **The step** waits for the GPUs holding the hot experts (the summary's top "
        f"stall: \"{hot['reason']}\"): a training step goes from {bal['step_ms']:.1f} to "
        f"{hot['step_ms']:.1f} ms ({hot['step_ms'] / bal['step_ms']:.2f}x), a decode step "
        f"from {sb['step_ms']:.2f} to {sh['step_ms']:.2f} ms "
        f"({sh['step_ms'] / sb['step_ms']:.2f}x).",
        f"- **Without hurting the model, in training**: EPLB re-packing (0 redundant, "
        f"global) {g0['step_ms']:.1f} ms, with DeepEP {dep_e['step_ms']:.1f} ms; every token "
        f"reaches its experts. A capacity factor of 1.0 is faster ({cf1['step_ms']:.1f} ms) "
        f"only by dropping {cf1['dropped'] / cf1['assigned']:.1%} of the (token, expert) "
        f"assignments, which does change the model. Perfect balancing (what an aux loss or "
        f"bias balancing could buy at most): {bal['step_ms']:.1f} ms.",
        f"- **In serving**: re-packing {s0['step_ms']:.2f} ms; 64 redundant experts "
        f"{s64['step_ms']:.2f} ms for {(s64['weights'] - s0['weights']) / 1e9:.2f} GB more "
        f"weights per GPU (largest batch {s0['batch']} -> {s64['batch']} requests per GPU).",
        f"- **Redundant experts in training** cost more than they buy on this step: "
        f"32, 64 and 128 of them take it from {rrows[0]['step_ms']:.1f} to "
        f"{rrows[1]['step_ms']:.1f}, {rrows[2]['step_ms']:.1f} and {rrows[3]['step_ms']:.1f} "
        f"ms, since each replica's gradient must be all-reduced with its other replicas' "
        f"across nodes ({rrows[2]['sync']['ms']:.1f} ms priced alone on the busiest GPU "
        f"at 64) and each holds its own optimizer state.",
        "- **Node-limited routing** does not fix it: with DeepEP it trims inter-node bytes, "
        "not the hot GPUs' rows. Hierarchical EPLB keeps the hot expert group on one node "
        "and fails here too.", ""]


def rl_table() -> list[str]:
    """The same skew on a shipped RL scenario (``moesim rl``): redundant 0 only."""
    out = ["| scenario | routing | step (s) | tokens/s per GPU | generate (s) | old log-probs "
           "(s) | train (s) |", "|---|---|---|---|---|---|---|"]
    for label, sets in RL_CASES:
        s = cli_summary("rl", "grpo-qwen3-30b-a3b", sets)
        ph = s["phases_s"]
        out.append(f"| grpo-qwen3-30b-a3b | {label} | {s['step_time_s']:.4g} | "
                   f"{s['tokens_per_s_per_gpu']:,.0f} | {ph['generate']:.1f} | "
                   f"{ph['old_logprob']:.1f} | {ph['train']:.1f} |")
        print(f"rl {label}: {s['step_time_s']:.4g} s", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true", help=f"write {PAGE.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    t0, c0 = time.perf_counter(), time.process_time()
    from results_page import machine_line  # this folder

    started = machine_line()
    rows = []
    for label, routing, *par in CASES:
        t = time.perf_counter()
        rows.append(row(label, routing, *par))
        print(f"{label}: step {rows[-1]['step_ms']:.1f} ms ({time.perf_counter() - t:.1f} s wall)",
              file=sys.stderr)
    base = rows[1]["step_ms"]
    spec = resolved(HOT).model
    params = int(ffn_params(spec, spec.expert_ffn))
    rrows = redundant_rows(lambda label, routing: row(label, {**HOT, **routing}))
    srows = serve_rows()
    lines = ["# Fixing a hot expert in training and serving: capacity factor, EPLB, node-limited "
             "routing", "",
             "HEADER", "",
             "The seed's question: \"Your MoE router sends 90 % of tokens to 10 % of the "
             "experts. What happens to the step, and how do you fix it without hurting the "
             "model?\"", ""]
    lines += in_short(rows, srows, rrows)
    lines += ["## Training", "",
              "Reduced DeepSeek-V3 (4 MoE layers, 256 experts, top-8) on 32 H800 (4 DGX H800 "
              "nodes), EP32, 2 x 4,096 tokens per GPU, FP8 GEMMs and dispatch, fast engine, "
              "one training step. 26 experts (10.2 % of 256) take 90 % of the routed "
              "(token, expert) assignments. Times are per step (ms); breakdowns are means "
              "over the 32 GPUs; GPU tokens are the expert rows each GPU of the EP group "
              "computes in the forward passes of the step; the EPLB plan column is the "
              "summary's `eplb.max_over_mean_mean` (and `eplb.mode`). DeepEP rows use its "
              "normal kernels with 20 SMs.", ""]
    lines += table(rows, base)
    lines += ["", "Top stall cause per setting (the summary's `stalls.top[0].reason`):", ""]
    lines += [f"- {r['label']}: {r['reason']}" for r in rows]
    lines += [analysis(rows)]
    lines += ["## Training with redundant experts", "",
              "The same hot step with EPLB's redundant experts (``routing.placement: {kind: "
              "eplb, redundant: N}``): EP32 takes N such that 256 + N is a multiple of 32. "
              "Step, stall and gradient times are the summary's (means over the 32 GPUs); "
              "the replica columns come from the step plan's replica all-reduces "
              "(``moesim.program.replica_grads``), each priced alone by the fast engine's "
              "ring pricing on the topology, summed over the ones the busiest GPU joins; "
              "peak memory is the summary's largest per-GPU peak.", ""]
    lines += redundant_table(rrows)
    lines += [redundant_analysis(rrows, params, full_moe_layers())]
    lines += [SERVE_INTRO]
    lines += serve_table(srows)
    lines += ["", "Top stall cause per serving setting (`stalls.top[0].reason`):", ""]
    lines += [f"- {r['label']}: {r['reason']}" for r in srows]
    lines += [serve_analysis(srows, params)]
    lines += ["## RL", "",
              "`moesim rl grpo-qwen3-30b-a3b` (GRPO on Qwen3-30B-A3B) runs its trainer on "
              "the same routing section; the rows here re-pack only (redundant 0):", ""]
    lines += rl_table()
    lines += ["", "Generation reads only the experts a step's tokens reach: the skewed "
              "router touches fewer experts per decode step, so the RL generate phase is "
              "shorter with the skew than with the balanced router, while the log-prob and "
              "training passes slow down from the imbalance. EPLB's re-packing removes most "
              "of the imbalance and keeps the decode saving; a real router's skew would also "
              "change the model, which moesim does not model."]
    header = (f"Generated by `python benchmarks/hot_expert_study.py --write-docs` (started "
              f"{started}; {time.perf_counter() - t0:.0f} s wall, "
              f"{time.process_time() - c0:.0f} s CPU).")
    lines[2] = header
    text = "\n".join(lines).rstrip() + "\n"
    print(text)
    print(f"wall {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.write_docs:
        write_text(PAGE, text, force=True)
        print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
