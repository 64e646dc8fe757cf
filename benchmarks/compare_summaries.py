"""Behaviour unchanged? Run every shipped scenario at a git revision and in the working
tree, and compare their ``summary.json`` byte for byte.

    python benchmarks/compare_summaries.py REV            # e.g. REV = main~3
    python benchmarks/compare_summaries.py REV --only toy-cpu hot-expert

The revision is checked out into a temporary git worktree (removed afterwards); each
scenario runs as ``python -m moesim run scenarios/NAME.yaml -o DIR --quiet`` with that
tree first on ``PYTHONPATH``. Prints one line per scenario (same / DIFFERENT, with the
wall time of each run) and exits 1 when any differs. The DeepSeek-V3 2048-GPU scenario
takes about a minute per run on two cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, scenario: Path, out: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "moesim", "run", str(scenario), "-o", str(out),
                    "--quiet"], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="git revision to compare the working tree with")
    ap.add_argument("--only", nargs="*", help="scenario names (default: every shipped one)")
    args = ap.parse_args(argv)
    names = args.only or sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))
    bad = 0
    with tempfile.TemporaryDirectory(prefix="moesim-cmp-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.rev],
                       cwd=ROOT, check=True)
        try:
            for name in names:
                scn = f"scenarios/{name}.yaml"
                if not (base / scn).is_file():
                    print(f"{name:28s} new (not at {args.rev})")
                    continue
                # the same relative path in both trees (each run's cwd), so the scenario
                # source echoed into summary.json is the same string
                ta = run(base, Path(scn), Path(tmp) / "a" / name)
                tb = run(ROOT, Path(scn), Path(tmp) / "b" / name)
                same = ((Path(tmp) / "a" / name / "summary.json").read_bytes()
                        == (Path(tmp) / "b" / name / "summary.json").read_bytes())
                bad += not same
                print(f"{name:28s} {'same' if same else 'DIFFERENT':9s} "
                      f"({args.rev}: {ta:.1f} s, working tree: {tb:.1f} s)", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           check=False)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
