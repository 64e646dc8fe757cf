"""DeepSeek-V3 on 2048 GPUs against its published cost, as shipped and with one setting
changed at a time: the table of docs/deepep.md ("DeepSeek-V3 on 2048 GPUs").

    python benchmarks/deepseek_settings.py            # six runs, ~4 min on 2 cores
    python benchmarks/deepseek_settings.py --whatifs  # issue 21's sensitivity table
    python benchmarks/deepseek_settings.py --whatifs --json after.json --before before.json

Each row is ``moesim run scenarios/deepseek-v3-2048.yaml --no-files --json --quiet`` with
the ``--set`` shown. Published: DeepSeek-V3 technical report (arXiv:2412.19437) §1,
180K H800 GPU hours per trillion tokens; at the final batch of 15360 · 4096 = 62.9M
tokens per step that is 11.3 GPU hours per step, 19.9 s on 2048 GPUs. Nothing in moesim
is fitted to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench_deepseek import PUBLISHED_STEP_S as PUBLISHED_S  # report §1, §4.2 (this folder)

SCENARIO = "scenarios/deepseek-v3-2048.yaml"
SETTINGS = [
    ("as shipped (DualPipe, DeepEP, 20 SMs)", []),
    ("`parallel.ep_backend.sms=24`", ["parallel.ep_backend.sms=24"]),
    ("`overlap.kind=none` (DualPipe order, no F&B interleaving)", ["overlap.kind=none"]),
    ("`parallel.ep_backend.kind=nccl` (DualPipe, NCCL all-to-all)",
     ["parallel.ep_backend.kind=nccl"]),
    ("`schedule.kind=1f1b overlap.kind=none` (DeepEP)",
     ["schedule.kind=1f1b", "overlap.kind=none"]),
    ("`schedule.kind=1f1b overlap.kind=none parallel.ep_backend.kind=nccl`",
     ["schedule.kind=1f1b", "overlap.kind=none", "parallel.ep_backend.kind=nccl"]),
]


#: issue 21's what-ifs (docs/deepep.md, "What-ifs ... before and after"): the questions a
#: wrong compute/communication split answers wrongly. InfiniBand x2 doubles the NIC and
#: the GPU-NIC PCIe link behind it (otherwise PCIe Gen5 x16, 63 GB/s, caps the NIC).
WHATIF_FILES = ("ds_shipped", "ds_ib2", "ds_sms32", "ds_ep32", "ds_1f1b")  # --runs-dir names
WHATIFS = [
    ("as shipped (DualPipe, DeepEP on 20 SMs, EP64)", []),
    ("InfiniBand x2 (`cluster.params.nic_GBps=100 cluster.params.pcie_GBps=126`)",
     ["cluster.params.nic_GBps=100", "cluster.params.pcie_GBps=126"]),
    ("DeepEP on 32 SMs (`parallel.ep_backend.sms=32`)", ["parallel.ep_backend.sms=32"]),
    ("EP32 (`parallel.ep=32`)", ["parallel.ep=32"]),
    ("1F1B instead of DualPipe (`schedule.kind=1f1b overlap.kind=none`)",
     ["schedule.kind=1f1b", "overlap.kind=none"]),
]


def run(sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "moesim", "run", SCENARIO, "--no-files", "--json", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def whatifs(out_json: str | None, before_json: str | None, runs_dir: str | None = None) -> int:
    """The what-if table: each setting's step and its change against as shipped, with the
    compute / exposed-communication split; a before column from ``before_json``;
    ``runs_dir``: the runs' ``--json`` outputs saved as ``WHATIF_FILES`` + ``.json``."""
    rows = []
    for (label, sets), fname in zip(WHATIFS, WHATIF_FILES, strict=True):
        t0 = time.perf_counter()
        if runs_dir:
            with open(f"{runs_dir}/{fname}.json") as f:
                d = json.load(f)
        else:
            d = run(sets)
        b = d["breakdown_s"]
        rows.append({"setting": label, "step_s": d["step_time_s"], "compute_s": b["compute"],
                     "exposed_ep_s": b["ep_dispatch"] + b["ep_combine"],
                     "bubble_s": b["bubble"], "stall_s": b["stall"]})
        print(f"  {label}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if out_json:
        with open(out_json, "w") as f:
            json.dump(rows, f, indent=1)
    before = {}
    if before_json:
        with open(before_json) as f:
            before = {r["setting"]: r for r in json.load(f)}
    base, base_b = rows[0]["step_s"], before.get(rows[0]["setting"], {}).get("step_s")
    print("| setting | step (s) | vs shipped | compute (s) | exposed dispatch + combine (s) "
          "| bubble (s) | stall (s) |" + (" before: step (s) | before: vs shipped | before: "
                                          "compute (s) | before: exposed EP (s) |"
                                          if before else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|---|---|" if before else ""))
    for r in rows:
        cells = (f"| {r['setting']} | {r['step_s']:.2f} | {r['step_s'] / base - 1:+.1%} | "
                 f"{r['compute_s']:.2f} | {r['exposed_ep_s']:.2f} | {r['bubble_s']:.2f} | "
                 f"{r['stall_s']:.2f} |")
        b = before.get(r["setting"])
        if before:
            cells += (" - | - | - | - |" if b is None else
                      f" {b['step_s']:.2f} | {b['step_s'] / base_b - 1:+.1%} | "
                      f"{b['compute_s']:.2f} | {b['exposed_ep_s']:.2f} |")
        print(cells)
    return 0


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--whatifs", action="store_true", help="issue 21's sensitivity table")
    ap.add_argument("--json", help="with --whatifs: write the rows as JSON here")
    ap.add_argument("--before", help="with --whatifs: rows JSON of an earlier revision")
    ap.add_argument("--runs-dir", help="with --whatifs: read the runs' saved --json outputs "
                    f"({', '.join(f + '.json' for f in WHATIF_FILES)}) instead of running")
    args = ap.parse_args()
    if args.whatifs:
        return whatifs(args.json, args.before, args.runs_dir)
    print(f"published: {PUBLISHED_S:.2f} s per step (DeepSeek-V3 report §1, §4.2)",
          file=sys.stderr)
    print("| setting | step (s) | error vs published | compute, mean over ranks (s) | "
          "exposed dispatch + combine (s) | bubble (s) | stall (s) | peak memory (GB/GPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, sets in SETTINGS:
        t0 = time.perf_counter()
        d = run(sets)
        b = d["breakdown_s"]
        step = d["step_time_s"]
        print(f"| {label} | {step:.2f} | {step / PUBLISHED_S - 1:+.1%} | {b['compute']:.2f} | "
              f"{b['ep_dispatch'] + b['ep_combine']:.2f} | {b['bubble']:.2f} | "
              f"{b['stall']:.2f} | {d['memory']['peak_bytes_max'] / 1e9:.1f} |", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark  # this folder
    sys.exit(run_benchmark(main, "deepseek-settings", "DeepSeek-V3 on 2048 GPUs, one setting at a time"))
