"""The exact engine on a whole step with many small ops: wall, CPU and peak memory of
``mixtral-8x7b-64gpu`` with ``engine.mode=exact`` (interleaved PP4, EP8 in a node, 8
nodes: ~230 k flows, most of them tiny), and optionally the same run at another git
revision, with the summaries compared byte for byte (issue 25: executor and
communicator overhead; goal 8 s of CPU).

    python benchmarks/bench_exact.py                      # median of 3
    python benchmarks/bench_exact.py --repeat 1 --compare REV --warm
    python benchmarks/bench_exact.py --set schedule.microbatches=8

Each run is a fresh child process running what ``moesim run SCENARIO --no-files --json``
runs (no link series is kept without output files), timed by ``resource.getrusage``
(CPU = user + sys of the child, peak RSS = its ``ru_maxrss``); the load average is
printed with every figure, since the machine may be shared. With ``--compare``, the
runs alternate (REV, working tree, REV, ...) so that both see the same load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import contextlib, json, resource, sys, time
from moesim.wiring import resolve_path, simulate
from moesim.trace.report import full_summary, jsonable
try:   # as moesim run does (a revision before it has no moesim.engine.collector)
    from moesim.engine.collector import paused
except ImportError:
    paused = lambda freeze: contextlib.nullcontext()
name, overrides = json.loads(sys.argv[1])
t = time.perf_counter()
res = resolve_path(name, overrides)
with paused(freeze=True):
    r = simulate(res, record_series=False)
    text = json.dumps(jsonable(full_summary(r)), indent=1)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
sys.stdout.write(text + "\n")
print(json.dumps({"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "maxrss_MB": ru.ru_maxrss / 1e3, "step_s": r.step_time_s}))
"""


def child(name: str, overrides: list[str], tree: Path = ROOT) -> dict:
    """One run in a fresh process; ``sha``: the summary (``sim_wall_s`` left out)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    load = os.getloadavg()[0]
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([name, overrides])],
                       capture_output=True, text=True, cwd=tree, check=False, env=env)
    if p.returncode:
        raise SystemExit(p.stderr.strip().splitlines()[-1])
    *body, last = p.stdout.strip().splitlines()
    out = json.loads(last)
    summary = json.loads("\n".join(body))
    summary.pop("sim_wall_s", None)
    out["sha"] = hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()[:16]
    out["load"] = (load, os.getloadavg()[0])
    return out


def line(label: str, r: dict) -> str:
    return (f"  {label}: CPU {r['cpu_s']:.1f} s, wall {r['wall_s']:.1f} s, peak RSS "
            f"{r['maxrss_MB']:.0f} MB, step {r['step_s'] * 1e3:.3f} ms, summary {r['sha']} "
            f"(load {r['load'][0]:.1f} -> {r['load'][1]:.1f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="mixtral-8x7b-64gpu")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="KEY=VALUE", help="more overrides (engine.mode=exact is added)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--compare", metavar="REV",
                    help="also run at git revision REV (alternating): summaries identical?")
    ap.add_argument("--warm", action="store_true",
                    help="one untimed run per tree first (numba compiles into a new tree's "
                         "cache on its first run)")
    args = ap.parse_args(argv)
    overrides = [*args.overrides, "engine.mode=exact"]
    print(f"{args.scenario} {' '.join(overrides)}; load average "
          f"{os.getloadavg()[0]:.2f} (1 min) at the start")
    runs, base = [], []
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "tree"
        if args.compare:
            subprocess.run(["git", "worktree", "add", "--detach", str(wt), args.compare],
                           cwd=ROOT, check=True, capture_output=True)
        try:
            if args.warm:
                child(args.scenario, overrides)
                if args.compare:
                    child(args.scenario, overrides, tree=wt)
            for i in range(args.repeat):
                if args.compare:
                    base.append(child(args.scenario, overrides, tree=wt))
                    print(line(f"{args.compare} run {i + 1}", base[-1]), flush=True)
                runs.append(child(args.scenario, overrides))
                print(line(f"working tree run {i + 1}", runs[-1]), flush=True)
        finally:
            if args.compare:
                subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                               check=False, capture_output=True)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    print(f"working tree: CPU {cpu:.1f} s median of {len(runs)}, wall "
          f"{statistics.median(r['wall_s'] for r in runs):.1f} s, peak RSS "
          f"{statistics.median(r['maxrss_MB'] for r in runs):.0f} MB")
    if base:
        b = statistics.median(r["cpu_s"] for r in base)
        same = all(r["sha"] == runs[0]["sha"] for r in base + runs)
        print(f"{args.compare}: CPU {b:.1f} s median; speed-up {b / cpu:.2f}x; summaries "
              f"{'identical' if same else 'DIFFERENT'}")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
