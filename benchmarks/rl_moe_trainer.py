"""What NeMo RL v0.3's Megatron-Core trainer runs for Qwen3-30B-A3B, and moesim's shared
MoE training step against an independent Megatron measurement of the same model.

    python benchmarks/rl_moe_trainer.py                # ~20 s of CPU
    python benchmarks/rl_moe_trainer.py --write-docs   # docs/results/rl-moe-trainer.md

Part 1 prints the MoE settings of NeMo RL v0.3's Qwen3-30B-A3B GRPO run as its code sets
them and how moesim prices each (sources in docs/sources.md, RL section). Part 2 runs
``moesim run`` (the shared training step the RL trainer is built on) on the two
Qwen3-30B-A3B Megatron-LM configurations alibaba/Pai-Megatron-Patch issue #643 measured on
H800 (2025-08-08: TP1 PP2 EP8, sequence 8,192, global batch 128, 16 GPUs: 10.361 s per
iteration, 6,325 tokens/GPU/s; TP1 PP4 EP4, global batch 256: 20.992 s, 6,244; expert TP
1, micro-batch 1, no recompute, ``--moe-expert-capacity-factor 1.0``, no CUDA graphs) and
prints the errors. Nothing is fitted.

Part 3 tests one explanation of the gap, that the small experts' GEMMs (N or K = 768)
are priced at the rates of large shapes: for each layout it prints every expert GEMM
as ``moesim kernels`` prices it (shape per expert, achieved TFLOP/s, % of the BF16
peak), their time per step on one rank, the uniform slowdown of the expert GEMMs alone
that would close the gap (to first order: their time per micro-batch and stage times
the 1F1B critical path of m + pp - 1 micro-batches), the bound on Megatron's per-layer
host sync, and a what-if run: the same step with every expert GEMM at half the rate
moesim gives it (a user catalog with a BF16 table at those rates; a sensitivity, not a
fit, and not a published rate); then the slowdown of all compute, or of the
all-to-all alone, that would close the gap (the gap over their time on the critical
path).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (setting, what NeMo RL v0.3.0 runs, where it is set, how moesim prices it)
SETTINGS = (
    ("moe_grouped_gemm", "true", "NeMo Qwen3MoEConfig (HFQwen3Importer)",
     "Transformer Engine GroupedLinear: one GEMM per local expert "
     "(compute.expert_launches per_expert, the trainer's default)"),
    ("moe_token_dispatcher_type", "alltoall", "NeMo Qwen3MoEConfig",
     "NCCL all-to-all over the EP group (parallel.ep_backend nccl)"),
    ("moe_permute_fusion", "true", "NeMo Qwen3MoEConfig",
     "fused permute kernels (moesim's default permutation)"),
    ("moe_router_dtype", "fp64", "grpo_math_1B_megatron.yaml -> megatron_policy_worker.py",
     "not priced: the router GEMM is 2 x 2,048 x 128 flops per token"),
    ("moe_router_load_balancing_type", "none (router frozen, bias rate 0)",
     "grpo_math_1B_megatron.yaml", "no aux loss kernels; routing.kind uniform"),
    ("expert capacity", "dropless (no moe_expert_capacity_factor)", "NeMo Qwen3MoEConfig",
     "dropless; balanced routing (no published load of this model on this data)"),
    ("apply_rope_fusion", "true", "grpo_math_1B_megatron.yaml", "fused RoPE"),
    ("bias and dropout", "none (add_bias_linear false, hidden/attention dropout 0.0)",
     "NeMo Qwen2Config (Qwen3MoEConfig's base)",
     "no bias or dropout kernels: bias-dropout fusion has nothing to fuse"),
    ("sequence_parallel", "true (TP2)", "grpo_math_qwen30ba3b_megatron.yaml",
     "parallel.sequence_parallel true"),
    ("grad_reduce_in_fp32", "false", "grpo_math_1B_megatron.yaml (DDP config)",
     "memory.grad_dtype bf16"),
    ("overlap_grad_reduce / overlap_param_gather", "true / true", "DDP config",
     "schedule dp_overlap (default true)"),
    ("use_distributed_optimizer", "true (precision-aware)", "grpo_math_1B_megatron.yaml",
     "parallel.zero 1"),
    ("host sync per MoE layer", "cuda_sync_point before_ep_alltoall",
     "Megatron-LM 2ff0f099 token_dispatcher.py (MoEAlltoAllTokenDispatcher)",
     "not priced (each launch pays its 4 us serially already)"),
)

#: alibaba/Pai-Megatron-Patch issue #643 (H800): (label, pp, ep, global batch, s/iteration)
PAI = (("TP1 PP2 EP8, GBS 128", 2, 8, 128, 10.361),
       ("TP1 PP4 EP4, GBS 256", 4, 4, 256, 20.992))
SEQ = 8192
GPUS = 16

SCENARIO = """name: qwen3-30b-a3b-pai-h800
seed: 0
cluster: {topology: dgx-h800, nodes: 2, device: H800}
model: {preset: qwen3-30b-a3b}
routing: {kind: uniform}
parallel: {tp: 1, pp: 2, ep: 8, etp: 1, zero: 1}
schedule: {kind: 1f1b, microbatches: 16, micro_batch_size: 1, seq_len: 8192}
compute: {kind: catalog}
memory: {recompute: none}
engine: {mode: fast}
"""


#: what-if: the expert GEMMs at 1 / WHAT_IF_SLOWDOWN of the rate moesim gives them
WHAT_IF_SLOWDOWN = 2.0


def expert_gemms(res) -> tuple[list[dict], int]:
    """The expert GEMM rows of the first MoE layer (``moesim kernels``) and its rows
    per expert."""
    from moesim.cli.kernels_cmd import inventory
    from moesim.program.inventory import PASSES
    doc = inventory(res, 0, PASSES)
    return ([r for r in doc["kernels"] if r["kernel"].startswith("expert_gemm")],
            int(doc["rows_per_expert"]))


def what_if_catalog(folder: Path, rows: list[tuple[int, int, list[dict]]],
                    launch_s: float) -> Path:
    """The shipped catalog plus one BF16 table pricing every expert GEMM of ``rows``
    ((local experts, rows per expert, kernel rows) per layout) at 1 / WHAT_IF_SLOWDOWN
    of its current rate."""
    from importlib import resources
    src = resources.files("moesim") / "data" / "kernels"
    folder.mkdir()
    for f in src.iterdir():
        if f.name.endswith(".yaml"):
            shutil.copy(str(f), folder / f.name)
    tabs: dict[tuple[str, tuple[str, ...]], set] = {}
    for groups, per, ks in rows:
        for r in ks:
            tflops = r["flops"] / (r["time_s"] - launch_s * r["launches"]) / 1e12
            n, k = (r["k"], r["n"]) if r["pass"] == "dgrad" else (r["n"], r["k"])
            key = (r["kind"], ("wgrad",) if r["pass"] == "wgrad" else ("fwd", "dgrad"))
            tabs.setdefault(key, set()).add(
                (groups, per, n, k, round(tflops / WHAT_IF_SLOWDOWN, 3)))
    lines = ["tables:"]
    for i, ((kind, passes), rws) in enumerate(sorted(tabs.items())):
        lines += [f"  - id: what-if-expert-{i}", f"    kind: {kind}", "    dtype: bf16",
                  f"    passes: [{', '.join(passes)}]", "    devices: [H800]",
                  "    above_range: hold", "    source: what-if, not a measurement",
                  "    columns: [groups, m_per_group, n, k, tflops]", "    rows:"]
        lines += [f"      - [{g}, {m}, {n}, {k}, {t}]" for g, m, n, k, t in sorted(rws)]
    (folder / "zz_what_if.yaml").write_text("\n".join(lines) + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    from moesim.scenario.read import load_scenario
    from moesim.trace.stalls import path_breakdown
    from moesim.wiring import resolve, simulate

    print("### What the trainer runs (NeMo RL v0.3.0 b1c86a816, Megatron-LM 2ff0f099)")
    print()
    print("| setting | NeMo RL v0.3 Qwen3-30B-A3B | set in | moesim |")
    print("|---|---|---|---|")
    for row in SETTINGS:
        print("| " + " | ".join(row) + " |")
    print()
    print("### moesim's Megatron MoE step against Pai-Megatron-Patch issue #643 (H800)")
    print()
    print("| layout | simulated s | published s | error | simulated tokens/GPU/s |")
    print("|---|---:|---:|---:|---:|")
    found = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "qwen3-30b-a3b-pai-h800.yaml"
        path.write_text(SCENARIO)
        for label, pp, ep, gbs, pub in PAI:
            dp = GPUS // pp
            sets = [f"parallel.pp={pp}", f"parallel.ep={ep}",
                    f"schedule.microbatches={gbs // dp}"]
            res = resolve(load_scenario(path, sets))
            sim = simulate(res)
            step = float(sim.summary["step_time_s"])
            crit = path_breakdown(sim)["by_kind"]
            tps = gbs * SEQ / step / GPUS
            print(f"| {label} | {step:.2f} | {pub:.2f} | {(step / pub - 1) * 100:+.1f} % | "
                  f"{tps:,.0f} |")
            ks, per = expert_gemms(res)
            found.append((label, pp, gbs // dp, sets, step, pub, res, ks, per, crit))
        print()
        print("### The expert GEMMs per kernel (first MoE layer, one rank, one micro-batch)")
        print()
        print("| layout | pass | kernel | experts | shape per expert (m x n x k) | "
              "us per expert | achieved TFLOP/s | % of BF16 peak |")
        print("|---|---|---|---:|---|---:|---:|---:|")
        for label, _pp, _m, _sets, _s, _p, res, ks, _per, _c in found:
            peak = res.device.peak_bf16_flops
            for r in ks:
                rate = r["flops"] / r["time_s"]
                print(f"| {label} | {r['pass']} | {r['kernel']} | {r['x']} | {r['shape']} | "
                      f"{r['time_s'] * 1e6:.1f} | {rate / 1e12:.0f} | "
                      f"{100 * rate / peak:.0f} % |")
        print()
        print("| layout | rows per expert | expert GEMMs per step, s | gap to published, s "
              "| slowdown of the expert GEMMs alone to close it | host sync bound, s | "
              f"step with expert GEMMs at 1/{WHAT_IF_SLOWDOWN:g} rate, s | its error |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        what_if = what_if_catalog(Path(d) / "cat", [(r[7][0]["x"], r[8], r[7])
                                                    for r in found],
                                  found[0][6].compute.launch_overhead_s)
        for label, pp, m, sets, step, pub, res, ks, per, _c in found:
            layers = sum(res.model.is_moe_layer(i) for i in range(res.model.layers)) // pp
            per_mb = sum(r["x"] * r["time_s"] for r in ks) * layers
            path_s = per_mb * (m + pp - 1)
            need = 1 + (pub - step) / path_s
            # Megatron's alltoall dispatcher syncs the host once per MoE layer forward
            # (tokens_per_expert to the CPU, cuda_sync_point before_ep_alltoall); the GPU
            # then idles until the host launches the next kernel: one launch overhead
            # per MoE layer and micro-batch on the critical path
            sync = layers * (m + pp - 1) * res.compute.launch_overhead_s
            slow = resolve(load_scenario(path, [*sets, f"compute.catalog={what_if}"]))
            s2 = float(simulate(slow).summary["step_time_s"])
            print(f"| {label} | {per:,} | {path_s:.2f} | {pub - step:.2f} | x{need:.2f} | "
                  f"{sync:.4f} | {s2:.2f} | {(s2 / pub - 1) * 100:+.1f} % |")
    print()
    print("| layout | critical path s | compute on it, s | all-to-all on it, s | slowdown of "
          "all compute alone to close the gap | of the all-to-all alone |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, _pp, _m, _sets, step, pub, _res, _ks, _per, crit in found:
        a2a = crit.get("ep_dispatch", 0.0) + crit.get("ep_combine", 0.0)
        comp = crit.get("compute", 0.0)
        print(f"| {label} | {step:.2f} | {comp:.2f} | {a2a:.2f} | "
              f"x{1 + (pub - step) / comp:.2f} | x{1 + (pub - step) / a2a:.2f} |")
    print()
    print("NeMo RL v0.3's published policy training, 50 s for 2,048 samples of 256 + 3,251 "
          "tokens (the prompt length is ours) on 64 H100: "
          f"{2048 * (256 + 3251) / 50 / 64:,.0f} tokens/GPU/s, against the 6,244-6,325 "
          "above.")
    nemo = 2048 * (256 + 3251) / 50 / 64
    print(f"Megatron's own measurement runs {6244 / nemo:.2f}-{6325 / nemo:.2f} x NeMo RL's "
          "training rate: no pricing of the step's kernels closes more of NeMo RL's gap "
          "than the Pai-Megatron gap above.")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "rl-moe-trainer", "NeMo RL v0.3's MoE trainer, and "
                                                   "moesim's MoE step against Megatron"))
