"""Part 8 of ``rl_moe_trainer.py``: the same NeMo RL Megatron worker in SFT.

NVIDIA-NeMo/RL issue 966 (2025-08-22): a user's SFT of Qwen3-30B-A3B through NeMo RL's
Megatron backend on 4 x 8 H200, max sequence 4k, global batch 512, micro-batch 8, EP8,
TP1, takes ~13 s an iteration. No RL phase is in it (no generation, log-probs, refit or
RL loss), so it tests whether NeMo RL's training rate falls short of a Megatron step
outside GRPO too. ``benchmarks/scenarios/nemo-rl-sft-qwen3-30b-a3b-h200.yaml`` computes
the most work the run can hold (every sample padded to 4,096 tokens): moesim's step for
it bounds from above what moesim gives for the user's data, so the ratio printed is the
least by which the measured iteration exceeds moesim's Megatron step. Nothing is fitted.
"""

from __future__ import annotations

from pathlib import Path

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "nemo-rl-sft-qwen3-30b-a3b-h200.yaml"
MEASURED_S = 13.0            # issue 966's table: "~13" s/iter
TOKENS = 512 * 4096          # global batch x max sequence: the most a 4k-capped batch holds
GPUS = 32


def sft_bound(grpo_ratio: tuple[float, float]) -> None:
    """``grpo_ratio``: the GRPO row's (rl_moe_trainer.py computes it), Megatron's measured
    rates on H800 over NeMo RL v0.3's training rate."""
    from moesim.scenario.read import load_scenario
    from moesim.wiring import resolve, simulate

    print()
    print("### Part 8: the same worker in SFT (NVIDIA-NeMo/RL issue 966, H200)")
    print()
    print("| run | simulated step s | fits in memory (moesim) | roofline share of compute | "
          "tokens/GPU/s (simulated) | measured s | measured / simulated |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for label, sets in (("every sample 4,096 tokens, no recompute (the defaults)", []),
                        ("the same with full recompute (if the run needed it to fit)",
                         ["memory.recompute=full"])):
        sim = simulate(resolve(load_scenario(SCENARIO, sets)))
        s = sim.summary
        step = float(s["step_time_s"])
        roof = float(s.get("kernel_pricing", {}).get("roofline_fraction", 0.0))
        fits = "no" if s.get("oom") else "yes"
        print(f"| {label} | {step:.2f} | {fits} | {roof:.0%} | {TOKENS / step / GPUS:,.0f} | "
              f"{MEASURED_S:.0f} | x{MEASURED_S / step:.2f} |")
    print()
    print("Without recompute moesim's memory table does not fit micro-batches of 8 x 4,096 "
          "tokens in an H200, so the user's run had recompute or shorter batches; either "
          "row bounds it. "
          "The measured iteration computes at most the simulated tokens, so each ratio is a "
          "lower bound on how far NeMo RL's Megatron MoE training runs behind moesim's "
          "Megatron step for the same work, with no RL phase in it; in GRPO (above) "
          f"Megatron's own measurement ran {grpo_ratio[0]:.2f}-{grpo_ratio[1]:.2f} x NeMo "
          "RL's rate. The issue publishes no profile, sequence lengths or recompute setting, "
          "and moesim prices H200's BF16 GEMMs by the roofline (no catalog table), so this "
          "is a bound, not a check.")
