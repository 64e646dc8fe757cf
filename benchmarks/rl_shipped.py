"""The shipped GRPO scenarios run as `moesim rl NAME --json` would (docs/rl.md, "The
shipped scenarios"): the steady-state step, its phases, the pools' memory and what each
run cost in CPU.

    python benchmarks/rl_shipped.py                  # prints the table (minutes of CPU)
    python benchmarks/rl_shipped.py --write-docs     # docs/results/rl-shipped.md
    python benchmarks/rl_shipped.py --quick          # the Qwen3 rows only

Each run's step-cost surface comes from the step-cost cache (MOESIM_CACHE) when it holds
it, so the CPU column is that of a warm or a cold cache, as the machine had it.
"""

from __future__ import annotations

import argparse
import sys
import time

#: (label, scenario, overrides, steps)
ROWS = (
    ("`grpo-qwen3-30b-a3b` (colocated, 32 H100)", "grpo-qwen3-30b-a3b", [], 4),
    ("same, `--set rl.rollout.cuda_graphs=true`", "grpo-qwen3-30b-a3b",
     ["rl.rollout.cuda_graphs=true"], 4),
    ("`grpo-qwen3-30b-a3b-async` (16 + 16, max_lag 1)", "grpo-qwen3-30b-a3b-async", [], 4),
    ("same, `--set rl.partial_rollouts=true`", "grpo-qwen3-30b-a3b-async",
     ["rl.partial_rollouts=true"], 4),
    ("same, also `--set rl.kv_after_sync=keep`", "grpo-qwen3-30b-a3b-async",
     ["rl.partial_rollouts=true", "rl.kv_after_sync=keep"], 4),
    ("`grpo-deepseek-v3` (128 + 256 H800, max_lag 1)", "grpo-deepseek-v3", [], 3),
)
GiB = 1024.0 ** 3


def main() -> int:
    from moesim.rl.run import rl_summary

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the Qwen3 rows only")
    a = ap.parse_args()
    rows = [r for r in ROWS if not (a.quick and "deepseek" in r[1])]
    print("moesim rl NAME --steps N --json for the shipped scenarios; step: the mean of "
          "the steady-state steps (steps_averaged); s = seconds, GiB = 2^30 bytes; CPU: "
          "this process's only (the fast engine's worker processes and a warm step-cost "
          "cache are not in it)")
    print()
    print("| scenario | steps (averaged) | step | generate | old log-probs / reference | "
          "train | weight sync | switch | long tail | generation share | trainer busy | "
          "tokens/s per GPU | memory per GPU: trainer / engine | CPU of this process |")
    print("|" + "---|" * 14)
    for label, name, sets, steps in rows:
        c0 = time.process_time()
        s = rl_summary(name, sets, steps=steps)
        cpu = time.process_time() - c0
        ph, st = s["phases_s"], s["step_time_s"]
        first, last = s["steps_averaged"]
        kind = "" if s["step_time_kind"] == "steady_state" else ", fill and drain"
        mem = " / ".join(f"{c['need_bytes'] / GiB:.1f}" + (" OOM" if c["oom"] else "")
                         for c in s["fit"]["checks"])
        print(f"| {label} | {steps} ({first}-{last}{kind}) | {st:.1f} s | "
              f"{ph['generate']:.1f} s | {ph['old_logprob']:.1f} / {ph['reference']:.1f} s | "
              f"{ph['train']:.1f} s | {ph['weight_sync']:.2f} s | {ph['switch']:.2f} s | "
              f"{s['long_tail_s']:.1f} s | {ph['generate'] / st * 100:.0f} % | "
              f"{s['utilization']['train'] * 100:.0f} % | "
              f"{s['tokens_per_s_per_gpu']:,.0f} | {mem} GiB | {cpu:.0f} s |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "rl-shipped", "The shipped GRPO scenarios"))
