"""DeepSeek-V3 as trained (DualPipe + DeepEP): the 2048-GPU step against the step its
published training cost implies, wall time and peak memory; and the fast engine against
the exact engine on a 128-GPU DualPipe + DeepEP case with skew.

    python benchmarks/bench_deepseek.py                  # both parts, median of 3
    python benchmarks/bench_deepseek.py --repeat 1 --skip-fidelity
    python benchmarks/bench_deepseek.py --skip-2048
    python benchmarks/bench_deepseek.py --qwen [--qwen-reference]   # Qwen3-235B, 256 H100
    python benchmarks/bench_deepseek.py --compare REV   # summaries byte-identical to REV's?

Each timed run prints wall, CPU (user + sys of its process) and peak RSS, with the load
average (the machine may be shared). ``--qwen`` runs ``scenarios/qwen3-235b-256gpu.yaml``
as shipped (fast path, no ``engine.coalesce_rtol``: over the flow budget its EP32
all-to-alls share links, shortcut ``a2a_sharing_over_budget``); ``--qwen-reference``
also runs it with every multi-host all-to-all flow by flow at ``engine.coalesce_rtol=0.05``
(tens of minutes) and prints the step difference.

Every run is a fresh child process (``ru_maxrss`` = its peak resident set; CPU includes
the chain workers it forks, moesim.engine.fast.workers). deepseek-v3-2048 runs as shipped
(``engine.workers`` auto: two processes on a machine with two CPUs) and serially
(``engine.workers=1``), alternated; the summaries must be identical. Published
step: DeepSeek-V3 Technical Report (arXiv:2412.19437) §1: 180K H800 GPU hours per
trillion tokens; §4.2: final batch 15360 sequences of 4096 tokens; on 2048 GPUs that is
15360 · 4096 · 180e3 / 1e12 GPU-h · 3600 s / 2048 = 19.9 s per step [D]. Nothing is
fitted to it: the error is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepseek_campaign import PUBLISHED_STEP_S, campaign_wall, line  # noqa: E402  (this folder)

#: the fidelity case: DeepSeek-V3 layers on 16 H800 nodes, PP2 DualPipe (F&B pairs
#: overlapped), EP16 over two nodes with DeepEP, zipf 0.3 skew, 4 MoE layers, 4
#: micro-batches per replica, ZeRO-1
FIDELITY = ["cluster.nodes=16", "parallel.pp=2", "parallel.ep=16", "model.layers=4",
            "model.first_dense_layers=0", "schedule.microbatches=4", "routing.max_nodes=null",
            "model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
            "parallel.decoder_last_pipeline_num_layers=null"]

CHILD = r"""
import hashlib, json, resource, sys, time
from moesim.wiring import simulate
from moesim.trace.report import jsonable
name, overrides, budget = json.loads(sys.argv[1])
if budget is not None:
    import moesim.engine.fast.engine as fe
    import moesim.engine.fast.network as fn
    fn.EXACT_FLOW_BUDGET = fe.EXACT_FLOW_BUDGET = budget
t = time.perf_counter()
r = simulate(name, overrides)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
rc = resource.getrusage(resource.RUSAGE_CHILDREN)    # forked chain workers, joined
s = r.summary
same = {k: v for k, v in s.items() if k != "sim_wall_s"}   # the one field that is a clock
sha = hashlib.sha256(json.dumps(jsonable(same), sort_keys=True).encode()).hexdigest()[:16]
print(json.dumps({"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime + rc.ru_utime
    + rc.ru_stime, "sha": sha, "maxrss_MB": ru.ru_maxrss / 1e3,
    "worker_maxrss_MB": rc.ru_maxrss / 1e3, "step_s": r.step_time_s,
    "breakdown_s": s["breakdown_s"], "stall": [row["breakdown_s"]["stall"]
    for row in s["per_rank"]], "oom": s["memory"]["oom"],
    "peak_GB": s["memory"]["peak_bytes_max"] / 1e9}))
