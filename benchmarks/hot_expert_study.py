"""The seed's question: "Your MoE router sends 90 % of tokens to 10 % of the experts. What
happens to the step, and how do you fix it without hurting the model?"

    python benchmarks/hot_expert_study.py
    python benchmarks/hot_expert_study.py --write-docs   # docs/studies/hot-expert-fixes.md

A reduced DeepSeek-V3 (the shipped preset's dimensions, 4 layers all MoE: 256 experts,
top-8) trains on 32 H800 GPUs (4 DGX H800 nodes, topologies/dgx-h800.yaml), EP32 (8
experts per GPU), 2 micro-batches of 4,096 tokens per GPU, FP8 GEMMs and dispatch, on
the fast engine. 26 experts (10.2 % of 256) take 90 % of the routed (token, expert)
assignments (``routing.kind: hot``). Each fix is one routing setting on that step:
capacity factor (tokens dropped), EPLB with N redundant experts (``routing.placement``,
hierarchical and global), node-limited routing (``routing.max_nodes``); the balanced
router is the ceiling an auxiliary loss could reach. Prints wall time, each figure with
its unit; then the same knob on a shipped serving and RL scenario. About two minutes of
CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from moesim.cli import main as moesim
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


def plan_figure(res) -> str:
    pl = Builder(res, 0).routes.placement
    plan = getattr(pl, "plan", None)
    return "–" if plan is None else f"{plan.max_over_mean.mean():.3f} ({plan.mode})"


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
            "plan": plan_figure(res), "dropped": int(s["experts"]["dropped_total"]),
            "assigned": assigned, "lb": float(s["experts"]["lb_loss_mean"]),
            "reason": top[0].get("reason", "–"), "gib": s["memory"]}


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
    ("EPLB global, 32 redundant", {**HOT, "placement": {"kind": "eplb", "redundant": 32,
                                                        "mode": "global"}}),
    ("EPLB global, 64 redundant", {**HOT, "placement": {"kind": "eplb", "redundant": 64,
                                                        "mode": "global"}}),
    ("EPLB hierarchical (8 groups), 32 redundant",
     {**HOT, "placement": {"kind": "eplb", "redundant": 32, "mode": "hierarchical",
                           "groups": 8}}),
    ("EPLB global, 32 redundant, loads: trace",
     {**HOT, "placement": {"kind": "eplb", "redundant": 32, "mode": "global",
                           "loads": "trace"}}),
    ("node-limited routing, max_nodes 2", {**HOT, "max_nodes": 2}),
    ("node-limited routing, max_nodes 1", {**HOT, "max_nodes": 1}),
    ("EPLB global 32 + max_nodes 2", {**HOT, "max_nodes": 2, "placement": {
        "kind": "eplb", "redundant": 32, "mode": "global"}}),
    ("DeepEP: hot", HOT, DEEPEP),
    ("DeepEP: max_nodes 2", {**HOT, "max_nodes": 2}, DEEPEP),
    ("DeepEP: max_nodes 1", {**HOT, "max_nodes": 1}, DEEPEP),
    ("DeepEP: EPLB global, 0 redundant", {**HOT, "placement": {"kind": "eplb",
                                                              "mode": "global"}}, DEEPEP),
]

def analysis(rows: list[dict], params: int) -> str:
    """The reading of the table, its figures taken from the rows."""
    r = {x["label"]: x for x in rows}
    bal, hot = r["balanced router (uniform)"], r["hot: 26 of 256 experts take 90 %"]
    cf1, cf2 = r["capacity factor 1.0"], r["capacity factor 2.0"]
    g0, g32, g64 = (r[f"EPLB global, {n} redundant"] for n in (0, 32, 64))
    hier = r["EPLB hierarchical (8 groups), 32 redundant"]
    nl1, dep, dep1 = (r["node-limited routing, max_nodes 1"], r["DeepEP: hot"],
                      r["DeepEP: max_nodes 1"])
    dep_e = r["DeepEP: EPLB global, 0 redundant"]
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

## What each fix buys

- **Capacity factor** caps each (source GPU, expert) at ceil(tokens x top-k / experts x
  factor) (Megatron-Core's get_capacity): at 1.0 the step is {cf1['step_ms']:.1f} ms,
  faster than the balanced router, because {cf1['dropped'] / cf1['assigned']:.1%} of the
  (token, expert) assignments are dropped (they skip their expert: a change to the
  model's output, not a free fix); at 2.0, {cf2['dropped'] / cf2['assigned']:.1%} are
  dropped and the step is {cf2['step_ms']:.1f} ms.
- **EPLB** (``routing.placement``) keeps every token. With 0 redundant experts
  (re-packing whole experts onto GPUs: at most one hot expert per GPU) the step is
  {g0['step_ms']:.1f} ms; with 32 redundant (one more slot per GPU) {g32['step_ms']:.1f}
  ms; with 64 {g64['step_ms']:.1f} ms (max/mean GPU rows {g0['gpu_mm']:.2f},
  {g32['gpu_mm']:.2f}, {g64['gpu_mm']:.2f}). The "EPLB plan" column is the algorithm's
  own max/mean (mean over layers), the "max/mean GPU tokens" column what the step
  computed: they agree up to the integer split of each source's tokens over an expert's
  replicas. A hot expert takes 0.9 / 26 = 3.46 % of all assignments against a GPU's
  mean of 1 / 32 = 3.125 %, so without replicas a GPU holding one is at least 1.11x the
  mean. 32 redundant slots do not lower the maximum: EPLB gives 20 hot experts 2
  replicas (1.73 % each) and 6 hot experts 3, and its packing (heaviest first, equal
  slot counts) puts two 1.73 % replicas on 8 GPUs, which then hold 3.46 % plus 7 cold
  experts, as before; 64 redundant slots (3 or 4 replicas per hot expert) do. The
  hierarchical mode with DeepSeek-V3's 8 expert groups does not help here
  ({hier['step_ms']:.1f} ms, max/mean {hier['gpu_mm']:.2f}): all 26 hot experts are in
  group 0, which it keeps on one node, so that node's 8 GPUs share 90 % of the rows.
  EPLB's own choice (``mode: auto``) would be this hierarchical mode, since 4 nodes divide
  8 groups: a skew concentrated in one group needs ``mode: global``.
- **Node-limited routing** (``max_nodes``) limits the nodes a token's experts span. With
  NCCL's all-to-all (one copy per (token, expert)) it changes which experts share a
  token, not the counts per (source, expert): max_nodes 1 gives {nl1['step_ms']:.1f} ms,
  the same step. With DeepEP's normal kernels (one RDMA copy per (token, node)) it cuts
  inter-node bytes: {dep['step_ms']:.1f} ms without, {dep1['step_ms']:.1f} ms with
  max_nodes 1; the hot GPUs' rows, and the stall, stay. DeepEP with EPLB's re-packing (0
  redundant; moesim refuses redundant experts with DeepEP's normal kernels, whose plan
  sends each token to one home GPU) gives {dep_e['step_ms']:.1f} ms.
- **Aux-loss weight**: moesim's router takes the skew as given (``routing.kind``); it
  has no learned router whose balance an auxiliary-loss weight (Switch Transformers
  arXiv:2101.03961 §2.2; DeepSeek-V3's bias-based balancing, report §2.1.2) would move
  over training steps. The "lb loss" column is the Switch loss E x sum f_i P_i of the
  routing as drawn ({hot['lb']:.2f} hot, {bal['lb']:.2f} balanced); the balanced-router
  row, {bal['step_ms']:.1f} ms, is the most a perfectly effective auxiliary loss could
  buy, at a cost in model quality moesim does not model.

## What EPLB costs that the step does not show

Each redundant expert is one more expert's weights on a GPU: {params:,} parameters per
expert per MoE layer ({params / 1e6:.1f} MB in FP8, {2 * params / 1e6:.1f} MB in BF16);
32 redundant experts on 32 GPUs put one more expert on each GPU in every MoE layer,
{2 * params * 58 / 1e9:.2f} GB in BF16 over DeepSeek-V3's 58 MoE layers. moesim's memory
model counts E / ep experts per GPU and does not add them; in training the replicas'
gradients must also be summed across their holders, and a re-placement moves weights:
neither is simulated.
"""


