"""Which phase dominates a GRPO step, as the response length, the group size and the
pools (colocated or split) vary (issue 39): moesim's phase shares beside the published.

    python benchmarks/grpo_study.py                # a few minutes of CPU
    python benchmarks/grpo_study.py --write-docs   # docs/results/grpo-study.md

Base runs: ``grpo-llama31-8b-nemo-v03`` (NeMo RL v0.3's Llama-3.1-8B row: one DGX H100
node, colocated, 64 prompts x 32 samples, mean response 795 tokens) for every axis, and
``grpo-qwen3-30b-a3b-nemo-v03`` (64 H100) for the response length. Each point changes
one input with ``--set``; the response law stays lognormal (sigma 0.5 for the 8B row,
0.25 for the Qwen3 row), its mean the point's, cut at 3,840 tokens, each step's longest
response at that limit (``rl.longest_response: limit``) except where the tail rows draw it. The group-size axis
keeps 64 prompts and NeMo RL's global batch of 512 samples (optimizer steps = samples /
512). Split pools: 4 GPUs generate (vLLM TP1 x 4) and 4 train (DP4), NCCL weight sync,
on policy (``max_lag 0``) and one step off (``max_lag 1``, the steady state of 3 steps).

Shares are of the step's wall time: generation (with vLLM's sleep), log-probs (old
policy, reference, their prep), training (optimizer steps, loss log-probs, their prep),
refit (weight sync and the host moves around it); on split pools the phases overlap, so
the shares are of the busy time of each pool's phases summed, and the step is the
timeline's. Published shares (``PUBLISHED``) are printed beside them; nothing is fitted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = "grpo-llama31-8b-nemo-v03"
QWEN = "grpo-qwen3-30b-a3b-nemo-v03"
#: published step breakdowns: (run, generation, log-probs, training, refit, step) s
PUBLISHED = (
    ("NeMo RL v0.3 Llama-3.1-8B, 1 node (blog post nemo-rl-v0.3, caab149510)",
     58.0, 18.0, 28.0, 5.0, 112.0),
    ("NeMo RL v0.3 Llama-3.1-70B, 64 H100", 84.0, 18.0, 28.0, 14.0, 147.0),
    ("NeMo RL v0.3 Qwen3-32B, 64 H100", 96.0, 40.0, 68.0, 7.0, 213.0),
    ("NeMo RL v0.3 Qwen3-30B-A3B, 64 H100", 78.0, 23.0, 50.0, 12.0, 167.0),
    ("verl fully-async README, Qwen3-30B-A3B-Base on 128 H20, colocated "
     "(verl/experimental/fully_async_policy/README.md; no refit figure)", 348.1, 49.6, 86.3,
     None, 497.9),
)
SPLIT = ["rl.colocated=false", "rl.rollout.gpus=4", "rl.train.gpus=4",
         "rl.train.offload=none", "rl.weight_sync.method=nccl",
         "rl.weight_sync.per_gpu=false"]
GROUPS = {"generation": ("generate",), "log-probs": ("logprob_prep", "old_logprob",
                                                      "reference"),
          "training": ("train_prep", "loss_logprob", "train"),
          "refit": ("weight_sync",)}


def shares(run, summary: dict) -> tuple[dict[str, float], float]:
    """Seconds per group of phases (the switch into training counted with generation,
    out of training with refit) and the step."""
    ph = summary["phases_s"]
    n = len(run.works)
    out = {g: sum(ph.get(p, 0.0) for p in ps) for g, ps in GROUPS.items()}
    out["generation"] += sum(w.durations.switch_in for w in run.works) / n
    out["refit"] += sum(w.durations.switch_out for w in run.works) / n
    return out, summary["step_time_s"]


def point(name: str, sets: list[str], steps: int) -> tuple[dict[str, float], float, int]:
    """(seconds per group, step s, longest response tokens) of one run."""
    from moesim.rl.run import resolve_rl, simulate_rl
    from moesim.rl.summary import summarize

    run = simulate_rl(resolve_rl(ROOT / "scenarios" / f"{name}.yaml", sets), steps)
    longest = max(int(b.response.max()) for b in run.batches)
    return (*shares(run, summarize(run)), longest)


def row(label: str, parts: dict, step: float, longest: int | None = None) -> str:
    """A table row: each group's share of the groups' summed time (None: not published)."""
    busy = sum(v for v in parts.values() if v is not None) or 1.0
    cells = " | ".join("-" if parts[g] is None else f"{parts[g] / busy * 100:.0f} %"
                       for g in GROUPS)
    top = max((g for g in parts if parts[g] is not None), key=parts.get)
    tail = "" if longest is None else f" | {longest:,}"
    return f"| {label} | {step:.1f} | {cells} | {top}{tail} |"


HEAD = ("| point | step s | " + " | ".join(GROUPS) + " | dominant |\n|---|---|"
        + "---|" * len(GROUPS) + "---|")
SIM = HEAD.replace(" dominant |", " dominant | longest response |", 1).replace(
    "---|\n", "---|\n", 1) + "---|"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    t0 = time.perf_counter()
    print("Shares of a GRPO step's phases (of the phases' summed time); s = seconds")
    print()
    print("### Published breakdowns")
    print()
    print(HEAD)
    for label, g, lp, tr, rf, step in PUBLISHED:
        print(row(label, {"generation": g, "log-probs": lp, "training": tr, "refit": rf},
                  step))
    print()
    print(f"### Response length (`{BASE}`, mean response tokens)")
    print()
    print(SIM)
    for mean in (256, 795, 2048, 3460):
        print(row(f"{mean:,}", *point(BASE, [f"rl.response_tokens.mean={mean}"], 2)))
    print()
    print(f"### Response length (`{QWEN}`, mean response tokens)")
    print()
    print(SIM)
    for mean in (795, 2048, 3460):
        print(row(f"{mean:,}", *point(QWEN, [f"rl.response_tokens.mean={mean}",
                                                  "rl.longest_response=limit"], 1)))
    print()
    print(f"### Response-length tail (`{BASE}`, mean 795, lognormal sigma)")
    print()
    print(SIM)
    for sigma in (0.25, 0.5, 1.0):
        sets = [f"rl.response_tokens.sigma={sigma}", "rl.longest_response=drawn"]
        print(row(f"sigma {sigma}, longest as drawn", *point(BASE, sets, 2)))
    print(row("sigma 0.5, longest at the limit (the scenario)", *point(BASE, [], 2)))
    print()
    print(f"### Group size (`{BASE}`, 64 prompts, global batch 512)")
    print()
    print(SIM)
    for g in (8, 16, 32, 64):
        sets = [f"rl.samples_per_prompt={g}", f"rl.train.mini_batches={64 * g // 512}"]
        print(row(f"{g} samples per prompt ({64 * g:,} per step)", *point(BASE, sets, 2)))
    print()
    print(f"### Pools (`{BASE}`, 8 GPUs)")
    print()
    print(SIM)
    print(row("colocated (8 GPUs, phases in turn)", *point(BASE, [], 2)))
    print(row("split 4 + 4, on policy", *point(BASE, SPLIT, 2)))
    print(row("split 4 + 4, one step off", *point(BASE, [*SPLIT, "rl.max_lag=1"], 3)))
    print()
    print(f"wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "grpo-study", "GRPO phase shares as the run varies"))
