"""The per-call cost of an NCCL collective, eager vs CUDA graph, against sglang's bench_symm.

    python benchmarks/collective_launch.py                 # prints every figure and error
    python benchmarks/collective_launch.py --write-docs    # also docs/results/collective-launch.md

The model (moesim.collectives.nccl.launch; the split written first:
docs/studies/collective-launch-calibration.md): an eager call costs, as back-to-back calls
see it, max(h, t_gpu + L) (h the host time of one call, calibrated: the median of the
all-gather eager figures; L = 2.43 µs one stream launch, gpu-benches); one replayed from a
CUDA graph t_gpu + F (F = 1.26 µs, gpu-benches' graph floor). t_gpu is NCCL's GPU-time
estimate as moesim prices it (tuning.cc's model for all-gather and reduce-scatter;
moesim's p2p pricing for all-to-all). Held out: the reduce-scatter and all-to-all eager
figures and the eager-minus-graph gaps of all three ops.

sglang's graph column ran NCCL's symmetric-memory kernels for all-gather and
reduce-scatter (benchmark_symm_mem.py: PyNccl calls on buffers from
SymmetricMemoryContext), another kernel than the eager ring/LL one moesim prices, so the
graph rows of those two ops compare two kernels, not two launches; they are printed for
information. Last, the knob in a simulated decode step (Mixtral 8x7B, TP2 EP4 on one DGX
H100): one TP all-reduce and the step, both engines, eager and graphed.
"""

from __future__ import annotations

import statistics

from moesim.collectives.nccl import estimate, facts_from_params
from moesim.collectives.nccl import launch as L
from moesim.compute.devices import HOPPER_GRAPH_KERNEL_S
from moesim.topology import load_topology

US = 1e-6
KiB = 1024


def _err(model: float, ref: float) -> float:
    return (model - ref) / ref


def _span(errs: list[float]) -> str:
    ok = sum(abs(e) <= 0.25 for e in errs)
    return f"{min(errs):+.1%} .. {max(errs):+.1%}, {ok}/{len(errs)} within 25 %"


def _gpu_us(op: str, per_rank: int, facts) -> tuple[float, str]:
    """NCCL's GPU-time estimate (µs) and choice, sizes as nccl-tests' S."""
    s = per_rank * 8 if op == "all_gather" else per_rank
    t, a, p, _ = estimate(op, s, 8, 1, facts)
    return t * 1e6, f"{a}/{p}"


def _step_rows() -> list[tuple]:
    from pathlib import Path

    from moesim.serve.run import resolve_serve, simulate_serve
    scn = Path(__file__).resolve().parents[1] / "scenarios" / "mixtral-8x7b-serve.yaml"
    rows = []
    for graphs in ("false", "true"):
        for mode in ("exact", "fast"):
            got = []
            for on in ("false", "true"):
                res, cfg = resolve_serve(scn, ["serve.tp=2", "serve.ep=4",
                                               f"serve.cuda_graphs={graphs}",
                                               f"engine.mode={mode}",
                                               f"overlap.collective_launch={on}"])
                r = simulate_serve(res, cfg)
                ar = [sp.end_s - sp.start_s for sp in r.spans
                      if sp.rank == 0 and sp.name == "fwd.tp_attn"]
                got.append((min(ar), r.summary["step_time_s"]))
            rows.append((graphs, mode, got[0], got[1]))
    return rows


