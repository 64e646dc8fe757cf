"""Every published figure moesim is compared against, with its error: the table of
docs/results/published.md (issue 21).

    python benchmarks/published_table.py                         # print the table
    python benchmarks/published_table.py --profile PATH/train.json --write docs/results/published.md
    python benchmarks/published_table.py --json out.json         # the figures as JSON
    python benchmarks/published_table.py --before before.json    # add a "before" column

Each figure is one ``moesim run ... --json`` (or ``moesim validate --json`` for
DeepSeek's profile) in a child process, with the scenario and ``--set`` shown. Nothing in
moesim is fitted to any of them: the error is (moesim - published) / published.

Published figures (original sources; docs/sources.md):

- DeepSeek-V3 on 2048 H800: 19.9 s per step. DeepSeek-V3 Technical Report
  (arXiv:2412.19437) §1: 180K H800 GPU hours per trillion tokens; §4.2: final batch
  15360 × 4096 tokens; 15360 · 4096 · 180e3 / 1e12 · 3600 / 2048 s. The GPU hours are
  wall time on the cluster ("3.7 days on our cluster"; pre-training 2664K GPU hours,
  Table 1), so the figure holds failures, restarts and checkpoints: the row after the
  step runs it as a campaign (``benchmarks/deepseek_campaign.py``) and compares wall
  clock per step.
- DeepSeek's profile of one DualPipe F&B pair (github.com/deepseek-ai/profile-data,
  train.json; H800, EP64, 4 MoE layers per chunk): span, compute-stream busy time and
  exposed communication as moesim's GPU ingest reads them (needs ``--profile``).
- Mixtral 8x7B BF16 on H100 with Megatron-Core v0.9: 468 TFLOP/s per GPU
  (NVIDIA/Megatron-LM ``megatron/core/transformer/moe/README.md``, commit c230e0d7).
  The README does not say which run gave the figure; it publishes beside it an example
  that trains Mixtral 8x7B on 32 H100 (TP1 PP4 EP8, micro-batch 1, global batch 128,
  sequence 4096, aux-loss balancing, measured after the early imbalance has settled):
  ``mixtral-8x7b-mcore`` writes that example field by field. ``mixtral-8x7b-64gpu``
  (64 GPUs, PP4 interleaved, zipf 0.5 routing) was our earlier guess and stays in the
  table, labelled so. TFLOP/s per GPU = moesim's model FLOPs (every GEMM and attention
  FLOP of the step, no recomputation) / step / GPUs.
- DeepSeek-V3 on 1024 H100, FP8, Megatron-Bridge (NeMo 25.09, "DeepSeekV3 (dropless)":
  GBS 8192, MBS 1, sequence 4096, TP2 PP8 VP4 EP64, forced-balanced routing): 1297
  tokens/s per GPU, 338 TFLOP/s per GPU (NVIDIA-NeMo/Megatron-Bridge
  ``docs/performance-summary.md``). ``deepseek-v3-1024-h100`` writes the recipe that ran
  it field by field (Megatron-Bridge fa0315ae2, ``scripts/performance/run_script.py``:
  layout "Et|(tt|)*30mL" with one MTP layer, sequence parallelism, DeepEP with forced
  balance, EP a2a overlap in 1F1B, recompute of the MLA up-projections and the dense
  MLPs, no overlap of the gradient reduce). Its FP8 GEMMs are Transformer Engine's
  (cuBLAS, per-tensor current scaling), priced by the catalog's default tables.
- DeepSeek-V3 on 1024 H100 in BF16, measured by NVIDIA for Megatron-Bridge's model card
  (``examples/model_verification_cards/deepseek-v3/card.yaml``, pretrain_performance.H100:
  the recipe ``deepseek_v3_pretrain_1024gpu_h100_bf16_config``, TP2 PP8 VP4 EP64, GBS
  16384, HybridEP on 16 SMs, no EP overlap; steps 41-50: 61,756 ms, 1061.2 tokens/s and
  276.0 TFLOP/s per GPU): ``deepseek-v3-1024-h100`` with the recipe's differences set.
- Qwen3 MoE pre-training on DGX-H100 in FP8 (Transformer Engine's per-tensor current
  scaling), Megatron-Bridge's performance summary (``docs/performance-summary-archive.md``,
  forced-balanced routing, dropless): Qwen3-30B-A3B on 16 GPUs (NeMo 26.04.01, tag v0.4.2:
  GBS 1024, MBS 1, sequence 4096, TP1 PP1 EP16, HybridEP) 8960 tokens/s and 206 TFLOP/s
  per GPU; Qwen3-235B-A22B on 256 GPUs (NeMo 25.11, 00b7660be: GBS 2048, MBS 1, TP2 PP8
  VP4 EP32, the all-to-all dispatcher with Megatron's EP overlap in 1F1B) 1575 tokens/s
  and 233 TFLOP/s per GPU. ``qwen3-30b-a3b-16-h100`` and ``qwen3-235b-256-h100-fp8``
  write the recipes field by field. The same 30B layout measured in BF16 (Megatron-Bridge
  ``skills/nemo-mbridge-perf-moe-comm-overlap/card.yaml`` at 7ded17da, PR 5094: HybridEP,
  no EP overlap, CUDA graphs of the router and preprocessing): step 24.714 s, 244.0
  TFLOP/s per GPU, and rank 0's profile, from which the page derives the communication
  kernels' time, the compute and the GPU's idle time for a comparison by part; and with
  Megatron's all-to-all dispatcher (NCCL) instead of HybridEP (``docs/training/
  cuda-graphs.md`` and ``communication-overlap.md`` at 302976773): 41.36 s eager, 31.31 s
  with the EP overlap (permute fusion off).
- cuBLAS GEMMs on an H200 NVL, BF16 and FP8 per-tensor scaling, the per-pass sums of the
  twelve GEMMs of one layer (hidden 4096, intermediate 16384, 15,872 tokens), kernels
  alone (NVIDIA/TransformerEngine ``docs/examples/gemm_profiling/gemm_profiling.rst``,
  commit 1609c890e), and the best GEMM of a shape search on A100 and H100 (stas00/
  ml-engineering's MAMF table): ``benchmarks/gemm_published.py``, priced in this process.
- DeepSeek-V3 decode on GB200 NVL72 with SGLang (LMSYS blogs "Deploying DeepSeek on GB200
  NVL72 with PD and Large Scale EP", part I 2025-06-16 and part II 2025-09-25;
  lm-sys/lm-sys.github.io blog/2025-06-16-gb200-part-1.md, blog/2025-09-25-gb200-part-2.md):
  output tokens/s per GPU for 2000-token inputs on 48 decode ranks: part II 9,087 (BF16
  attention, FP8 MoE) and 13,386 (FP8 KV cache, NVFP4 MoE, batch 1408); part I 7,583 (no
  batch size published). ``deepseek-v3-decode-gb200`` and ``-nvfp4`` write the settings
  (EP64 standing for 48 ranks; docs/blackwell.md), ``moesim serve``.
- DeepSeek-V3 pre-training on 256 GB200 (BF16, TP1 PP4 VP4 EP64: 3139 tokens/s, 782 TFLOP/s
  per GPU) and on 256 B200 (MXFP8, TP1 PP16 EP8: 2139 tokens/s, 557 TFLOP/s per GPU):
  Megatron-Bridge ``docs/performance-summary.md`` (NeMo 25.11 container, commit 00b7660be),
  recipes in ``scripts/performance/configs/deepseek/deepseek_workload_base_configs.py``;
  ``deepseek-v3-256-gb200``, ``deepseek-v3-256-b200``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemm_published  # noqa: E402  (this folder)
import megatron_moe_h100  # noqa: E402  (this folder)
from bench_deepseek import PUBLISHED_STEP_S  # noqa: E402  (this folder)
from deepseek_campaign import PUBLISHED_DAYS, campaign_wall  # noqa: E402  (this folder)

RUNS = {
    "deepseek-v3-2048": ("deepseek-v3-2048", []),
    "mixtral-8x7b-mcore": ("mixtral-8x7b-mcore", []),
    "mixtral-8x7b-64gpu": ("mixtral-8x7b-64gpu", []),
    "deepseek-v3-1024-h100": ("deepseek-v3-1024-h100", []),
    "deepseek-v3-decode-gb200": ("deepseek-v3-decode-gb200", []),
    "deepseek-v3-decode-gb200-nvfp4": ("deepseek-v3-decode-gb200-nvfp4", []),
    "deepseek-v3-256-gb200": ("deepseek-v3-256-gb200", []),
    "deepseek-v3-256-b200": ("deepseek-v3-256-b200", []),
    "qwen3-30b-a3b-16-h100": ("qwen3-30b-a3b-16-h100", []),
    "qwen3-235b-256-h100-fp8": ("qwen3-235b-256-h100-fp8", []),
    "qwen3-30b-a3b-16-h100-bf16": ("qwen3-30b-a3b-16-h100", ["compute.precision=bf16"]),
    "qwen3-30b-a3b-16-h100-bf16-overlap": ("qwen3-30b-a3b-16-h100", [
        "compute.precision=bf16", "overlap.kind=a2a-1f1b"]),
    # the 30B layout with Megatron's all-to-all dispatcher (NCCL), without and with EP overlap
    "qwen3-30b-a3b-16-h100-bf16-a2a": ("qwen3-30b-a3b-16-h100", [
        "compute.precision=bf16", "parallel.ep_backend.kind=nccl"]),
    "qwen3-30b-a3b-16-h100-bf16-a2a-overlap": ("qwen3-30b-a3b-16-h100", [
        "compute.precision=bf16", "parallel.ep_backend.kind=nccl", "overlap.kind=a2a-1f1b"]),
    # Megatron-Bridge's BF16 recipe of the same layout (deepseek_v3_pretrain_1024gpu_h100_
    # bf16_config): GBS 16384 (256 micro-batches a replica), HybridEP on 16 SMs, no EP
    # overlap, no overlapped gradient reduce; the rest as the FP8 scenario
    "deepseek-v3-1024-h100-bf16": ("deepseek-v3-1024-h100", [
        "compute.precision=bf16", "schedule.microbatches=256",
        "parallel.ep_backend.kind=hybridep", "parallel.ep_backend.sms=16",
        "overlap.kind=none", "overlap.dp_overlap=false"]),
}
#: runs of ``moesim serve`` (one decode step), the rest ``moesim run``
SERVE_RUNS = {"deepseek-v3-decode-gb200", "deepseek-v3-decode-gb200-nvfp4"}


#: --runs-dir: the JSON outputs of the same commands, by file name
RUN_FILES = {"deepseek-v3-2048": "ds_shipped.json", "mixtral-8x7b-64gpu": "mixtral64.json",
             "mixtral-8x7b-mcore": "mixtral_mcore.json",
             "deepseek-v3-1024-h100": "ds1024.json", "validate": "validate.json",
             "deepseek-v3-decode-gb200": "gb200_decode.json",
             "deepseek-v3-decode-gb200-nvfp4": "gb200_decode_nvfp4.json",
             "deepseek-v3-256-gb200": "gb200_train.json", "deepseek-v3-256-b200": "b200_train.json",
             "qwen3-30b-a3b-16-h100": "qwen3_30b_h100.json",
             "qwen3-235b-256-h100-fp8": "qwen3_235b_h100.json",
             "qwen3-30b-a3b-16-h100-bf16": "qwen3_30b_h100_bf16.json",
             "qwen3-30b-a3b-16-h100-bf16-overlap": "qwen3_30b_h100_bf16_overlap.json",
             "deepseek-v3-1024-h100-bf16": "ds1024_bf16.json",
             "qwen3-30b-a3b-16-h100-bf16-a2a": "qwen3_30b_h100_a2a.json",
             "qwen3-30b-a3b-16-h100-bf16-a2a-overlap": "qwen3_30b_h100_a2a_overlap.json"}
RUNS_DIR: Path | None = None
ONLY_SAVED = False


def moesim(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-m", "moesim", *args], capture_output=True,
                       text=True, cwd=ROOT, check=False)
    if p.returncode:
        raise SystemExit(f"moesim {' '.join(args)}: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout)


def run(name: str) -> dict:
    if RUNS_DIR is not None and (RUNS_DIR / RUN_FILES[name]).is_file():
        return json.loads((RUNS_DIR / RUN_FILES[name]).read_text())
    if ONLY_SAVED:
        return None
    scn, sets = RUNS[name]
    args = ["serve" if name in SERVE_RUNS else "run", scn, "--no-files", "--json", "--quiet"]
    for s in sets:
        args += ["--set", s]
    t = time.perf_counter()
    d = moesim(args)
    print(f"  {name}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return d


def figures(profile: str | None) -> list[dict]:
    """[{figure, source, published, moesim, unit}] measured now."""
    out = []
    d = run("deepseek-v3-2048")
    if d is not None:
        b = d["breakdown_s"]
        out.append({"figure": "DeepSeek-V3, 2048 H800: step (MTP D = 1; stages 3 + 4 x 14 + 2, "
                    "moesim's split)", "unit": "s",
                    "published": PUBLISHED_STEP_S, "moesim": d["step_time_s"],
                    "source": "DeepSeek-V3 report §1, §2.2, §4.2",
                    "parts": {"compute": b["compute"], "ep_dispatch+combine":
                              b["ep_dispatch"] + b["ep_combine"], "bubble": b["bubble"],
                              "stall": b["stall"]}})
        c = campaign_wall(d["step_time_s"])
        out.append({"figure": "DeepSeek-V3, 2048 H800: wall clock per step over the 14.8T-token "
                    f"pre-training (the step above as a campaign: moesim train's defaults, "
                    f"ETTR {c['ettr']:.1%}, {c['wall_days']:.1f} of the published "
                    f"{PUBLISHED_DAYS:.1f} days; mean of {c['seeds']} seeds)", "unit": "s",
                    "published": PUBLISHED_STEP_S, "moesim": c["wall_step_s"],
                    "source": "DeepSeek-V3 report §1, Table 1, §4.2"})
    for name, figure in (
            ("mixtral-8x7b-mcore", "Mixtral 8x7B, H100 BF16: TFLOP/s per GPU, Megatron-Core's "
             "example (32 GPUs, PP4 EP8, balanced)"),
            ("mixtral-8x7b-64gpu", "Mixtral 8x7B, 64 H100 BF16: TFLOP/s per GPU")):
        d = run(name)
        if d is not None:
            out.append({"figure": figure, "unit": "TFLOP/s", "published": 468.0,
                        "moesim": megatron_moe_h100.tflops_per_gpu(d),
                        "source": "Megatron-Core MoE README (MCore v0.9)"
                        + ("" if name == "mixtral-8x7b-mcore" else
                           "; moesim's earlier guess at the layout, zipf 0.5 routing")})
    d = run("deepseek-v3-1024-h100")
    if d is not None:
        src = "Megatron-Bridge performance summary (NeMo 25.09, DGX-H100)"
        out.append({"figure": "DeepSeek-V3, 1024 H100 FP8: tokens/s per GPU",
                    "unit": "tokens/s", "published": 1297.0,
                    "moesim": d["tokens_per_s"] / d["world"], "source": src})
        out.append({"figure": "DeepSeek-V3, 1024 H100 FP8: TFLOP/s per GPU", "unit": "TFLOP/s",
                    "published": 338.0, "moesim": megatron_moe_h100.tflops_per_gpu(d),
                    "source": src})
    out += megatron_moe_h100.figures(run)
    out += serving_figures()
    out += blackwell_figures()
    for r in gemm_published.rows():
        dt = "BF16" if r["dtype"] == "bf16" else "FP8 per-tensor"
        out.append({"figure": f"cuBLAS GEMMs, H200 NVL {dt}: one layer's "
                    f"{gemm_published.PASS_NAMES[r['pass']]} (4 GEMMs)", "unit": "ms",
                    "published": r["published_ms"], "moesim": r["moesim_ms"],
                    "source": "Transformer Engine GEMM-profiling guide (pre-quantized)"})
    for r in gemm_published.mamf_rows():
        m, n, k = r["shape"]
        out.append({"figure": f"cuBLAS GEMM, {r['device']} {r['dtype'].upper()}: "
                    f"{m}x{n}x{k}, the best shape of a search", "unit": "TFLOP/s",
                    "published": r["published_tflops"], "moesim": r["moesim_tflops"],
                    "source": "ml-engineering MAMF table (mamf-finder.py)"})
    if profile:
        saved = RUNS_DIR / RUN_FILES["validate"] if RUNS_DIR is not None else None
        v = (json.loads(saved.read_text()) if saved is not None and saved.is_file() else
             moesim(["validate", str(Path(profile).resolve()), "--scenario",
                     "scenarios/deepseek-v3-fb-pair.yaml",
                     "--json"]))
        m, s = v["measured"], v["simulated"]
        src = "DeepSeek profile-data train.json (GPU ingest)"
        out += [
            {"figure": "DeepSeek F&B pair (H800): span", "unit": "ms", "source": src,
             "published": m["span_s"] * 1e3, "moesim": s["span_s"] * 1e3},
            {"figure": "DeepSeek F&B pair: compute streams busy", "unit": "ms", "source": src,
             "published": m["stream_busy_s"]["compute"] * 1e3,
             "moesim": s["stream_busy_s"]["compute"] * 1e3},
            {"figure": "DeepSeek F&B pair: exposed communication", "unit": "ms", "source": src,
             "published": m["exposed_comm_s"] * 1e3, "moesim": s["exposed_comm_s"] * 1e3},
        ]
        for p, e in v["median_abs_error_by_pass"].items():
            out.append({"figure": f"DeepSeek F&B pair: GEMM+attention per layer, median "
                        f"abs. error {p}", "unit": "", "source": src, "published": None,
                        "moesim": e})
        if v.get("kernel_classes"):
            out.append({"figure": "kernel classes", "unit": "table", "source": src,
                        "published": None, "moesim": None, "rows": v["kernel_classes"]["rows"]})
    return out


def serving_figures(steps: int = 5) -> list[dict]:
    """DeepSeek's day-6 decode and SGLang's H100 decode and prefill, measured as
    benchmarks/serving_published.py measures them (mean of ``steps`` routing steps; the
    prefill one step on the exact engine, which SGLang's prefill overlap order needs); the
    parts are on docs/results/serving-published.md."""
    if ONLY_SAVED:
        return []
    import serving_published as sp  # this folder
    out = []
    tpot, _, res, cfg = sp._mean_step("deepseek-v3-decode-production", [], steps)
    lo, hi = sp.DECODE_TOKENS_PER_S_PER_REQUEST
    out.append({"figure": "DeepSeek-V3 decode, day-6 production (EP144, 32 redundant experts, "
                "5-stage overlap, EPLB, MTP, DeepEP LL send/receive on the SMs): output "
                "tokens/s per request", "unit": "tokens/s",
                "published": (lo + hi) / 2, "moesim": 1 / tpot,
                "source": "DeepSeek open-infra-index day 6 (20-22 tokens/s; 21 taken)"})
    tpot, _, res, cfg = sp._mean_step("deepseek-v3-decode-sglang", [], steps)
    out.append({"figure": "DeepSeek-V3 decode, SGLang on 96 H100 (EP72, 32 redundant experts, "
                "EPLB, CUDA graphs, DeepEP LL send/receive on the SMs): output tokens/s "
                "per node", "unit": "tokens/s",
                "published": sp.SGLANG_TOKENS_PER_S_PER_NODE,
                "moesim": sp.decode_per_node(tpot, res, cfg),
                "source": "LMSYS blog, large-scale EP on 96 H100 (2025-05)"})
    ttft, _, res, cfg = sp._mean_step("deepseek-v3-prefill-sglang", [], 1)   # exact engine
    out.append({"figure": "DeepSeek-V3 prefill, SGLang on 96 H100: input tokens/s per node "
                "against \"Simulated Perfect EPLB\"", "unit": "tokens/s",
                "published": sp.SGLANG_PREFILL_PERFECT_EPLB_PER_NODE,
                "moesim": sp.prefill_per_node(ttft, res, cfg),
                "source": "LMSYS blog, large-scale EP on 96 H100 (2025-05)"})
    return out


def blackwell_figures() -> list[dict]:
    """SGLang's GB200 NVL72 decode and Megatron-Bridge's GB200 / B200 pre-training figures."""
    out = []
    sg1 = "SGLang GB200 blog, part I (LMSYS)"
    sg2 = "SGLang GB200 blog, part II (LMSYS)"
    d = run("deepseek-v3-decode-gb200")
    if d is not None:
        v = d["tokens_per_s_per_gpu"]
        out.append({"figure": "DeepSeek-V3 decode, GB200 NVL72 (SGLang, 48 ranks, BF16 "
                    "attention, FP8 MoE): output tokens/s per GPU", "unit": "tokens/s",
                    "published": 9087.0, "moesim": v, "source": sg2 + "; EP64 for 48, "
                    "batch by the blog's 'KV cache roughly full' rule"})
        out.append({"figure": "DeepSeek-V3 decode, GB200 NVL72 (SGLang, 48 ranks, 2000-token "
                    "input): output tokens/s per GPU", "unit": "tokens/s",
                    "published": 7583.0, "moesim": v, "source": sg1 + "; no batch size "
                    "published: part II's run above"})
    d = run("deepseek-v3-decode-gb200-nvfp4")
    if d is not None:
        out.append({"figure": "DeepSeek-V3 decode, GB200 NVL72 (SGLang, 48 ranks, FP8 KV, "
                    "NVFP4 MoE, batch 1408): output tokens/s per GPU", "unit": "tokens/s",
                    "published": 13386.0, "moesim": d["tokens_per_s_per_gpu"],
                    "source": sg2 + "; EP64 for 48"})
    src = "Megatron-Bridge performance summary (NeMo 25.11, DGX-{})"
    for name, sys_, prec, tok, tfl in (("deepseek-v3-256-gb200", "GB200", "BF16", 3139.0, 782.0),
                                       ("deepseek-v3-256-b200", "B200", "MXFP8", 2139.0, 557.0)):
        d = run(name)
        if d is None:
            continue
        out.append({"figure": f"DeepSeek-V3, 256 {sys_} {prec}: tokens/s per GPU",
                    "unit": "tokens/s", "published": tok,
                    "moesim": d["tokens_per_s"] / d["world"], "source": src.format(sys_)})
        out.append({"figure": f"DeepSeek-V3, 256 {sys_} {prec}: TFLOP/s per GPU",
                    "unit": "TFLOP/s", "published": tfl,
                    "moesim": megatron_moe_h100.tflops_per_gpu(d), "source": src.format(sys_)})
    return out


def _num(x, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x:.1%}" if unit == "" else f"{x:,.2f}"


def table(rows: list[dict], before: dict[str, dict] | None) -> list[str]:
    head = "| figure | source | published | moesim | error |"
    sep = "|---|---|---|---|---|"
    if before:
        head += " before (moesim) | before error |"
        sep += "---|---|"
    lines = [head, sep]
    for r in rows:
        if r["unit"] == "table":
            continue
        u = r["unit"]
        err = (r["moesim"] - r["published"]) / r["published"] if r["published"] else None
        cells = [f"{r['figure']}" + (f" ({u})" if u else ""), r["source"],
                 _num(r["published"], u), _num(r["moesim"], u),
                 "-" if err is None else f"{err:+.1%}"]
        if before:
            b = before.get(r["figure"])
            be = (None if b is None or not r["published"] else
                  (b["moesim"] - r["published"]) / r["published"])
            cells += [_num(b["moesim"], u) if b else "-", "-" if be is None else f"{be:+.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="DeepSeek's train.json (github.com/deepseek-ai/profile-data)")
    ap.add_argument("--json", help="also write the figures as JSON here")
    ap.add_argument("--before", help="figures JSON of an earlier revision: a before column")
    ap.add_argument("--write", help="write the markdown page here (e.g. docs/results/published.md)")
    ap.add_argument("--runs-dir", help="reuse the JSON outputs of the same runs saved here "
                    f"({', '.join(RUN_FILES.values())}) instead of running them")
    ap.add_argument("--note", default="", help="a paragraph appended to the page (how the "
                    "saved runs were made)")
    ap.add_argument("--only-saved", action="store_true",
                    help="with --runs-dir: leave out the figures whose run is not saved there")
    args = ap.parse_args(argv)
    global RUNS_DIR, ONLY_SAVED
    RUNS_DIR = Path(args.runs_dir) if args.runs_dir else None
    ONLY_SAVED = args.only_saved
    t0 = time.perf_counter()
    rows = figures(args.profile)
    before = None
    if args.before:
        before = {r["figure"]: r for r in json.loads(Path(args.before).read_text())}
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    load = os.getloadavg()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = [
        "# Published figures against moesim",
        "",
        f"Generated by `python benchmarks/published_table.py` on {stamp}, load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min), "
        f"{time.perf_counter() - t0:.0f} s. Error = (moesim - published) / published; "
        "nothing is fitted to these figures. Sources: the benchmark's docstring and "
        "docs/sources.md; why figures moved: docs/kernels.md.",
        "",
        *table(rows, before),
        "",
    ]
    for r in rows:
        if r["unit"] != "table":
            continue
        body += ["DeepSeek's F&B pair, mean kernel time per layer by pass and class (ms; "
                 "`moesim validate` / `python benchmarks/deepseek_profile.py`):", "",
                 "| pass | class | measured | moesim | error |", "|---|---|---|---|---|"]
        for c in r["rows"]:
            err = "-" if c["error"] is None else f"{c['error']:+.1%}"
            body.append(f"| {c['pass']} | {c['class']} | {c['measured_s'] * 1e3:.3f} | "
                        f"{c['simulated_s'] * 1e3:.3f} | {err} |")
        body.append("")
    parts = [r for r in rows if "parts" in r]
    for r in parts:
        body.append(f"{r['figure']}, mean over ranks: " + ", ".join(
            f"{k} {v:.2f} s" for k, v in r["parts"].items()))
        if r.get("measured_parts"):
            body.append("")
            body.append("Measured (rank 0's profile; derived from the card's figures, "
                        "benchmarks/megatron_moe_h100.py `qwen3_30b_bf16_parts`): " + ", ".join(
                            f"{k} {v:.2f} s" for k, v in r["measured_parts"].items())
                        + " (the card rounds the overlapped share to 0.11 % or 36.55 %: "
                        "without the overlap the communication kernels lie between 7.9 and "
                        "8.6 s)")
        body.append("")
    if args.note:
        body += [args.note, ""]
    text = "\n".join(body)
    if args.write:
        Path(args.write).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
