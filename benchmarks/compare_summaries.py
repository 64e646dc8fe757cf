"""Behaviour unchanged? Run every shipped scenario at a git revision and in the working
tree, and compare their ``summary.json`` byte for byte.

    python benchmarks/compare_summaries.py REV            # e.g. REV = main~3
    python benchmarks/compare_summaries.py REV --only toy-cpu hot-expert
    python benchmarks/compare_summaries.py REV --engine both --only toy-cpu   # exact and fast
    python benchmarks/compare_summaries.py REV --only hot-expert --set schedule.microbatches=2
    python benchmarks/compare_summaries.py REV --repeat 3    # + median wall time, ratio

The revision is checked out into a temporary git worktree (removed afterwards); each
scenario runs as ``python -m moesim run scenarios/NAME.yaml -o DIR --quiet`` (``serve``
or ``rl`` instead of ``run`` for a scenario with that section) with that tree first on
``PYTHONPATH`` and a cache folder of its own (``MOESIM_CACHE``). Prints one line per
scenario (same / DIFFERENT, with the wall time of each run) and exits 1 when any differs;
a serving-under-load summary that differs only in its surface's build CPU time and cache
key counts as the same (and says so). The DeepSeek-V3 2048-GPU scenario takes about a
minute per run on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moesim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def command(path: Path) -> str:
    """The command that simulates a scenario file: ``serve`` for a ``serve:`` section,
    ``rl`` for an ``rl:`` section, else ``run``."""
    scn = load_scenario(path)
    return "serve" if scn.serve else "rl" if scn.rl else "run"


def equal_but_measured(a: bytes, b: bytes) -> bool:
    """Two summaries equal once what is measured of the run itself, not simulated, is
    left out: serving under load's ``surface.build_cpu_s`` (the CPU time the step-cost
    surface took) and ``surface.key`` (its cache key, which names the code that built it)."""
    ja, jb = json.loads(a), json.loads(b)
    for j in (ja, jb):
        for sf in (j.get("load", {}).get("surface"), j.get("surface")):
            if isinstance(sf, dict):
                sf.pop("build_cpu_s", None)
                sf.pop("key", None)
    return ja == jb


def run(tree: Path, scenario: str, out: Path, cache: Path, sets: list[str] = ()) -> float:
    """One run in ``tree``, the scenario named by its path relative to the tree (the
    summary echoes it, so both runs must name it alike); step-cost surfaces of serving
    under load are cached in ``cache`` (one per tree: neither run reads the other's)."""
    env = dict(os.environ, PYTHONPATH=str(tree), MOESIM_CACHE=str(cache))
    t0 = time.perf_counter()
    flags = [f for s in sets for f in ("--set", s)]
    subprocess.run([sys.executable, "-m", "moesim", command(tree / scenario), scenario,
                    "-o", str(out), "--quiet", *flags], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="git revision to compare the working tree with")
    ap.add_argument("--only", nargs="*", help="scenario names (default: every shipped one)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override passed to both runs (repeatable)")
    ap.add_argument("--engine", choices=("scenario", "exact", "fast", "both"),
                    default="scenario", help="engine of training steps (`moesim run`): the "
                    "scenario's engine.mode, one of the two, or both in turn")
    ap.add_argument("--repeat", type=int, default=1, help="runs per revision, alternated "
                    "(the median wall time of each and their ratio are printed)")
    args = ap.parse_args(argv)
    engines = {"scenario": [None], "both": ["exact", "fast"]}.get(args.engine, [args.engine])
    names = args.only or sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))
    bad = 0
    with tempfile.TemporaryDirectory(prefix="moesim-cmp-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.rev],
                       cwd=ROOT, check=True)
        try:
            for name, eng in [(n, e) for n in names for e in engines]:
                scn = f"scenarios/{name}.yaml"
                if not (base / scn).is_file():
                    print(f"{name:28s} new (not at {args.rev})")
                    continue
                sets = list(args.sets)
                if eng is not None and command(ROOT / scn) == "run":
                    sets.append(f"engine.mode={eng}")
                elif eng == "fast":
                    continue                     # serve / rl: one run is enough
                tag = name if eng is None else f"{name}@{eng}"
                times: dict[str, list[float]] = {"a": [], "b": []}
                for i in range(max(1, args.repeat)):     # alternated: the same load on both
                    for d, tree in (("a", base), ("b", ROOT)):
                        times[d].append(run(tree, scn, Path(tmp) / d / f"{tag}.{i}",
                                            Path(tmp) / f"cache-{d}", sets))
                ta, tb = (statistics.median(times[k]) for k in "ab")
                a, b = ((Path(tmp) / d / f"{tag}.0" / "summary.json").read_bytes() for d in "ab")
                verdict = ("same" if a == b else
                           "same but the surface's CPU time and key" if equal_but_measured(a, b)
                           else "DIFFERENT")
                bad += verdict == "DIFFERENT"
                print(f"{tag:28s} {verdict:9s} "
                      f"({args.rev}: {ta:.1f} s, working tree: {tb:.1f} s, ratio {tb / ta:.3f}"
                      + (f"; medians of {args.repeat}" if args.repeat > 1 else "") + ")",
                      flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           check=False)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
