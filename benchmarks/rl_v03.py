"""NeMo RL v0.3's published GRPO phases for Qwen3-30B-A3B against moesim, phase by phase
(issue 39): the errors printed, nothing fitted.

    python benchmarks/rl_v03.py              # about a minute of CPU
    python benchmarks/rl_v03.py --write-docs # docs/results/rl-v03.md

Published: NVIDIA-NeMo/.github blog/posts/nemo-rl-v0.3/index.md (caab149510), the
Megatron row of Qwen3 30B-A3B on 8 nodes x 8 GPUs: total step 167 s = policy training
50 + refit 12 + generation 78 + get logprobs 23 s (steps 22-29 averaged), 3,251
generated tokens per sample. Scenario: ``scenarios/grpo-qwen3-30b-a3b-nemo-v03.yaml``
(its comments map the recipe to moesim's fields). moesim's phases are summed as the
post's: log-probs = old policy + reference; refit = weight sync + the colocated switch
(NeMo RL's refit reloads the engine's weights and memory around the update).
"""

from __future__ import annotations

import argparse
import sys

NAME = "grpo-qwen3-30b-a3b-nemo-v03"
#: phase -> (published s, moesim's phases summed)
PUBLISHED = {
    "policy training": (50.0, ("train",)),
    "refit": (12.0, ("weight_sync", "switch")),
    "generation": (78.0, ("generate",)),
    "get logprobs": (23.0, ("old_logprob", "reference")),
}
STEP_S = 167.0
GENERATED = 3251


def rows(summary: dict) -> list[tuple[str, float, float]]:
    """(phase, simulated s, published s) for each published phase and the step."""
    ph = summary["phases_s"]
    out = [(name, sum(ph.get(p, 0.0) for p in parts), pub)
           for name, (pub, parts) in PUBLISHED.items()]
    return [*out, ("step", summary["step_time_s"], STEP_S)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="RL steps simulated (1 to 20)")
    a = ap.parse_args(argv)
    if not 1 <= a.steps <= 20:
        ap.error("--steps: an integer from 1 to 20")
    from moesim.rl.run import rl_summary

    s = rl_summary(NAME, [], steps=a.steps)
    resp = sum(r["response_tokens"] for r in s["steps"]) / sum(r["samples"] for r in s["steps"])
    print(f"NeMo RL v0.3, Qwen3-30B-A3B on 64 H100 (colocated) against `{NAME}`, "
          f"{a.steps} simulated steps; mean response {resp:,.0f} tokens (published "
          f"{GENERATED:,})")
    print()
    print("| phase | simulated s | published s | error |")
    print("|---|---|---|---|")
    for name, sim, pub in rows(s):
        print(f"| {name} | {sim:.1f} | {pub:.0f} | {(sim / pub - 1) * 100:+.1f} % |")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "rl-v03", "RL phases against NeMo RL v0.3's Qwen3-30B-A3B "
                                          "breakdown"))
