"""DeepSeek-V3 on 2048 GPUs against its published cost, as shipped and with one setting
changed at a time: the table of docs/deepep.md ("DeepSeek-V3 on 2048 GPUs").

    python benchmarks/deepseek_settings.py            # six runs, ~4 min on 2 cores

Each row is ``moesim run scenarios/deepseek-v3-2048.yaml --no-files --json --quiet`` with
the ``--set`` shown. Published: DeepSeek-V3 technical report (arXiv:2412.19437) §1,
180K H800 GPU hours per trillion tokens; at the final batch of 15360 · 4096 = 62.9M
tokens per step that is 11.3 GPU hours per step, 19.9 s on 2048 GPUs. Nothing in moesim
is fitted to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench_deepseek import PUBLISHED_STEP_S as PUBLISHED_S  # report §1, §4.2 (this folder)

SCENARIO = "scenarios/deepseek-v3-2048.yaml"
SETTINGS = [
    ("as shipped (DualPipe, DeepEP, 20 SMs)", []),
    ("`parallel.ep_backend.sms=24`", ["parallel.ep_backend.sms=24"]),
    ("`overlap.kind=none` (DualPipe order, no F&B interleaving)", ["overlap.kind=none"]),
    ("`parallel.ep_backend.kind=nccl` (DualPipe, NCCL all-to-all)",
     ["parallel.ep_backend.kind=nccl"]),
    ("`schedule.kind=1f1b overlap.kind=none` (DeepEP)",
     ["schedule.kind=1f1b", "overlap.kind=none"]),
    ("`schedule.kind=1f1b overlap.kind=none parallel.ep_backend.kind=nccl`",
     ["schedule.kind=1f1b", "overlap.kind=none", "parallel.ep_backend.kind=nccl"]),
]


def run(sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "moesim", "run", SCENARIO, "--no-files", "--json", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> int:
    print(f"published: {PUBLISHED_S:.2f} s per step (DeepSeek-V3 report §1, §4.2)",
          file=sys.stderr)
    print("| setting | step (s) | error vs published | compute, mean over ranks (s) | "
          "exposed dispatch + combine (s) | bubble (s) | stall (s) | peak memory (GB/GPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, sets in SETTINGS:
        t0 = time.perf_counter()
        d = run(sets)
        b = d["breakdown_s"]
        step = d["step_time_s"]
        print(f"| {label} | {step:.2f} | {step / PUBLISHED_S - 1:+.1%} | {b['compute']:.2f} | "
              f"{b['ep_dispatch'] + b['ep_combine']:.2f} | {b['bubble']:.2f} | "
              f"{b['stall']:.2f} | {d['memory']['peak_bytes_max'] / 1e9:.1f} |", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark   # this folder
    sys.exit(run_benchmark(main, "deepseek-settings", "DeepSeek-V3 on 2048 GPUs, one setting at a time"))