"""


def child(name: str, overrides: list[str], budget: int | None = None,
          tree: Path = ROOT) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([name, overrides, budget])],
                       capture_output=True, text=True, cwd=tree, check=False, env=env)
    if p.returncode:
        raise SystemExit(p.stderr.strip().splitlines()[-1])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-2048", action="store_true")
    ap.add_argument("--skip-fidelity", action="store_true")
    ap.add_argument("--qwen", action="store_true", help="Qwen3-235B-A22B on 256 H100 as shipped")
    ap.add_argument("--qwen-reference", action="store_true",
                    help="also flow by flow at coalesce_rtol 0.05 (tens of minutes)")
    ap.add_argument("--compare", metavar="REV",
                    help="run deepseek-v3-2048 (and --qwen) at REV too: summaries identical?")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start")
    if not args.skip_2048:
        runs, serial = [], []
        for _ in range(args.repeat):     # alternated: the machine's load hits both alike
            runs.append(child("deepseek-v3-2048", []))
            serial.append(child("deepseek-v3-2048", ["engine.workers=1"]))
        r = runs[0]
        print("deepseek-v3-2048 (as shipped: DualPipe, DeepEP on 20 SMs, fast engine)")
        for label, rs in (("as shipped (engine.workers auto)", runs),
                          ("serial (engine.workers=1)", serial)):
            walls = [x["wall_s"] for x in rs]
            print(f"  {label}: wall {statistics.median(walls):.1f} s median of {len(walls)} "
                  f"({', '.join(f'{w:.1f}' for w in walls)}), CPU "
                  f"{statistics.median(x['cpu_s'] for x in rs):.1f} s, peak RSS "
                  f"{statistics.median(x['maxrss_MB'] for x in rs):.0f} MB (forked worker "
                  f"{statistics.median(x['worker_maxrss_MB'] for x in rs):.0f} MB), "
                  f"summary sha256 {rs[0]['sha']}")
        ratio = statistics.median(a["wall_s"] / b["wall_s"]
                                  for a, b in zip(runs, serial, strict=True))
        same = all(x["sha"] == r["sha"] for x in runs + serial)
        print(f"  wall as shipped / serial: {ratio:.2f} (median of the pairs); summaries "
              f"{'identical' if same else 'DIFFERENT'}")
        if args.compare:
            o = at_rev(args.compare, "deepseek-v3-2048", [])
            print(f"  at {args.compare}: CPU {o['cpu_s']:.1f} s, wall {o['wall_s']:.1f} s, "
                  f"summary {'identical' if o['sha'] == r['sha'] else 'DIFFERENT'}")
        err = r["step_s"] / PUBLISHED_STEP_S - 1
        print(f"  step {r['step_s']:.2f} s against {PUBLISHED_STEP_S:.2f} s implied by the "
              f"published GPU hours and batch: error {err:+.1%}")
        print("  " + line(campaign_wall(r["step_s"]), PUBLISHED_STEP_S))
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
    if args.qwen:
        q = child("qwen3-235b-256gpu", [])
        print("qwen3-235b-256gpu (as shipped: fast path, no engine.coalesce_rtol)")
        print(f"  wall {q['wall_s']:.1f} s, CPU {q['cpu_s']:.1f} s, peak RSS "
              f"{q['maxrss_MB']:.0f} MB, step {q['step_s'] * 1e3:.3f} ms")
        if args.qwen_reference:
            ref = child("qwen3-235b-256gpu", ["engine.coalesce_rtol=0.05"], budget=10**15)
            print(f"  flow by flow at coalesce_rtol 0.05: step {ref['step_s'] * 1e3:.3f} ms "
                  f"({ref['cpu_s']:.0f} s CPU): as shipped {q['step_s'] / ref['step_s'] - 1:+.3%}")
        if args.compare:
            o = at_rev(args.compare, "qwen3-235b-256gpu", [])
            print(f"  at {args.compare}: step {o['step_s'] * 1e3:.3f} ms, CPU {o['cpu_s']:.1f} s")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    return 0


def at_rev(rev: str, name: str, overrides: list[str]) -> dict:
    """One child run in a temporary worktree of ``rev``."""
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(wt), rev], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            return child(name, overrides, tree=wt)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                           check=False, capture_output=True)


if __name__ == "__main__":
    raise SystemExit(main())
