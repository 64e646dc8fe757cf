"""The Llama 3 405B pre-training campaign (campaigns/llama3-405b.yaml: 16,384 H100s, the
interruption table of arXiv 2407.21783 §3.3.4 Table 5) simulated over its 54 days:
interruptions and their mix against the table, the ETTR beside Meta's "more than 90 %",
the checkpoint interval a sweep finds beside Young's and Daly's, and the what-ifs
(interval, async, in-memory checkpoints, hot spares, replica failure domain), each over
many seeds. Then a DeepSeek-V3 campaign whose step is simulated (deepseek-v3-2048).

    python benchmarks/campaign_llama3.py [--seeds 100] [--no-deepseek] [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from moesim.campaign.run import run_campaign
from moesim.campaign.spec import read_campaign
from moesim.campaign.summary import text

DAYS = 54.0


def _runs(camp, seeds: int, **kw) -> list[dict]:
    return [run_campaign(camp, None, None, "", days=DAYS, tokens=None, seed=s, sweep=False,
                         **kw).summary for s in range(seeds)]


def _pct(xs: list[float]) -> str:
    return f"{100 * statistics.mean(xs):.2f} % ± {100 * statistics.stdev(xs):.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--no-deepseek", action="store_true")
    args = ap.parse_args()
    camp = read_campaign("llama3-405b")
    print("## One campaign (seed 0), as `moesim train --campaign llama3-405b --days 54` "
          "prints it\n")
    t0 = time.process_time()
    one = run_campaign(camp, None, None, "", days=DAYS, tokens=None, seed=0)
    print(text(one.summary))
    print(f"\n(CPU {time.process_time() - t0:.2f} s with the interval sweep of "
          f"{len(one.summary['sweep']['rows'])} campaigns)\n")

    print(f"## Interruptions over {args.seeds} seeds against the table's expectation\n")
    runs = _runs(camp, args.seeds)
    n = [r["interruptions"] for r in runs]
    exp = runs[0]["interruptions_expected"]
    print(f"interruptions in 54 days: mean {statistics.mean(n):.1f}, sd "
          f"{statistics.stdev(n):.1f} over {args.seeds} seeds; expected {exp:.1f} "
          f"(Poisson sd {exp ** 0.5:.1f}); Meta's table: 466\n")
    print("| cause | per | table (54 days) | simulated mean | share of all, simulated | "
          "share of all 466, table |")
    print("|---|---|---:|---:|---:|---:|")
    total = statistics.mean(n)
    for i, c in enumerate(runs[0]["by_cause"]):
        m = statistics.mean(r["by_cause"][i]["simulated"] for r in runs)
        print(f"| {c['cause']} | {c['per']} | {c['expected']:.0f} | {m:.2f} | "
              f"{100 * m / total:.1f} % | {100 * c['expected'] / exp:.1f} % |")
    print()
    e = [r["ettr"] for r in runs]
    print(f"ETTR at the file's 30-minute synchronous checkpoints: {_pct(e)} (mean ± sd over "
          f"seeds); first-order expectation {100 * runs[0]['expected_ettr']:.2f} %; "
          f"Meta: more than 90 %\n")

    print(f"## What-ifs, ETTR mean ± sd over {min(args.seeds, 30)} seeds (same failures "
          "for every policy)\n")
    sw = one.summary["sweep"]
    best = sw["best_s"]
    slow = {"write_Bps": 100e9, "read_Bps": 100e9}
    rows = [("as the file: sync to storage every 30 min", {}),
            (f"interval {best / 60:.1f} min (the sweep's best)", {"interval_s": best}),
            (f"interval {sw['young_s'] / 60:.1f} min (Young)", {"interval_s": sw["young_s"]}),
            ("async checkpoints", {"mode": "async"}),
            ("in-memory checkpoints (Gemini)", {"target": "memory"}),
            ("32 hot spare nodes", {"spare_nodes": 32}),
            ("failure domain: DP replica", {"domain": "replica"}),
            ("storage at 100 GB/s (a 57 s write), sync", slow),
            ("storage at 100 GB/s, async", dict(slow, mode="async")),
            ("storage at 100 GB/s, in-memory checkpoints (Gemini)", dict(slow, target="memory")),
            (f"all: {best / 60:.1f} min, async, memory, 32 spares, replica",
             {"interval_s": best, "mode": "async", "target": "memory", "spare_nodes": 32,
              "domain": "replica"})]
    k = min(args.seeds, 30)
    print("| policy | ETTR | lost work (h) | recovery (h) | checkpoint pauses (h) |")
    print("|---|---:|---:|---:|---:|")
    for label, kw in rows:
        rs = _runs(camp.with_(**kw), k)
        print(f"| {label} | {_pct([r['ettr'] for r in rs])} | "
              f"{statistics.mean(r['lost_work_s'] for r in rs) / 3600:.1f} | "
              f"{statistics.mean(r['recovery_s'] for r in rs) / 3600:.1f} | "
              f"{statistics.mean(r['checkpoint_pause_s'] for r in rs) / 3600:.2f} |")
    print()
    print("Each cost assumed, and its source:\n")
    for key, src in (
            ("step 6.22 s, 16,777,216 tokens", "arXiv 2407.21783 Table 4: 2,048 sequences "
             "of 8,192 tokens; 6 × 405e9 × tokens / (16,384 × 400 TFLOP/s)"),
            ("checkpoint 5.67 TB", "405e9 parameters × (2 B bf16 + 12 B fp32 master, Adam "
             "m, v), ZeRO arXiv 1910.02054 §3.1"),
            ("storage 2 TB/s, 240 PB", "Tectonic, arXiv 2407.21783 §3.3.1"),
            ("detect a hang 600 s", "PyTorch's default NCCL process-group timeout"),
            ("detect a crash 10 s, relaunch 120 s, replace a node 600 s, hot spare 30 s, "
             "repair 3 days", "assumptions (not published)"),
            ("NCCL init 30 s", "MegaScale, arXiv 2402.15627 §3.5: under 30 s beyond 10,000 "
             "GPUs"),
            ("host copy 64 GB/s per GPU", "PCIe Gen5 x16 (H100 datasheet)"),
            ("peer copy 50 GB/s per GPU", "400 Gb/s per GPU, arXiv 2407.21783 §3.3.1")):
        print(f"- {key}: {src}")
    if not args.no_deepseek:
        from moesim.campaign.run import resolve_step

        print("\n## DeepSeek-V3 on 2,048 H800s, the step simulated (deepseek-v3-2048), "
              "default rates scaled to its size, 54 days\n")
        t0 = time.process_time()
        res, step_s, src = resolve_step("deepseek-v3-2048", [], None)
        ds = run_campaign(read_campaign(None), res, step_s, src, days=DAYS, tokens=None,
                          seed=0)
        print(text(ds.summary))
        print(f"\n(CPU {time.process_time() - t0:.1f} s, the step's simulation included)")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "campaign", "Training campaigns: the Llama 3 405B run "
                           "and its what-ifs"))
