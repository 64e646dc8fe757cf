"""Megatron-Core MoE pre-training of Qwen3-235B-A22B on 256 H800 and 256 H100, as
InternLM's xtuner and NVIDIA measured it layout by layout, against moesim.

    python benchmarks/megatron_moe_h800.py                # ~14 min of CPU
    python benchmarks/megatron_moe_h800.py --rows 1,6     # some rows only
    python benchmarks/megatron_moe_h800.py --write-docs   # docs/results/megatron-moe-h800.md

The measurements: InternLM/xtuner ``docs/en/benchmark/megatron_moe_benchmark.md`` at
79f21364 ("Megatron MoE Training Benchmark and Tuning Guide"): Qwen3-235B-A22B, 256 H800,
sequence 4,096, Pai-Megatron-Patch 2b201af (its Megatron-LM submodule 6a6cd478), BF16,
``--moe-router-force-load-balancing``, no CUDA graphs, ``--moe-permute-fusion``, zero
overlap (``--overlap-grad-reduce --overlap-param-gather``), TP with sequence parallelism,
micro-batch 1 unless a row says otherwise; its tables give each layout's time per
iteration and tokens per GPU per second. The rest of the recipe is Pai-Megatron-Patch's
``examples/qwen3/run_mcore_qwen3.sh`` at 2b201af (model A22B: the alltoall dispatcher,
grouped GEMMs, QK-layernorm, the distributed optimizer). The pipeline splits follow the
page: "one fewer transformer layer is placed in the first and last stages", the embedding
and the loss each counted as a layer (``parallel.pipeline_layout``).

Read from the page and the script, not published, so ours (each printed with the
table): a row with no ``recompute=`` runs without recomputation; zero overlap is on
except in the row that the page's overlap table runs without it; TP communication
overlap only in the row that names it. The capacity-factor rows (routing not forced
balanced, its load not published) are left out. Nothing is fitted: every row is held out.

NVIDIA's rows (13-16): yanring/Megatron-MoE-ModelZoo ``examples/qwen3/readme.md`` at
17070963, "256 H100 GPUS ... InfiniBand 8x50 GB/s", BF16, sequence 4,096, global batch
2,048, forced balance: DeepEP TP2 EP32 PP8 VPP4 with ``moe_act`` and ``layernorm``
recomputed 19.7 s, 17.6 s with the EP all-to-all overlap in 1F1B (``moe_dev`` f3e6c5);
the all-to-all dispatcher TP2 EP8 PP32 VPP3 24.2 s; DeepEP TP4 EP8 PP8 VPP4 29.0 s
(``main`` 1e057005); the flags in ``run_235b.sh`` and
``model_configs/benchmarking/Qwen3-235B-A22B.yaml`` (the same pipeline splits:
``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``).

Besides each row's error, the page prints what the rows measure against each other (the
ratios of two rows that differ in one setting), simulated and measured: a mechanism that
is right moves the step the way the measurement does.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from results_page import error_pct, print_table  # this folder

SOURCE = ("InternLM/xtuner docs/en/benchmark/megatron_moe_benchmark.md at 79f21364 "
          "(Pai-Megatron-Patch 2b201af, Megatron-LM 6a6cd478)")
MODELZOO = ("yanring/Megatron-MoE-ModelZoo examples/qwen3/readme.md and run_235b.sh at "
            "17070963 (Megatron-LM main 1e057005 and moe_dev f3e6c5)")
GPUS = 256
SEQ = 4096
LAYERS = 94

#: each pipeline split as the page describes it: the embedding and the loss counted as
#: one layer each, one fewer decoder layer on the first and the last stage
#: (pp, vpp) -> Megatron-Core layout string (pp * vpp stages)
LAYOUTS = {
    (32, 3): "E|(t|)*94L",                  # 96 virtual stages of one layer
    (32, 1): "Et*2|(t*3|)*30t*2L",          # 2 + 30 x 3 + 2
    (8, 4): "Ett|(ttt|)*30ttL",             # 32 virtual stages of three
    (8, 1): "Et*11|(t*12|)*6t*11L",         # 11 + 6 x 12 + 11
}

#: Megatron-Core recompute settings by the page's names (its "Other settings")
RECOMPUTE = {
    "none": ["memory.recompute=none"],
    "select": ["memory.recompute=selective", "memory.recompute_modules=[moe_act, layernorm]"],
    "moe": ["memory.recompute=selective", "memory.recompute_modules=[moe, layernorm]"],
    "full": ["memory.recompute=full"],      # --recompute-method uniform, 1 layer
}


class Row(NamedTuple):
    """One measured run: its number here, the source's words for it, its layout and
    settings, and the measured seconds per iteration and tokens/GPU/s."""

    n: int
    label: str
    tp: int
    pp: int
    vpp: int
    ep: int
    dispatcher: str          # alltoall | deepep
    mbs: int
    gbs: int
    recompute: str           # a key of RECOMPUTE
    zero_overlap: bool       # --overlap-grad-reduce --overlap-param-gather
    tp_overlap: bool         # --tp-comm-overlap
    step_s: float
    tokens: float
    system: str = "H800"     # H800: xtuner's cluster; H100: NVIDIA's (DGX H100)
    a2a_overlap: bool = False   # Megatron's EP all-to-all overlap in 1F1B


#: xtuner's rows (SOURCE), then NVIDIA's on 256 H100 (MODELZOO)
ROWS = (
    Row(1, "tp2, ep8, pp32, vpp3, mbs=1, recompute=select", 2, 32, 3, 8, "alltoall", 1, 2048,
        "select", True, False, 22.42, 1461.56),
    Row(2, "tp4, ep8, pp8, vpp4, mbs=1", 4, 8, 4, 8, "alltoall", 1, 2048,
        "none", True, False, 35.481, 923.53),
    Row(3, "tp2, ep32, pp8, vpp4, recompute=select", 2, 8, 4, 32, "alltoall", 1, 2048,
        "select", True, False, 35.392, 925.87),
    Row(4, "tp2, ep32, deepep, pp8, vpp4, recompute=select", 2, 8, 4, 32, "deepep", 1, 2048,
        "select", True, False, 25.73, 1273.54),
    Row(5, "tp2, ep8, pp8, recompute=select", 2, 8, 1, 8, "alltoall", 1, 2048,
        "select", False, False, 27.555, 1189.17),
    Row(6, "tp2, ep8, pp8, recompute=select, zero overlap", 2, 8, 1, 8, "alltoall", 1, 2048,
        "select", True, False, 29.66, 1104.8),
    Row(7, "tp2, ep8, pp8, recompute=select, zero/tp overlap", 2, 8, 1, 8, "alltoall", 1,
        2048, "select", True, True, 29.276, 1119.26),
    Row(8, "tp2, ep8, pp32, vpp3, mbs=4, recompute=full", 2, 32, 3, 8, "alltoall", 4, 4096,
        "full", True, False, 43.495, 1506.76),
    Row(9, "tp2, ep8, pp32, mbs=4, recompute=full", 2, 32, 1, 8, "alltoall", 4, 8192,
        "full", True, False, 92.652, 1414.68),
    Row(10, "tp1, ep8, pp32, vpp3, mbs=1, recompute=moe", 1, 32, 3, 8, "alltoall", 1, 2048,
        "moe", True, False, 22.946, 1428.04),
    Row(11, "tp1, ep8, pp32, vpp3, mbs=4, recompute=full", 1, 32, 3, 8, "alltoall", 4, 4096,
        "full", True, False, 42.537, 1540.68),
    Row(12, "tp1, ep8, pp32, vpp3, mbs=8, recompute=full", 1, 32, 3, 8, "alltoall", 8, 8192,
        "full", True, False, 86.186, 1520.8),
    # NVIDIA's: "recompute norm, act" = --recompute-modules moe_act layernorm
    # (examples/qwen3/run_235b.sh); tokens/GPU/s = GBS x 4096 / 256 / step
    Row(13, "DeepEP, TP2 EP32 PP8 VPP4, recompute norm, act", 2, 8, 4, 32, "deepep", 1,
        2048, "select", True, False, 19.7, 2048 * 4096 / 256 / 19.7, "H100"),
    Row(14, "DeepEP, TP2 EP32 PP8 VPP4, recompute norm, act, +1f1b overlap", 2, 8, 4, 32,
        "deepep", 1, 2048, "select", True, False, 17.6, 2048 * 4096 / 256 / 17.6, "H100",
        True),
    Row(15, "A2A, TP2 EP8 PP32 VPP3, recompute norm, act", 2, 32, 3, 8, "alltoall", 1, 2048,
        "select", True, False, 24.2, 2048 * 4096 / 256 / 24.2, "H100"),
    Row(16, "DeepEP, TP4 EP8 PP8 VPP4, no recompute", 4, 8, 4, 8, "deepep", 1, 2048,
        "none", True, False, 29.0, 2048 * 4096 / 256 / 29.0, "H100"),
)

#: pairs of rows that differ in one setting: (what changes, row a, row b); the ratio is
#: step(b) / step(a)
PAIRS = (
    ("TP2 PP32 VPP3 -> TP4 PP8 VPP4", 1, 2),
    ("EP32 alltoall -> DeepEP", 3, 4),
    ("EP32 PP8 VPP4 -> EP8 PP32 VPP3", 4, 1),
    ("PP8 -> PP32 VPP3 (select)", 5, 1),
    ("zero overlap off -> on", 5, 6),
    ("+ TP overlap", 6, 7),
    ("PP32: no VPP -> VPP3 (mbs 4, full; per token)", 9, 8),
    ("TP2 select -> TP1 moe recompute", 1, 10),
    ("TP2 -> TP1 (mbs 4, full)", 8, 11),
    ("mbs 4 -> mbs 8 (TP1, full; per token)", 11, 12),
    ("H100: + EP all-to-all overlap in 1F1B", 13, 14),
    ("H100: EP32 PP8 VPP4 DeepEP -> EP8 PP32 VPP3 A2A", 13, 15),
    ("H100: TP2 EP32 -> TP4 EP8 (DeepEP, PP8 VPP4)", 13, 16),
    ("H800 -> H100 (TP2 EP8 PP32 VPP3 A2A)", 1, 15),
    ("H800 -> H100 (TP2 EP32 PP8 VPP4 DeepEP)", 4, 13),
)

BASE = """name: qwen3-235b-a22b-xtuner-h800
seed: 0
cluster: {topology: dgx-h800, nodes: 32, device: H800, network: flow}
# run_mcore_qwen3.sh A22B: 94 MoE layers, 128 experts top-8, --qk-layernorm
model: {preset: qwen3-235b-a22b, qk_norm: true}
# --moe-router-force-load-balancing; the alltoall dispatcher moves BF16 tokens
routing: {kind: uniform, dispatch_dtype: bf16, combine_dtype: bf16}
parallel: {tp: 2, sequence_parallel: true, pp: 32, vpp: 3, ep: 8, etp: 1, zero: 1,
           ep_backend: {kind: nccl}}