def main() -> int:
    topo = load_topology("dgx-h100", nodes=1)
    facts = facts_from_params(topo.params, topo.device, nodes=1, ranks_per_node=8)
    h = L.CALL_HOST_S / US
    lu, fu = L.STREAM_LAUNCH_S / US, HOPPER_GRAPH_KERNEL_S / US
    ag = [v[0] for v in L.SGLANG_BENCH_SYMM_US.values()]
    print("Source: sgl-project/sglang benchmark/kernels/all_reduce/bench_symm.sh at 8e17681e "
          "(8 x H100, bf16); NCCL read at NVIDIA/nccl 5067397c. Times in µs per call; "
          "error = (model - measured) / measured.")
    print()
    print("## Calibration (all-gather only)")
    print()
    print(f"h = median of the all-gather eager figures {sorted(ag)} = {h:.2f} µs; "
          f"L = {lu:.2f} µs (stream launch), F = {fu:.2f} µs (graph floor).")
    print()
    print("## Eager and graphed, per op and size")
    print()
    print("| op | per rank | NCCL's choice | t_gpu | eager model max(h, t+L) | eager measured "
          "| error | graph model t+F | symm graph measured | error | gap model | gap measured "
          "| error | role |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    errs: dict[tuple[str, str], list[float]] = {}
    for op, (ce, cg) in L.SGLANG_COLUMNS.items():
        role = "calibrated" if op == L.CALIBRATED_ON else "held out"
        for size, vals in L.SGLANG_BENCH_SYMM_US.items():
            t, choice = _gpu_us(op, size, facts)
            eager = L.eager_call_s(t * US) / US
            graph = L.graph_call_s(t * US, HOPPER_GRAPH_KERNEL_S) / US
            e_e, e_g = _err(eager, vals[ce]), _err(graph, vals[cg])
            gap, gap_m = eager - graph, vals[ce] - vals[cg]
            e_gap = _err(gap, gap_m)
            errs.setdefault((op, "eager"), []).append(e_e)
            errs.setdefault((op, "graph"), []).append(e_g)
            errs.setdefault((op, "gap"), []).append(e_gap)
            print(f"| {op} | {size // KiB} KiB | {choice} | {t:.2f} | {eager:.2f} | "
                  f"{vals[ce]:.2f} | {e_e:+.1%} | {graph:.2f} | {vals[cg]:.2f} | {e_g:+.1%} | "
                  f"{gap:.2f} | {gap_m:.2f} | {e_gap:+.1%} | {role} |")
    print()
    print("## In a simulated decode step (Mixtral 8x7B, `serve.tp=2`, `serve.ep=4`, one DGX "
          "H100)")
    print()
    print("| serve.cuda_graphs | engine | one TP all-reduce, knob off -> on (µs) | change "
          "| decode step off -> on (ms) |")
    print("|---|---|---|---|---|")
    for graphs, mode, off, on in _step_rows():
        print(f"| {graphs} | {mode} | {off[0] / US:.4f} -> {on[0] / US:.4f} | "
              f"{(on[0] - off[0]) / US:+.4f} | {off[1] * 1e3:.4f} -> {on[1] * 1e3:.4f} |")
    print()
    print("## Summary")
    print()
    print("| figure | errors | role |")
    print("|---|---|---|")
    for (op, kind), e in errs.items():
        if kind == "eager":
            role = "calibrated (not a check)" if op == L.CALIBRATED_ON else "held out"
        elif op == "all_to_all":
            role = "held out"
        else:     # the graph column ran NCCL's symmetric-memory kernels (module doc)
            role = "for information: the graph figure is another kernel (symmetric memory)"
        print(f"| {op} {kind} | {_span(e)} | {role} |")
    held = [x for op in L.HELD_OUT for x in errs[(op, "eager")]]
    print()
    print(f"Held-out eager figures: {_span(held)}; median |error| "
          f"{statistics.median(abs(x) for x in held):.1%}.")
    print()
    print("The all-to-all's host path (16 send/recv tasks and 8 planned p2p rounds where the "
          "all-gather appends one collective) is not priced: no published figure gives its "
          "host time, so it keeps h (what was read and searched: "
          "docs/studies/collective-launch-calibration.md, \"The all-to-all's host path\").")
    return 0


if __name__ == "__main__":
    import sys

    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "collective-launch",
                           "NCCL calls launched eagerly vs from a CUDA graph, against "
                           "sglang's bench_symm"))
