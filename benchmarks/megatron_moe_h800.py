"""Megatron-Core MoE pre-training of Qwen3-235B-A22B on 256 H800, as InternLM's xtuner
measured it layout by layout, against moesim.

    python benchmarks/megatron_moe_h800.py                # ~15 min of CPU
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

Besides each row's error, the page prints what the rows measure against each other (the
ratios of two rows that differ in one setting), simulated and measured: a mechanism that
is right moves the step the way the measurement does.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results_page import print_table  # this folder

SOURCE = ("InternLM/xtuner docs/en/benchmark/megatron_moe_benchmark.md at 79f21364 "
          "(Pai-Megatron-Patch 2b201af, Megatron-LM 6a6cd478)")
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

#: (row, label as the page writes it, tp, pp, vpp, ep, dispatcher, mbs, gbs, recompute,
#:  zero overlap, tp overlap, measured s per iteration, measured tokens/GPU/s)
ROWS = (
    (1, "tp2, ep8, pp32, vpp3, mbs=1, recompute=select", 2, 32, 3, 8, "alltoall", 1, 2048,
     "select", True, False, 22.42, 1461.56),
    (2, "tp4, ep8, pp8, vpp4, mbs=1", 4, 8, 4, 8, "alltoall", 1, 2048,
     "none", True, False, 35.481, 923.53),
    (3, "tp2, ep32, pp8, vpp4, recompute=select", 2, 8, 4, 32, "alltoall", 1, 2048,
     "select", True, False, 35.392, 925.87),
    (4, "tp2, ep32, deepep, pp8, vpp4, recompute=select", 2, 8, 4, 32, "deepep", 1, 2048,
     "select", True, False, 25.73, 1273.54),
    (5, "tp2, ep8, pp8, recompute=select", 2, 8, 1, 8, "alltoall", 1, 2048,
     "select", False, False, 27.555, 1189.17),
    (6, "tp2, ep8, pp8, recompute=select, zero overlap", 2, 8, 1, 8, "alltoall", 1, 2048,
     "select", True, False, 29.66, 1104.8),
    (7, "tp2, ep8, pp8, recompute=select, zero/tp overlap", 2, 8, 1, 8, "alltoall", 1, 2048,
     "select", True, True, 29.276, 1119.26),
    (8, "tp2, ep8, pp32, vpp3, mbs=4, recompute=full", 2, 32, 3, 8, "alltoall", 4, 4096,
     "full", True, False, 43.495, 1506.76),
    (9, "tp2, ep8, pp32, mbs=4, recompute=full", 2, 32, 1, 8, "alltoall", 4, 8192,
     "full", True, False, 92.652, 1414.68),
    (10, "tp1, ep8, pp32, vpp3, mbs=1, recompute=moe", 1, 32, 3, 8, "alltoall", 1, 2048,
     "moe", True, False, 22.946, 1428.04),
    (11, "tp1, ep8, pp32, vpp3, mbs=4, recompute=full", 1, 32, 3, 8, "alltoall", 4, 4096,
     "full", True, False, 42.537, 1540.68),
    (12, "tp1, ep8, pp32, vpp3, mbs=8, recompute=full", 1, 32, 3, 8, "alltoall", 8, 8192,
     "full", True, False, 86.186, 1520.8),
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


def row_sets(row: tuple) -> list[str]:
    """The ``--set`` overrides that write one row on the base scenario."""
    _n, _label, tp, pp, vpp, ep, disp, mbs, gbs, rec, zero_ov, tp_ov, _s, _t = row
    dp = GPUS // (tp * pp)
    sets = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.vpp={vpp}",
            f"parallel.ep={ep}", f"parallel.pipeline_layout={LAYOUTS[(pp, vpp)]}",
            f"parallel.sequence_parallel={'true' if tp > 1 else 'false'}",
            "schedule.kind=" + ("interleaved" if vpp > 1 else "1f1b"),
            f"schedule.microbatches={gbs // (dp * mbs)}",
            f"schedule.micro_batch_size={mbs}",
            f"overlap.dp_overlap={'true' if zero_ov else 'false'}",
            f"overlap.tp_comm={'true' if tp_ov else 'false'}",
            *RECOMPUTE[rec]]
    if disp == "deepep":
        # moe_enable_deepep (the flex dispatcher); moe_deepep_num_sms 20 at Megatron-LM
        # 6a6cd478 (transformer_config.py)
        sets.append("parallel.ep_backend.kind=deepep")
        sets.append("parallel.ep_backend.sms=20")
    return sets


def _err(sim: float, pub: float) -> str:
    return f"{(sim / pub - 1) * 100:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated row numbers (default: all)")
    a = ap.parse_args(argv)
    from moesim.memory.report import memory_table
    from moesim.scenario.read import load_scenario
    from moesim.wiring import resolve, simulate

    want = {int(x) for x in a.rows.split(",")} if a.rows else None
    rows = [r for r in ROWS if want is None or r[0] in want]
    print(f"Qwen3-235B-A22B on {GPUS} H800, BF16, sequence {SEQ:,}, Megatron-Core as "
          f"measured by {SOURCE}; s = seconds per iteration; error = simulated / measured "
          "- 1; nothing fitted")
    print()
    found: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "qwen3-235b-a22b-xtuner-h800.yaml"
        path.write_text(BASE)
        for row in rows:
            t0 = time.perf_counter()
            res = resolve(load_scenario(path, row_sets(row)))
            sim = simulate(res)
            s = sim.summary
            b = s["breakdown_s"]
            found[row[0]] = {"step": float(s["step_time_s"]),
                             "tokens": float(s["tokens_per_s"]) / GPUS,
                             "compute": b["compute"],
                             "a2a": b["ep_dispatch"] + b["ep_combine"],
                             "tp": b.get("tp", 0.0), "bubble": b.get("bubble", 0.0),
                             "dp": b.get("dp", 0.0) + b.get("zero", 0.0),
                             "peak": max(r["peak_bytes"] for r in
                                         memory_table(res)["stages"]) / 2**30,
                             "cpu": time.perf_counter() - t0}
            print(f"  row {row[0]}: simulated in {found[row[0]]['cpu']:.0f} s",
                  file=sys.stderr)
    out = []
    for row in rows:
        n, label, *_rest, rec, zero_ov, tp_ov, pub_s, pub_t = row
        f = found[n]
        out.append((str(n), label, f"{pub_s:.2f}", f"{f['step']:.2f}", _err(f["step"], pub_s),
                    f"{pub_t:,.0f}", f"{f['tokens']:,.0f}", f"{f['compute']:.2f}",
                    f"{f['a2a']:.2f}", f"{f['tp']:.2f}", f"{f['dp']:.2f}", f"{f['bubble']:.2f}",
                    f"{f['peak']:.1f}"))
    print_table(("row", "layout (the page's words)", "measured s", "simulated s", "error",
                 "measured tokens/GPU/s", "simulated", "compute s", "all-to-all s",
                 "TP collectives s", "gradient sync s", "bubble s", "memory GiB"), out)
    print()
    print("(compute, all-to-all, TP collectives, gradient sync (data-parallel and ZeRO "
          "collectives), bubble: moesim's breakdown, mean over ranks; memory: `moesim "
          "memory`'s busiest rank, of the H800's 79.6 GiB)")
    print()
    errs = [found[r[0]]["step"] / r[12] - 1 for r in rows]
    if errs:
        within = sum(abs(e) <= 0.15 for e in errs)
        print(f"Errors: median {statistics.median(errs) * 100:+.1f} %, median |error| "
              f"{statistics.median(abs(e) for e in errs) * 100:.1f} %, "
              f"{min(errs) * 100:+.1f} % .. {max(errs) * 100:+.1f} %; {within} of "
              f"{len(errs)} rows within 15 %")
        print()
    groups = {}
    for r in rows:
        groups.setdefault(f"PP{r[3]}", []).append(found[r[0]]["step"] / r[12] - 1)
    if len(groups) > 1:
        print("By pipeline depth: " + "; ".join(
            f"{k}: {len(v)} rows, {min(v) * 100:+.1f} % .. {max(v) * 100:+.1f} % (median "
            f"{statistics.median(v) * 100:+.1f} %)" for k, v in sorted(groups.items())))
        print()
    if want is None or 5 in want:
        vpp = list(next(r for r in ROWS if r[0] == 5))
        vpp[4] = 4                       # row 5 with VPP4: the page's run out of memory
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "qwen3-235b-a22b-xtuner-h800.yaml"
            path.write_text(BASE)
            res = resolve(load_scenario(path, row_sets(tuple(vpp))))
            peak = max(r["peak_bytes"] for r in memory_table(res)["stages"]) / 2**30
        print(f"Memory held out: row 5 with VPP4 ran out of memory on the page (\"since "
              f"memory is basically full, once vpp is enabled, it will OOM\"); moesim's "
              f"busiest rank: {peak:.1f} of 79.6 GiB, so moesim accepts a layout that did "
              "not fit")
        print()
    pairs = []
    for what, ra, rb in PAIRS:
        if ra not in found or rb not in found:
            continue
        pa, pb = (next(r for r in ROWS if r[0] == x) for x in (ra, rb))
        # per token where the two rows' global batches differ
        ma, mb = pa[12] / pa[8], pb[12] / pb[8]
        sa, sb = found[ra]["step"] / pa[8], found[rb]["step"] / pb[8]
        pairs.append((what, f"{ra} -> {rb}", f"x{mb / ma:.3f}", f"x{sb / sa:.3f}",
                      "yes" if (mb - ma) * (sb - sa) > 0 else "no"))
    if pairs:
        print("One setting at a time: time per token of row b over row a")
        print()
        print_table(("change", "rows", "measured", "simulated", "same direction"), pairs)
        print()
    print("Ours, not the page's: a row with no recompute= runs without recomputation; zero "
          "overlap on except in row 5 (the page's overlap table adds it in row 6); TP "
          "overlap only in row 7; the attention kernels are moesim's default (FlashAttention-"
          "3's rates: the script's FL switch is not given).")
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
                           "Megatron MoE pre-training on 256 H800 (xtuner's measurements)"))
