"""Does a slower all-to-all under compute explain Megatron's EP overlap in 1F1B? A
diagnostic of moesim's ``overlap.kind: a2a-1f1b`` against five measured runs.

    python benchmarks/a2a_overlap_rate.py                # ~22 min of CPU
    python benchmarks/a2a_overlap_rate.py --write-docs   # docs/results/a2a-overlap-rate.md

moesim's a2a-1f1b gains more than Megatron's measured runs do (docs/schedules.md, "How far
to trust a2a-1f1b"). The one run with a profile of its parts is Megatron-Bridge's PR 5094
card (skills/nemo-mbridge-perf-moe-comm-overlap/card.yaml at 7ded17da; Qwen3-30B-A3B, 16
H100, BF16, EP16, HybridEP): with the overlap, rank 0's communication kernels ran 10.83 s,
of which 3.96 s (36.55 %) beside compute, where they ran 8.25 s without it; compute
stayed 14.4-14.6 s. So there the all-to-all, not compute, absorbed the sharing, and most of
it was exposed. moesim does the reverse: an EP kernel takes its SMs at once, compute runs
at (S - s)/S meanwhile, and the all-to-all keeps its own time.

The hypothesis tested here (ours, not a published mechanism): while a compute kernel runs,
the all-to-all progresses at a rate r < 1 (its kernel waits for SMs that cuBLAS's GEMMs
hold) and compute keeps its full rate; r is calibrated on the card's profile alone, with
the split written down before any run: the 8.25 s of kernel work that ran alone without
the overlap took 6.87 s alone and 3.96 s beside compute with it, so
r = (8.25 - 6.87) / 3.96. The card's step and the other four runs are held out. It is a
diagnostic: the fast engine's overlapped pair (``moesim.engine.fast.pairs._Pair``) is
swapped for one with that rule inside this process only; moesim itself is unchanged.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from megatron_moe_h100 import (  # this folder
    QWEN3_30B_BF16_MEASURED,
    QWEN3_30B_BF16_OVERLAP,
    qwen3_30b_bf16_parts,
)
from results_page import error_pct, print_table  # this folder

#: the card's rank-0 profile: communication kernels without the overlap (9.079 ms beside
#: compute = 0.11 % of them: 8.25 s); with it, 3.959 s beside compute = 36.55 % of 10.83 s,
#: the other 6.87 s exposed
ALONE_S = qwen3_30b_bf16_parts(QWEN3_30B_BF16_MEASURED)["communication kernels"]
_WITH = qwen3_30b_bf16_parts(QWEN3_30B_BF16_OVERLAP)
EXPOSED_S = _WITH["exposed communication"]
BESIDE_S = QWEN3_30B_BF16_OVERLAP["overlapped_comm_s"]
COMPUTE_S = _WITH["compute"]
R = (ALONE_S - EXPOSED_S) / BESIDE_S


class Pending:
    """An all-to-all whose end is not settled yet: it moves data from ``start`` and needs
    ``work`` seconds at its own rate; ``end`` once settled."""

    def __init__(self, start, work) -> None:
        self.start, self.work, self.end = start, work, None


def rated_pair(base, r: float):
    """``base`` (the fast engine's ``_Pair``) with the tested rule: compute at full rate,
    an all-to-all at ``r`` of its rate while the compute stream is busy and at its own
    rate while it waits. An all-to-all's end is settled when the compute stream waits for
    it, when the next all-to-all joins the stream after it, or when its item's next send
    or bookkeeping needs it, from the compute stream's busy intervals known by then; a
    compute op the builder lists later is not counted, so the rule is applied at most as
    strongly as stated."""

    class Rated(base):
        def __init__(self, ch, s):
            super().__init__(ch, s)
            self.f = 0.0                      # compute keeps its full rate
            self.busy: list[tuple] = []
            self.open: list[Pending] = []     # unsettled, in ep-stream order

        def _end(self, p: Pending):
            """The end ``p`` gets from the busy intervals known now (not stored)."""
            cur, left = p.start.copy(), p.work.copy()
            end = np.full_like(cur, np.nan)
            for a, e in self.busy:
                live = np.isnan(end)
                if not live.any():
                    break
                gap = np.maximum(0.0, a - cur)            # compute idle: full rate
                end = np.where(live & (left <= gap), cur + left, end)
                left = np.where(live, left - np.minimum(left, gap), left)
                cur = np.where(live, np.maximum(cur, a), cur)
                live = np.isnan(end)
                seg = np.maximum(0.0, e - cur)            # compute busy: rate r
                end = np.where(live & (left <= seg * r), cur + left / r, end)
                left = np.where(live, left - np.minimum(left, seg * r), left)
                cur = np.where(live, np.maximum(cur, e), cur)
            return np.where(np.isnan(end), cur + left, end)

        def _fix(self, x):
            """``x`` as an array: a Pending settled now (with every one before it)."""
            if not isinstance(x, Pending):
                return x
            if x.end is None:
                while self.open:
                    p = self.open.pop(0)
                    p.end = self._end(p)
                    if p is x:
                        break
            return x.end

        def _settled(self):
            """Every settled Pending held by the pair replaced by its end."""
            def v(x):
                return x.end if isinstance(x, Pending) and x.end is not None else x
            self.te = v(self.te)
            self.dep = [v(d) for d in self.dep]
            self.last = [v(x) for x in self.last]
            self.kern = [(j, st, v(e), k) for j, st, e, k in self.kern]

        def _idle_to(self, t):
            keep = self.kern
            self.kern = [(j, st, self._end(e) if isinstance(e, Pending) else e, k)
                         for j, st, e, k in keep]     # provisional ends, for the labels
            super()._idle_to(t)
            left = {id(k[0]) for k in self.kern}
            self.kern = [k for k in keep if id(k[0]) in left]

        def settle(self, who):
            if self.dep[who] is not None:
                self._fix(self.dep[who])
                self._settled()
            super().settle(who)

        def step(self, who, op):
            if op[0] in ("s", "f"):
                self._fix(self.last[who])
                self._settled()
            if op[0] not in ("c", "tp"):
                super().step(who, op)
                return
            self.settle(who)                  # the wait first: it is not compute
            t0 = self.tc
            super().step(who, op)
            self.busy.append((t0, self.tc))

        def _a2a(self, who, op):
            self._fix(self.te)
            self._fix(self.dep[who])
            self._fix(self.last[who])
            self._settled()
            super()._a2a(who, op)        # the engine's join, times and spans
            join, start, end, kind = self.kern[-1]
            pend = Pending(start, end - start)    # its end, settled later by the rule
            self.open.append(pend)
            self.kern[-1] = (join, start, pend, kind)
            self.te = self.dep[who] = self.last[who] = pend

    return Rated


def gain(off: float, on: float) -> str:
    """The overlap's step over the step without it."""
    return f"x{on / off:.3f}"


def _modelzoo(row_n: int):
    """(base YAML, overrides) of a megatron_moe_h800 row."""
    import megatron_moe_h800 as mm
    row = next(r for r in mm.ROWS if r.n == row_n)
    return mm.BASE, mm.row_sets(row)


#: (run, source, measured step s without the overlap (None: not measured), measured step s
#:  with it, shipped scenario or "modelzoo:ROW" (a megatron_moe_h800 row), --set overrides)
RUNS = (
    ("Qwen3-30B-A3B, 16 H100 BF16, HybridEP", "Megatron-Bridge PR 5094 card (calibration)",
     24.7138, 20.99203, "qwen3-30b-a3b-16-h100", ["compute.precision=bf16"]),
    ("Qwen3-30B-A3B, 16 H100 BF16, all-to-all dispatcher",
     "Megatron-Bridge docs/training/communication-overlap.md", 41.36, 31.31,
     "qwen3-30b-a3b-16-h100", ["compute.precision=bf16", "parallel.ep_backend.kind=nccl"]),
    ("Qwen3-235B-A22B, 256 H100 BF16, DeepEP TP2 EP32 PP8 VPP4",
     "Megatron-MoE-ModelZoo examples/qwen3 (rows 13, 14 of megatron-moe-h800)", 19.7, 17.6,
     "modelzoo:14", []),
    ("DeepSeek-V3, 1024 H100 FP8", "Megatron-Bridge performance summary (NeMo 25.09)", None,
     8192 * 4096 / 1024 / 1297.0, "deepseek-v3-1024-h100", []),
    ("Qwen3-235B-A22B, 256 H100 FP8-CS", "Megatron-Bridge performance summary (NeMo 25.11)",
     None, 20.81, "qwen3-235b-256-h100-fp8", []),
)


def _simulate(scn: str, sets: list[str], overlap: bool, r: float | None, tmp: Path) -> dict:
    from moesim.engine.fast import pairs
    from moesim.scenario.read import load_scenario
    from moesim.wiring import resolve, resolve_path, simulate

    if scn.startswith("modelzoo:"):
        base, row_sets = _modelzoo(int(scn.split(":")[1]))
        path = tmp / "modelzoo.yaml"
        path.write_text(base)
        row_sets = [s for s in row_sets if s != "overlap.kind=a2a-1f1b"]
        sets = row_sets + (["overlap.kind=a2a-1f1b"] if overlap else [])
        res = resolve(load_scenario(path, sets))
    else:
        sets = sets + [f"overlap.kind={'a2a-1f1b' if overlap else 'none'}"]
        res = resolve_path(scn, sets)
    keep = pairs._Pair
    if r is not None:
        pairs._Pair = rated_pair(keep, r)
    try:
        s = simulate(res).summary
    finally:
        pairs._Pair = keep
    b = s["breakdown_s"]
    return {"step": float(s["step_time_s"]), "compute": b["compute"],
            "a2a": b["ep_dispatch"] + b["ep_combine"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", help="comma-separated run numbers, 1-5 (default: all)")
    a = ap.parse_args(argv)
    want = {int(x) for x in a.runs.split(",")} if a.runs else None
    t_all = time.process_time()
    print(f"Calibrated on the card's profile: r = ({ALONE_S:.2f} - {EXPOSED_S:.2f}) / "
          f"{BESIDE_S:.2f} = "
          f"{R:.3f}; every step below is held out. s = seconds per step; error = "
          "simulated / measured - 1; exposed all-to-all: moesim's breakdown, mean over ranks")
    print()
    rows, parts = [], []
    with tempfile.TemporaryDirectory() as d:
        for n, (label, src, off_s, on_s, scn, sets) in enumerate(RUNS, 1):
            if want is not None and n not in want:
                continue
            t0 = time.perf_counter()
            off = _simulate(scn, sets, False, None, Path(d))
            now = _simulate(scn, sets, True, None, Path(d))
            rated = _simulate(scn, sets, True, R, Path(d))
            print(f"  run {n}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            rows.append((str(n), label, src,
                         "-" if off_s is None else f"{off_s:.2f}", f"{off['step']:.2f}",
                         "-" if off_s is None else error_pct(off["step"], off_s),
                         f"{on_s:.2f}", f"{now['step']:.2f}", error_pct(now["step"], on_s),
                         f"{rated['step']:.2f}", error_pct(rated["step"], on_s),
                         "-" if off_s is None else gain(off_s, on_s),
                         gain(off["step"], now["step"]), gain(off["step"], rated["step"])))
            if n == 1:
                parts = [("compute", f"{COMPUTE_S:.2f}", f"{now['compute']:.2f}",
                          f"{rated['compute']:.2f}"),
                         ("exposed all-to-all", f"{EXPOSED_S:.2f}", f"{now['a2a']:.2f}",
                          f"{rated['a2a']:.2f}")]
    print_table(("run", "what", "source", "measured s, no overlap", "moesim", "error",
                 "measured s, overlap", "moesim", "error", "moesim, rate r", "error",
                 "measured gain", "moesim gain", "gain, rate r"), rows)
    print()
    if parts:
        print("The calibration run's parts with the overlap (s; measured: rank 0's profile, "
              "the GPU-active union less the exposed communication):")
        print()
        print_table(("part", "measured", "moesim", "moesim, rate r"), parts)
        print()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"CPU {time.process_time() - t_all:.0f} s; peak memory {peak:.2f} GiB")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "a2a-overlap-rate",
                           "Megatron's EP overlap in 1F1B: an all-to-all slowed under compute"))
