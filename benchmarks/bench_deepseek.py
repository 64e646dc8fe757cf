"""DeepSeek-V3 as trained (DualPipe + DeepEP): the 2048-GPU step against the step its
published training cost implies, wall time and peak memory; and the fast engine against
the exact engine on a 128-GPU DualPipe + DeepEP case with skew.

    python benchmarks/bench_deepseek.py                  # both parts, median of 3
    python benchmarks/bench_deepseek.py --repeat 1 --skip-fidelity
    python benchmarks/bench_deepseek.py --skip-2048

Every run is a fresh child process (``ru_maxrss`` = its peak resident set). Published
step: DeepSeek-V3 Technical Report (arXiv:2412.19437) §1: 180K H800 GPU hours per
trillion tokens; §4.2: final batch 15360 sequences of 4096 tokens; on 2048 GPUs that is
15360 · 4096 · 180e3 / 1e12 GPU-h · 3600 s / 2048 = 19.9 s per step [D]. Nothing is
fitted to it: the error is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED_STEP_S = 15360 * 4096 * 180e3 / 1e12 * 3600 / 2048

#: the fidelity case: DeepSeek-V3 layers on 16 H800 nodes, PP2 DualPipe (F&B pairs
#: overlapped), EP16 over two nodes with DeepEP, zipf 0.3 skew, 4 MoE layers, 4
#: micro-batches per replica, ZeRO-1
FIDELITY = ["cluster.nodes=16", "parallel.pp=2", "parallel.ep=16", "model.layers=4",
            "model.first_dense_layers=0", "schedule.microbatches=4", "routing.max_nodes=null"]

CHILD = r"""
import json, resource, sys, time
from moesim.engine.api import simulate
name, overrides = json.loads(sys.argv[1])
t = time.perf_counter()
r = simulate(name, overrides)
wall = time.perf_counter() - t
s = r.summary
print(json.dumps({"wall_s": wall, "maxrss_MB": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1e3, "step_s": r.step_time_s,
    "breakdown_s": s["breakdown_s"], "stall": [row["breakdown_s"]["stall"]
    for row in s["per_rank"]], "oom": s["memory"]["oom"],
    "peak_GB": s["memory"]["peak_bytes_max"] / 1e9}))
"""


def child(name: str, overrides: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([name, overrides])],
                       capture_output=True, text=True, cwd=ROOT, check=False)
    if p.returncode:
        raise SystemExit(p.stderr.strip().splitlines()[-1])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-2048", action="store_true")
    ap.add_argument("--skip-fidelity", action="store_true")
    args = ap.parse_args(argv)
    if not args.skip_2048:
        runs = [child("deepseek-v3-2048", []) for _ in range(args.repeat)]
        r = runs[0]
        walls = [x["wall_s"] for x in runs]
        print("deepseek-v3-2048 (as shipped: DualPipe, DeepEP on 20 SMs, fast engine)")
        print(f"  wall {statistics.median(walls):.1f} s median of {len(walls)} "
              f"({', '.join(f'{w:.1f}' for w in walls)}), peak RSS "
              f"{statistics.median(x['maxrss_MB'] for x in runs):.0f} MB")
        err = r["step_s"] / PUBLISHED_STEP_S - 1
        print(f"  step {r['step_s']:.2f} s against {PUBLISHED_STEP_S:.2f} s implied by the "
              f"published GPU hours and batch: error {err:+.1%}")
        print("  breakdown (mean over ranks): " + ", ".join(
            f"{k} {v:.2f} s" for k, v in r["breakdown_s"].items() if v > 0.005))
        print(f"  memory: peak {r['peak_GB']:.1f} GB per GPU, oom {r['oom']}")
    if not args.skip_fidelity:
        e = child("deepseek-v3-2048", [*FIDELITY, "engine.mode=exact"])
        f = child("deepseek-v3-2048", [*FIDELITY, "engine.mode=fast"])
        step = e["step_s"]
        print("128-GPU DualPipe + DeepEP case (" + " ".join(FIDELITY) + ")")
        print(f"  exact {step * 1e3:.3f} ms in {e['wall_s']:.1f} s wall "
              f"({e['maxrss_MB']:.0f} MB); fast {f['step_s'] * 1e3:.3f} ms in "
              f"{f['wall_s']:.1f} s ({f['maxrss_MB']:.0f} MB): step {f['step_s'] / step - 1:+.2%}")
        worst = max(e["breakdown_s"], key=lambda k: abs(f["breakdown_s"][k]
                                                        - e["breakdown_s"][k]))
        gap = abs(f["breakdown_s"][worst] - e["breakdown_s"][worst]) / step
        stall = max(abs(a - b) for a, b in zip(e["stall"], f["stall"], strict=True)) / step
        print(f"  worst category {worst} {gap:.2%} of the step; worst rank's stall "
              f"{stall:.2%} of the step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
