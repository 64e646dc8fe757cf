"""Skewed all-to-all-v from 32 to 256 GPUs: this tree's flow network against the
previous engine, measured in the same run (``python benchmarks/bench_network.py
--scaling``; see that file). Each measurement is a fresh child process, so CPU time
(user + sys) and peak RSS are its own; the previous engine is ``moesim/network`` of
``--old-rev`` checked out into a temporary package (``git show``), for this benchmark
only. Flows: every GPU to every other, tokens ~ Poisson(128) x 7392 B (as
``network_flows.all_to_all``), on dgx-h100 servers, all started at t = 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: the engine before issue 25 (per-event passes over all pairs, no compiled loops)
OLD_REV = "962e931"


def old_package(rev: str, into: Path) -> Path:
    """``moesim/network`` of ``rev`` as package ``oldnet`` under ``into`` (every module of
    it, its imports of itself renamed; any revision, the compiled kernels included)."""
    pkg = into / "oldnet"
    pkg.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "ls-tree", "--name-only", rev, "moesim/network/"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        if not name.endswith(".py"):
            continue
        src = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        src = src.replace("from moesim.network import", "from oldnet import")
        (pkg / Path(name).name).write_text(src.replace("moesim.network.", "oldnet."))
    return into


def child(engine: str, gpus: int, finish_path: str = "") -> dict:
    """One skewed all-to-all-v in this process; engine 'new' (compiled path), 'numpy' (this
    tree with ``MOESIM_NUMBA=0``) or 'old' (oldnet on path). Finish times go to
    ``finish_path`` (.npy) when given."""
    import simpy
    from network_flows import all_to_all, make_topology
    if engine == "old":
        import importlib.util

        from oldnet.flow import FlowNetwork
        jit = (importlib.import_module("oldnet.jit") if importlib.util.find_spec("oldnet.jit")
               else None)   # an old engine with compiled kernels runs them as the new one does
    else:
        from moesim.network import FlowNetwork, jit
        if engine == "numpy":
            jit.use_numba(False)
    if jit is not None:
        jit.kernels()   # loaded before the clock starts (its cost is measured apart)
        small, _ = make_topology(8, "dgx-h100")
        env = simpy.Environment()
        warm = FlowNetwork(env, small)
        warm.transfer_many(all_to_all(small, np.random.default_rng(1)))
        env.run()
    topo, _ = make_topology(gpus, "dgx-h100")
    flows = all_to_all(topo, np.random.default_rng(1))
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    done = np.zeros(len(flows))

    def record(ev):
        done[ev.value] = env.now

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for i, f in enumerate(flows):
        net.transfer(*f, tag=i).callbacks.append(record)
    env.run()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    if finish_path:
        np.save(finish_path, done)
    return {"engine": engine, "gpus": gpus, "flows": len(flows), "wall_s": wall,
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "rss_MB": r1.ru_maxrss / 1024, "end_s": env.now, "solves": net.n_solves,
            "finish_sha": hashlib.sha256(done.tobytes()).hexdigest()[:16],
            "counters": net.counters() if hasattr(net, "counters") else None}


def run_child(engine: str, gpus: int, old_dir: Path | None, tmp: Path) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT / "benchmarks"), str(ROOT)] + ([str(old_dir)] if old_dir else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    fin = tmp / f"finish-{engine}-{gpus}.npy"
    code = ("import json, sys; from bench_network_scaling import child; "
            f"print(json.dumps(child({engine!r}, {gpus}, {str(fin)!r})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    res["finish"] = np.load(fin)
    fin.unlink()
    return res


def median_child(engine: str, gpus: int, old_dir: Path | None, tmp: Path, reps: int) -> dict:
    """The run of median CPU time among ``reps`` fresh processes (``reps`` noted)."""
    runs = sorted((run_child(engine, gpus, old_dir, tmp) for _ in range(reps)),
                  key=lambda r: r["cpu_s"])
    out = runs[len(runs) // 2]
    out["reps"] = reps
    return out


#: finish times of this engine must be within this relative difference of the previous one
FINISH_RTOL = 1e-12


def finish_diff(a: dict, b: dict) -> float:
    """Largest relative difference between two runs' finish times."""
    return float(np.max(np.abs(a["finish"] - b["finish"]) / b["finish"]))


def agreement(a: dict, b: dict) -> str:
    if a["finish_sha"] == b["finish_sha"]:
        return "identical"
    d = finish_diff(a, b)
    return f"within {FINISH_RTOL:g} (max rel {d:.1e})" if d <= FINISH_RTOL else f"DIFFER (max rel {d:.1e})"


def per_event(new: dict) -> dict[str, float]:
    """The new engine's counters per re-solve."""
    c = new["counters"]
    n = max(c["solves"], 1)
    return {k: v / n for k, v in c.items() if k != "solves"}


def scenario_cpu(tree: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, step s) of mixtral-8x7b-64gpu on the exact engine in ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "moesim", "run", "scenarios/mixtral-8x7b-64gpu.yaml",
                          "--set", "engine.mode=exact", "--no-files", "--quiet", "--json"],
                         cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    step = json.loads(out)["step_time_s"]
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), step


