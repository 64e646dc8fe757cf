"""Record the shape-sweep study: interleaved rounds of uniform, hot and zipf recordings of
the CPU layer, and one shape sweep in the middle (docs/validation.md, "Calibration by
shape"). Needs the torch extra (``pip install -e '.[torch]'``); about 4 minutes on 2
cores. Record on a quiet machine: the load average goes into every ``routing.json``.

    python benchmarks/record_sweep_study.py OUT [--rounds 3] [--force]

Writes ``OUT/uniform-R``, ``OUT/hot-R``, ``OUT/zipf-R`` for R = 1 … rounds and
``OUT/sweep`` (after round ``ceil(rounds / 2)``), each with the same layer and flags as
the shipped study (``--steps 8 --warmup 2 --pin --nice -15``; the sweep with the layer's
dims). The rounds are interleaved so that a slow spell of the machine falls on every
kind of recording alike; calibrating on all the uniform ones averages it out.
``traces/sweep-study`` was recorded with this sequence. Then:

    python benchmarks/shape_sweep_table.py --study OUT
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time

KINDS = ("uniform", "hot", "zipf")
FLAGS = ["--steps", "8", "--warmup", "2", "--pin", "--nice", "-15"]
SWEEP = ["--shape-sweep", "--world", "2", "--experts", "8", "--hidden", "512", "--ffn", "1024",
         "--top-k", "2", "--tokens", "2048", "--seed", "0", "--pin", "--nice", "-15"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--force", action="store_true", help="overwrite earlier recordings")
    args = ap.parse_args()
    if args.rounds < 1:
        print("record_sweep_study: command line: --rounds: expected an integer >= 1, got "
              f"{args.rounds}", file=sys.stderr)
        return 2
    force = ["--force"] if args.force else []
    runs = []
    for r in range(1, args.rounds + 1):
        runs += [[f"{args.out}/{k}-{r}", "--skew", k, *FLAGS] for k in KINDS]
        if r == math.ceil(args.rounds / 2):
            runs.append([f"{args.out}/sweep", *SWEEP])
    t0 = time.perf_counter()
    for i, run in enumerate(runs, 1):
        print(f"record_sweep_study: {i}/{len(runs)}: {run[0]} "
              f"({time.perf_counter() - t0:.0f} s so far)", flush=True)
        rc = subprocess.call([sys.executable, "-m", "moesim", "record", *run, *force])
        if rc:
            return rc
    print(f"record_sweep_study: {len(runs)} recordings in {time.perf_counter() - t0:.0f} s "
          f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