schedule: {kind: interleaved, microbatches: 512, micro_batch_size: 1, seq_len: 4096}
compute: {kind: catalog}
# bf16 training keeps fp32 main gradients and reduces them in fp32 (Megatron-LM 6a6cd478
# megatron/training/arguments.py 674-689: accumulate_allreduce_grads_in_fp32 set unless
# --grad-reduce-in-bf16, which the script does not pass)
memory: {recompute: none, grad_dtype: fp32}
engine: {mode: fast}
"""


def microbatches(row: Row) -> int:
    """Micro-batches per data-parallel rank in one iteration: GBS / (DP x MBS)."""
    return row.gbs // (GPUS // (row.tp * row.pp) * row.mbs)


def peak_gib(res) -> float:
    """``moesim memory``'s busiest rank of a resolved run, GiB."""
    from moesim.memory.report import memory_table
    return max(r["peak_bytes"] for r in memory_table(res)["stages"]) / 2**30


def row_sets(row: Row) -> list[str]:
    """The ``--set`` overrides that write one row on the base scenario."""
    sets = [f"parallel.tp={row.tp}", f"parallel.pp={row.pp}", f"parallel.vpp={row.vpp}",
            f"parallel.ep={row.ep}",
            f"parallel.pipeline_layout={LAYOUTS[(row.pp, row.vpp)]}",
            f"parallel.sequence_parallel={'true' if row.tp > 1 else 'false'}",
            "schedule.kind=" + ("interleaved" if row.vpp > 1 else "1f1b"),
            f"schedule.microbatches={microbatches(row)}",
            f"schedule.micro_batch_size={row.mbs}",
            f"overlap.dp_overlap={'true' if row.zero_overlap else 'false'}",
            f"overlap.tp_comm={'true' if row.tp_overlap else 'false'}",
            *RECOMPUTE[row.recompute]]
    if row.dispatcher == "deepep":
        # moe_enable_deepep (the flex dispatcher); moe_deepep_num_sms 20 at Megatron-LM
        # 6a6cd478 (transformer_config.py)
        sets += ["parallel.ep_backend.kind=deepep", "parallel.ep_backend.sms=20"]
    if row.system == "H100":
        # NVIDIA's cluster: DGX H100 nodes, "InfiniBand 8x50 GB/s" (MODELZOO)
        sets += ["cluster.topology=dgx-h100", "cluster.device=H100"]
    if row.a2a_overlap:
        # --combined-1f1b --combined-1f1b-recipe ep_a2a (run_235b.sh; moe_dev f3e6c5)
        sets.append("overlap.kind=a2a-1f1b")
    return sets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated row numbers (default: all)")
    a = ap.parse_args(argv)
    from moesim.scenario.read import load_scenario
    from moesim.wiring import resolve, simulate

    want = {int(x) for x in a.rows.split(",")} if a.rows else None
    rows = [r for r in ROWS if want is None or r.n in want]
    print(f"Qwen3-235B-A22B on {GPUS} GPUs, BF16, sequence {SEQ:,}, Megatron-Core, forced-"
          f"balanced routing; rows 1-12 on H800 as measured by {SOURCE}; rows 13-16 on H100 "
          f"as measured by {MODELZOO}; s = seconds per iteration; error = simulated / "
          "measured - 1; nothing fitted")
    print()
    found: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "qwen3-235b-a22b-megatron.yaml"
        path.write_text(BASE)
        for row in rows:
            t0 = time.perf_counter()
            res = resolve(load_scenario(path, row_sets(row)))
            sim = simulate(res)
            s = sim.summary
            b = s["breakdown_s"]
            found[row.n] = {"step": float(s["step_time_s"]),
                            "tokens": float(s["tokens_per_s"]) / GPUS,
                            "compute": b["compute"],
                            "a2a": b["ep_dispatch"] + b["ep_combine"],
                            "tp": b.get("tp", 0.0), "bubble": b.get("bubble", 0.0),
                            "dp": b.get("dp", 0.0) + b.get("zero", 0.0),
                            "peak": peak_gib(res),
                            "cpu": time.perf_counter() - t0}
            print(f"  row {row.n}: simulated in {found[row.n]['cpu']:.0f} s", file=sys.stderr)
        out = []
        for row in rows:
            f = found[row.n]
            out.append((str(row.n), row.system, row.label, f"{row.step_s:.2f}",
                        f"{f['step']:.2f}", error_pct(f["step"], row.step_s),
                        f"{row.tokens:,.0f}",
                        f"{f['tokens']:,.0f}", f"{f['compute']:.2f}", f"{f['a2a']:.2f}",
                        f"{f['tp']:.2f}", f"{f['dp']:.2f}", f"{f['bubble']:.2f}",
                        f"{f['peak']:.1f}"))
        print_table(("row", "GPU", "layout (the source's words)", "measured s", "simulated s",
                     "error", "measured tokens/GPU/s", "simulated", "compute s",
                     "all-to-all s", "TP collectives s", "gradient sync s", "bubble s",
                     "memory GiB"), out)
        print()
        print("(compute, all-to-all, TP collectives, gradient sync (data-parallel and ZeRO "
              "collectives), bubble: moesim's breakdown, mean over ranks; memory: `moesim "
              "memory`'s busiest rank, of the 79.6 GiB both GPUs have)")
        print()
        errs = {r.n: found[r.n]["step"] / r.step_s - 1 for r in rows}
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(r.system, []).append(errs[r.n])
            groups.setdefault(f"{r.system} PP{r.pp}", []).append(errs[r.n])
        for k, v in sorted(groups.items()):
            within = sum(abs(e) <= 0.15 for e in v)
            print(f"{k}: {len(v)} rows, {min(v) * 100:+.1f} % .. {max(v) * 100:+.1f} % (median "
                  f"{statistics.median(v) * 100:+.1f} %), {within} within 15 %")
        print()
        # what a fixed cost per layer and micro-batch would have to be to close each row:
        # (measured - simulated) / (micro-batches x decoder layers on a rank)
        per = []
        for r in rows:
            passes = microbatches(r) * math.ceil(LAYERS / r.pp)
            per.append((r.n, (r.step_s - found[r.n]["step"]) / passes))
        lo, hi = min(per, key=lambda x: x[1]), max(per, key=lambda x: x[1])
        print(f"Gap per layer and micro-batch on a rank ((measured - simulated) / "
              f"(micro-batches x {LAYERS} / PP layers)): {lo[1] * 1e3:+.1f} ms (row {lo[0]}) "
              f"to {hi[1] * 1e3:+.1f} ms (row {hi[0]}): no one cost per layer closes them all")
        print()
        if want is None or 5 in want:
            # row 5 with VPP4: the page's run out of memory
            r5 = next(r for r in ROWS if r.n == 5)._replace(vpp=4)
            res = resolve(load_scenario(path, row_sets(r5)))
            peak = peak_gib(res)
            print("Memory held out: row 5 with VPP4 ran out of memory on xtuner's page "
                  "(\"since memory is basically full, once vpp is enabled, it will OOM\"); "
                  f"moesim's busiest rank: {peak:.1f} of 79.6 GiB, so moesim accepts a layout "
                  "that did not fit")
            print()
    pairs = []
    for what, ra, rb in PAIRS:
        if ra not in found or rb not in found:
            continue
        pa, pb = (next(r for r in ROWS if r.n == x) for x in (ra, rb))
        # per token where the two rows' global batches differ
        ma, mb = pa.step_s / pa.gbs, pb.step_s / pb.gbs
        sa, sb = found[ra]["step"] / pa.gbs, found[rb]["step"] / pb.gbs
        pairs.append((what, f"{ra} -> {rb}", f"x{mb / ma:.3f}", f"x{sb / sa:.3f}",
                      "yes" if (mb - ma) * (sb - sa) > 0 else "no"))
    if pairs:
        print("One setting at a time: time per token of row b over row a")
        print()
        print_table(("change", "rows", "measured", "simulated", "same direction"), pairs)
        print()
    print("Ours, not the sources': in xtuner's rows, a row with no recompute= runs without "
          "recomputation, zero overlap is on except in row 5 (the page's overlap table adds "
          "it in row 6) and TP overlap only in row 7. Attention: moesim's default "
          "(FlashAttention-3's rates) in every row: NVIDIA's config sets --use-flash-attn, "
          "xtuner's script's FL switch is not given. NVIDIA's FSDP row (TP2 in its table, "
          "TP1 in its script) is left out.")
    print()
    cpu = sum(f["cpu"] for f in found.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # KiB -> GiB
    med = statistics.median(f["cpu"] for f in found.values())
    print(f"Simulated {len(found)} rows in {cpu:.0f} s (median {med:.0f} s a row); peak "
          f"memory {peak:.2f} GiB")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "megatron-moe-h800",
                           "Megatron MoE pre-training of Qwen3-235B-A22B on 256 H800 and "
                           "256 H100, layout by layout"))