WARM_CODE = """
import resource as r
a = r.getrusage(r.RUSAGE_SELF)
from moesim.network import jit
if jit.kernels() is None:
    raise SystemExit("none")
import simpy
from moesim.network import FlowNetwork
from moesim.topology import load_topology
topo = load_topology("dgx-h100", nodes=1)
env = simpy.Environment()
net = FlowNetwork(env, topo)
g = list(topo.gpus)
net.transfer_many([(x, y, 1e6 * (i + 1)) for i, (x, y) in
                   enumerate((x, y) for x in g for y in g if x != y)])
env.run()
b = r.getrusage(r.RUSAGE_SELF)
print(b.ru_utime - a.ru_utime + b.ru_stime - a.ru_stime)
"""


def compile_cost() -> tuple[float, float]:
    """CPU seconds of a fresh process that imports numba and runs one small network:
    with an empty numba cache (compiles every kernel), then with the cache filled."""
    out = []
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(2):
            env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=cache)
            p = subprocess.run([sys.executable, "-c", WARM_CODE], env=env, capture_output=True,
                               text=True)
            txt = p.stdout.strip()
            out.append(float(txt) if p.returncode == 0 and txt else float("nan"))
    return out[0], out[1]


#: a fixed pure-Python loop, timed in a fresh process: how fast this machine is today
#: (the shared development machines' speed has varied threefold between days)
SPEED_CODE = """
import time
t = time.process_time()
s = 0
for i in range(10_000_000):
    s += i
print(time.process_time() - t)
"""


def machine_speed() -> float:
    """CPU seconds of :data:`SPEED_CODE` (10^7 additions in a Python loop), median of 3."""
    out = []
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", SPEED_CODE], capture_output=True, text=True)
        out.append(float(p.stdout) if p.returncode == 0 and p.stdout.strip() else float("nan"))
    return float(np.median(out))


def scaling(args) -> int:
    load0 = os.getloadavg()
    speed = machine_speed()
    print(f"machine speed: 10^7 additions in a Python loop take {speed:.2f} s of CPU "
          "(median of 3 fresh processes)", flush=True)
    rows = []
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        old_dir = None if args.no_old else old_package(args.old_rev, tmpd)
        for g in args.sizes:
            reps = 3 if g <= 64 else 1   # median of 3 where cheap
            new = median_child("new", g, None, tmpd, reps)
            old = (median_child("old", g, old_dir, tmpd, reps)
                   if old_dir and g <= args.old_max else None)
            npy = median_child("numpy", g, None, tmpd, reps) if g in args.numpy_sizes else None
            rows.append((new, old, npy))
            line = (f"skewed all-to-all-v {g:4d} GPUs, {new['flows']:6d} flows: new wall "
                    f"{new['wall_s']:7.2f} s cpu {new['cpu_s']:7.2f} s rss {new['rss_MB']:5.0f} MB, "
                    f"{new['solves']} solves")
            if old:
                line += (f" | old wall {old['wall_s']:7.2f} s cpu {old['cpu_s']:7.2f} s rss "
                         f"{old['rss_MB']:5.0f} MB | speed-up (cpu) {old['cpu_s'] / new['cpu_s']:.2f}x"
                         f", finish times {agreement(new, old)}")
                ok = ok and finish_diff(new, old) <= FINISH_RTOL
            if npy:
                ref = old or new
                line += (f" | numpy path cpu {npy['cpu_s']:7.2f} s, finish times "
                         f"{agreement(npy, ref)} vs {'old' if old else 'new'}")
                ok = ok and finish_diff(npy, ref) <= FINISH_RTOL
            print(line, flush=True)
            pe = per_event(new)
            print(f"    per re-solve: {pe['flows']:.0f} flows / {pe['pairs']:.0f} pairs re-solved, "
                  f"{pe['rounds']:.1f} bottleneck levels, {pe['changed']:.0f} rates changed, "
                  f"{pe['walked']:.0f} index entries walked; {new['counters']['candidates']} of "
                  f"{new['solves']} re-solved every candidate", flush=True)
        scen = None
        if not args.no_scenario:
            new_s = scenario_cpu(ROOT)
            old_s = None
            if old_dir:
                wt = tmpd / "oldtree"
                subprocess.run(["git", "worktree", "add", "--detach", str(wt), args.old_rev],
                               cwd=ROOT, check=True, capture_output=True)
                try:
                    old_s = scenario_cpu(wt)
                finally:
                    subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                                   check=False, capture_output=True)
            scen = (new_s, old_s)
            print(f"mixtral-8x7b-64gpu exact: new wall {new_s[0]:.1f} s cpu {new_s[1]:.1f} s, "
                  f"step {new_s[2]!r}" + (f" | old wall {old_s[0]:.1f} s cpu {old_s[1]:.1f} s, "
                                         f"step {old_s[2]!r}" if old_s else ""), flush=True)
    gpus = [r[0]["gpus"] for r in rows]
    expo = {}
    if len(gpus) > 1:
        for k, j in (("new", 0), ("old", 1)):
            pts = [(r[0]["gpus"], r[j]["cpu_s"]) for r in rows if r[j]]
            if len(pts) > 1:
                g_, c_ = zip(*pts, strict=True)
                expo[f"{k} CPU ({g_[0]}-{g_[-1]} GPUs)"] = float(
                    np.polyfit(np.log(g_), np.log(c_), 1)[0])
        for k in ("flows", "pairs", "changed"):
            expo[f"{k} per re-solve"] = float(np.polyfit(np.log(gpus), np.log(
                [max(per_event(r[0])[k], 1e-9) for r in rows]), 1)[0])
        print("growth exponent vs GPUs: " + ", ".join(f"{k} {v:.2f}" for k, v in expo.items()))
    cc = compile_cost()
    print(f"numba in a fresh process: first run (compiles) {cc[0]:.2f} s CPU, "
          f"with the cache {cc[1]:.2f} s CPU")
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    if args.write:
        write_page(rows, scen, expo, cc, load0, load1, args.old_rev, speed)
    if not ok:
        print(f"FAILED: finish times differ from the previous engine by more than {FINISH_RTOL:g}")
        return 1
    return 0