ZIPF = ["routing.kind=zipf", "routing.zipf_s=1.0"]
HOT_RL = ["routing.kind=hot", "routing.hot_experts=13", "routing.hot_fraction=0.9"]
OTHERS = [
    ("serve", "deepseek-v3-decode-sglang", "shipped (uniform routing)", []),
    ("serve", "deepseek-v3-decode-sglang", "zipf s = 1.0", ZIPF),
    ("serve", "deepseek-v3-decode-sglang", "zipf s = 1.0, EPLB 64 redundant",
     [*ZIPF, "routing.placement={kind: eplb, redundant: 64}"]),
    ("rl", "grpo-qwen3-30b-a3b", "shipped (uniform routing)", []),
    ("rl", "grpo-qwen3-30b-a3b", "13 of 128 experts take 90 %", HOT_RL),
    ("rl", "grpo-qwen3-30b-a3b", "13 of 128 take 90 %, EPLB 0 redundant",
     [*HOT_RL, "routing.placement={kind: eplb, redundant: 0}"]),
]


def other_rows() -> list[str]:
    """The same knob on a shipped serving and RL scenario (``moesim serve`` / ``rl``)."""
    out = ["| command | scenario | routing | step (s) | per-GPU throughput | detail |",
           "|---|---|---|---|---|---|"]
    for cmd, name, label, sets in OTHERS:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            args = [cmd, name, "-o", tmp, "--quiet"]
            for x in sets:
                args += ["--set", x]
            if moesim(args) != 0:
                raise SystemExit(f"moesim {' '.join(args)} failed")
            s = json.loads((Path(tmp) / "summary.json").read_text())
        rate = (f"{s['tokens_per_s_per_gpu']:,.0f} output tokens/s" if cmd == "serve"
                else f"{s['tokens_per_s_per_gpu']:,.0f} tokens/s")
        if cmd == "serve":
            b = s["breakdown_s"]
            detail = (f"compute {b['compute'] * 1e3:.1f} ms, EP dispatch + combine "
                      f"{(b['ep_dispatch'] + b['ep_combine']) * 1e3:.1f} ms (means)")
        else:
            ph = s["phases_s"]
            detail = (f"generate {ph['generate']:.1f} s, old log-probs "
                      f"{ph['old_logprob']:.1f} s, train {ph['train']:.1f} s")
        out.append(f"| moesim {cmd} | {name} | {label} | {s['step_time_s']:.4g} | {rate} | "
                   f"{detail} |")
        print(f"{cmd} {name} {label}: {s['step_time_s']:.4g} s", file=sys.stderr)
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
    lines = ["# Fixing a hot expert: capacity factor, EPLB, node-limited routing", "",
             "HEADER", "",
             "Reduced DeepSeek-V3 (4 MoE layers, 256 experts, top-8) on 32 H800 (4 DGX H800 "
             "nodes), EP32, 2 x 4,096 tokens per GPU, FP8 GEMMs and dispatch, fast engine, "
             "one training step. 26 experts (10.2 % of 256) take 90 % of the routed "
             "(token, expert) assignments. Times are per step (ms); breakdowns are means "
             "over the 32 GPUs; GPU tokens are the expert rows each GPU of the EP group "
             "computes in the forward passes of the step.", ""]
    lines += table(rows, base)
    lines += ["", "Top stall cause per setting (the summary's `stalls.top[0].reason`):", ""]
    lines += [f"- {r['label']}: {r['reason']}" for r in rows]
    lines += [analysis(rows, params)]
    lines += ["## The same knob in serving and RL", "",
              "`routing.placement` is read where every engine routes tokens, so `moesim "
              "serve` and `moesim rl` take it as they are (DeepSeek-V3 decode on 64 H100 "
              "with DeepEP's low-latency kernels; GRPO on Qwen3-30B-A3B, whose DeepEP "
              "normal kernels take no redundant experts, so EPLB only re-packs there):", ""]
    lines += other_rows()
    lines += ["", "Generation reads only the experts a step's tokens reach: the skewed "
              "router touches fewer experts per decode step, so the RL generate phase is "
              "shorter with the skew than with the balanced router, while the log-prob and "
              "training passes slow down from the imbalance. EPLB's re-packing removes the "
              "imbalance and keeps the decode saving, so that RL step comes out below the "
              "balanced one; a real router's skew would also change the model, which moesim "
              "does not model."]
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
