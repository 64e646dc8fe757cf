"""NCCL's tuning model (moesim.collectives.nccl) against its published references.

    python benchmarks/nccl_tuning.py            # prints every case: model, reference, error

Cases (each reference is quoted with its source below):

1. 128-byte all-reduce on 2 x DGX H100: NCCL's own tuning estimate, 25.2 µs, Tree/LL,
   printed by NCCL's log in NVIDIA/nccl issue 1453 ("4 Bytes -> Algo 0 proto 0 time
   25.200462": algorithm 0 = Tree, protocol 0 = LL). An estimate, not a measurement.
   That log's rings list ranks up to 23 (>= 3 nodes); NCCL's tree latency is the same
   for 2 and 3 nodes (log2i(3) = 1), so the 2-node model is compared with it.
2. 512 KiB all-reduce, TP16 across 2 DGX H100: ~53 µs by NCCL's model, the figure
   moesim issue 38 quotes for vLLM's TP16 decode all-reduce; TP32 over 4 nodes ~76 µs
   (same source).
3. sglang's bench_symm on 8 x H100 (sgl-project/sglang
   benchmark/kernels/all_reduce/bench_symm.sh, commit 8e17681e, "Results (H100 8-GPU,
   bf16, 500 iters)"): torch eager all_gather_into_tensor and all_to_all_single, per-rank
   input 2 KiB .. 128 KiB (benchmark_symm_mem.py: msg_size = input nbytes). These are
   measurements of back-to-back eager calls, so they include the launch: the model is
   shown alone and plus one stream launch, 2.43 µs (te42kyfo/gpu-benches
   gpu-small-kernels/h200.txt, commit c35574e; the figure moesim/compute/devices.py
   cites). Reduce-scatter rows are printed for information.

The flow network's time (``moesim collective``'s engine, unchanged) is printed beside.
"""

from __future__ import annotations

from moesim.collectives.nccl import estimate, facts_from_params
from moesim.collectives.simulate import simulate_collective
from moesim.topology import load_topology

#: one kernel launched from a stream on Hopper (gpu-benches h200.txt, see above)
STREAM_LAUNCH_US = 2.43
KiB = 1024
#: bench_symm.sh table: per-rank input -> (AG eager, RS eager, A2A eager) µs
SGLANG_EAGER_US = {
    2 * KiB: (14.57, 16.06, 18.34), 4 * KiB: (14.58, 17.48, 17.87),
    8 * KiB: (14.42, 15.82, 17.84), 16 * KiB: (14.03, 18.66, 17.70),
    32 * KiB: (14.37, 18.74, 17.90), 64 * KiB: (15.94, 15.89, 24.99),
    128 * KiB: (18.14, 17.12, 21.18),
}


def _facts(nodes: int):
    topo = load_topology("dgx-h100", nodes=nodes)
    return topo, facts_from_params(topo.params, topo.device, nodes, topo.gpus_per_node)


def _row(case: str, model_us: float, ref_us: float, note: str = "") -> float:
    err = (model_us - ref_us) / ref_us
    print(f"  {case:<46} model {model_us:8.3f} us  reference {ref_us:7.3f} us  "
          f"error {err:+7.2%}  {note}")
    return err


def main() -> int:
    topo2, f2 = _facts(2)
    topo1, f1 = _facts(1)
    print("NCCL tuning model (NVIDIA/nccl 5067397c, NCCL 2.30.7) vs references")
    print("1. all_reduce on 2 x DGX H100 (16 ranks), NCCL's own estimate (issue 1453)")
    for nbytes in (4, 128):
        t, a, p, _ = estimate("all_reduce", nbytes, 8, 2, f2)
        flow = simulate_collective(topo2, "all_reduce", nbytes)["time_s"] * 1e6
        _row(f"{nbytes} B -> {a}/{p}", t * 1e6, 25.200462 if nbytes == 4 else 25.2,
             f"(flow network {flow:.1f} us)")
    print("2. 512 KiB all_reduce, TP16 over 2 x DGX H100 (issue 38: ~53 us by NCCL's model)")
    t, a, p, bd = estimate("all_reduce", 512 * KiB, 8, 2, f2)
    flow = simulate_collective(topo2, "all_reduce", 512 * KiB)["time_s"] * 1e6
    _row(f"512 KiB -> {a}/{p}", t * 1e6, 53.0, f"(flow network {flow:.1f} us)")
    others = ", ".join(f"{k} {v:.1f}" for k, v in bd["candidates"].items())
    print(f"     candidates (us): {others}")
    topo4, f4 = _facts(4)
    t, a, p, _ = estimate("all_reduce", 512 * KiB, 8, 4, f4)
    flow = simulate_collective(topo4, "all_reduce", 512 * KiB)["time_s"] * 1e6
    _row(f"TP32 over 4 nodes, 512 KiB -> {a}/{p}", t * 1e6, 76.0,
         f"(issue 38: ~76 us; flow network {flow:.1f} us)")
    print("3. sglang bench_symm, 8 x H100 eager (measured; model + 2.43 us launch)")
    errs: dict[str, list[float]] = {"all_gather": [], "all_to_all": [], "reduce_scatter": []}
    for size, refs in SGLANG_EAGER_US.items():
        for op, ref in zip(("all_gather", "reduce_scatter", "all_to_all"), refs, strict=True):
            # nccl-tests S: the gathered total for all_gather; the input for the others
            s = size * 8 if op == "all_gather" else size
            t, a, p, _ = estimate(op, s, 8, 1, f1)
            model = t * 1e6 + STREAM_LAUNCH_US
            errs[op].append(_row(f"{op} {size // KiB} KiB/rank -> {a}/{p}", model, ref,
                                 f"(model alone {t * 1e6:.2f} us)"))
    for op, e in errs.items():
        print(f"   {op}: errors {min(e):+.1%} .. {max(e):+.1%}, "
              f"{sum(abs(x) <= 0.25 for x in e)}/{len(e)} within 25 %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