def write_page(rows, scen, expo, cc, load0, load1, rev, speed) -> None:
    from moesim.outputs import write_text

    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Flow network: skewed all-to-all-v, this engine against the previous one", "",
             f"Regenerated by `python benchmarks/bench_network.py --scaling --write-docs` on "
             f"{when} (load average {load0[0]:.2f} before, {load1[0]:.2f} after, on a shared "
             f"{os.cpu_count()}-core machine: CPU time, user + sys, is the figure to read; wall "
             f"time includes waiting for the cores; the machine's speed that day: 10^7 additions in "
             f"a Python loop took {speed:.2f} s of CPU). Previous engine: `moesim/network` at {rev}"
             + (" (before issue 25)" if rev == OLD_REV else "") + ". Every GPU sends to every other tokens ~ Poisson(128) x 7392 B, "
             "dgx-h100 servers, all flows started at t = 0; one fresh process per cell; RSS = "
             "peak resident set of that process; median of 3 runs (by CPU time) up to 64 GPUs, "
             "one run above. \"numpy path\": this tree with `MOESIM_NUMBA=0`. Finish times are compared flow by flow; the check fails above "
             f"{FINISH_RTOL:g} relative.", "",
             "| GPUs | flows | solves | new CPU (s) | new wall (s) | new RSS (MB) | old CPU (s) "
             "| old wall (s) | speed-up (CPU) | finish times vs old | numpy path CPU (s) "
             "| numpy path finish times |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for new, old, npy in rows:
        o = (f"{old['cpu_s']:.2f} | {old['wall_s']:.2f} | {old['cpu_s'] / new['cpu_s']:.2f}x | "
             f"{agreement(new, old)}" if old else "– | – | – | –")
        q = (f"{npy['cpu_s']:.2f} | {agreement(npy, old or new)} vs {'old' if old else 'new'}"
             if npy else "– | –")
        lines.append(f"| {new['gpus']} | {new['flows']} | {new['solves']} | {new['cpu_s']:.2f} | "
                     f"{new['wall_s']:.2f} | {new['rss_MB']:.0f} | {o} | {q} |")
    lines += ["", "What one re-solve does on the compiled path (means over the re-solves; "
              "`FlowNetwork.counters()`):", "",
              "| GPUs | running flows re-solved | pairs re-solved | bottleneck levels "
              "| rates changed > 1e-12 | closure index entries walked | re-solves of every candidate |",
              "|---|---|---|---|---|---|---|"]
    for new, _, _ in rows:
        pe = per_event(new)
        lines.append(f"| {new['gpus']} | {pe['flows']:.0f} | {pe['pairs']:.0f} | "
                     f"{pe['rounds']:.1f} | {pe['changed']:.0f} | {pe['walked']:.0f} | "
                     f"{new['counters']['candidates']} of {new['solves']} |")
    lines += ["", "Growth exponents against GPUs (least squares, log-log): "
              + ", ".join(f"{k} {v:.2f}" for k, v in expo.items()) + ".", "",
              f"numba in a fresh process with one small network: {cc[0]:.2f} s CPU the first time "
              f"(empty cache: every kernel compiled), {cc[1]:.2f} s CPU after (import and cached "
              "code; paid only by networks large enough to gain from it)."]
    if scen:
        (nw, nc, ns), old = scen
        lines += ["", f"`mixtral-8x7b-64gpu` with `engine.mode=exact` (`moesim run --no-files`): "
                  f"new {nc:.1f} s CPU ({nw:.1f} s wall), step {ns!r} s"
                  + (f"; previous {old[1]:.1f} s CPU ({old[0]:.1f} s wall), step {old[2]!r} s"
                     if old else "") + ". The previous revision also prices kernels as "
                  "they were then, so its step may differ."]
    write_text(ROOT / "docs" / "results" / "network.md", "\n".join(lines) + "\n", force=True)
