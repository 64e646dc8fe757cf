"""DeepSeek-V3 on 2048 GPUs against its published cost, as shipped and with one setting
changed at a time: the table of docs/deepep.md ("DeepSeek-V3 on 2048 GPUs").

    python benchmarks/deepseek_settings.py            # nine runs, ~7 min on 2 cores
    python benchmarks/deepseek_settings.py --profile PATH/train.json  # + the composed step
    python benchmarks/deepseek_settings.py --whatifs  # issue 21's sensitivity table
    python benchmarks/deepseek_settings.py --whatifs --json after.json --before before.json

Each row is ``moesim run scenarios/deepseek-v3-2048.yaml --no-files --json --quiet`` with
the ``--set`` shown. Published: DeepSeek-V3 technical report (arXiv:2412.19437) §1,
180K H800 GPU hours per trillion tokens; at the final batch of 15360 · 4096 = 62.9M
tokens per step that is 11.3 GPU hours per step, 19.9 s on 2048 GPUs. Nothing in moesim
is fitted to it.

Part by part (issue 38): the first rows add what the step has that the shipped scenario
lacks (the MTP module, and a stage split that balances it), the per-pipeline-rank table
says which rank sets the step, DualPipe's counts say how many overlapped pairs a rank
runs, and ``--profile`` composes a rank's busy time from DeepSeek's measured pair, then
sets the lone chunks of pipeline rank 7 beside the profile phase by phase, and each DeepEP
call beside DeepEP's published rate alone (``deepseek_lone.py``; the shipped run then
writes its files to a temporary folder to read its trace).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

import deepseek_campaign  # this folder
from bench_deepseek import PUBLISHED_STEP_S as PUBLISHED_S  # report §1, §4.2 (this folder)

SCENARIO = "scenarios/deepseek-v3-2048.yaml"
#: DeepSeek-V3 as trained, as the scenario ships it: one MTP module (report §2.2; depth
#: D = 1, §4.2) on the last stage, and DualPipe's 16 stages split 3 | 4 x 14 | 2 (+ MTP):
#: the 14 middle stages hold 4 layers each, as the profile's chunks do
#: (deepseek-ai/profile-data README), the 5 left on the two ends that rank 0 and rank 15
#: both hold (stage 0 with the embedding, stage 15 with the MTP module and both heads).
#: DeepSeek's partition is unpublished; this one makes ranks 1..14 hold 8 layers each.
EVEN_SPLIT = ["parallel.decoder_first_pipeline_num_layers=null",
              "parallel.decoder_last_pipeline_num_layers=null"]
SETTINGS = [
    ("as shipped: MTP depth 1, stages 3 + 4 x 14 + 2 (ranks 1-14 hold 8 layers)", []),
    ("MTP depth 1, moesim's even split 3 + 4 x 13 + 3 + 3", EVEN_SPLIT),
    ("no MTP, even split (`model.mtp_layers=0`)", ["model.mtp_layers=0", *EVEN_SPLIT]),
    ("`parallel.ep_backend.sms=24`", ["parallel.ep_backend.sms=24"]),
    ("`overlap.kind=none` (DualPipe order, no F&B interleaving)", ["overlap.kind=none"]),
    ("`parallel.ep_backend.kind=nccl` (DualPipe, NCCL all-to-all)",
     ["parallel.ep_backend.kind=nccl"]),
    ("`schedule.kind=1f1b overlap.kind=none` (DeepEP)",
     ["schedule.kind=1f1b", "overlap.kind=none"]),
    ("`schedule.kind=1f1b overlap.kind=none parallel.ep_backend.kind=nccl`",
     ["schedule.kind=1f1b", "overlap.kind=none", "parallel.ep_backend.kind=nccl"]),
    ("`routing.grad_dispatch_dtype=bf16` (the backward's dispatch in BF16, not FP8)",
     ["routing.grad_dispatch_dtype=bf16"]),
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


def run(sets: list[str], out: str | None = None) -> dict:
    """``moesim run`` of the scenario with ``sets``; ``out``: write its files there."""
    cmd = [sys.executable, "-m", "moesim", "run", SCENARIO, "--json", "--quiet",
           *(["-o", out, "--force"] if out else ["--no-files"])]
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


def dualpipe_counts(P: int, N: int) -> list[tuple[int, int, int, int]]:
    """(half rank h, F&B pairs, lone forwards, lone backwards) per half rank, from the
    reference's eight loops (deepseek-ai/DualPipe ``dualpipe/dualpipe.py`` ``step``):
    pairs 2·(N/2 - P + h + 1) (step 4; the middle rank's first not overlapped) + (P/2 -
    h - 1) (step 5); forwards 2·(P/2 - h - 1) + 2·(h + 1) + (P/2 - h - 1) (steps 1-3)."""
    K, half = P // 2, N // 2
    out = []
    for h in range(K):
        pairs = 2 * (half - P + h + 1) - (1 if h == K - 1 else 0) + (K - h - 1)
        out.append((h, pairs, N - pairs, N - pairs))
    return out


#: the profile's annotations of a lone forward chunk and a lone backward chunk (B + W)
F_PHASES = ("attn(F)", "dispatch(F)", "mlp(F)", "combine(F)")
BW_PHASES = ("combine(B)", "mlp(B)", "dispatch(B)", "attn(B)", "mlp(W)", "attn(W)")


def profile_parts(path: str) -> dict:
    """From DeepSeek's profile (one F&B pair of 4-MoE-layer chunks, EP64, 4096 tokens;
    github.com/deepseek-ai/profile-data ``train.json``): the pair's span, and a lone
    forward / backward chunk as the GPU busy time of the kernels under its annotations
    (its all-to-alls then not hidden; measured while overlapped, so an upper bound)."""
    from moesim.validation.gpu.summary import summarize
    from moesim.validation.gpu.trace import load_gpu_trace
    g = summarize(load_gpu_trace(path))
    busy = {}
    for row in g["phases"]:
        busy[row["phase"]] = busy.get(row["phase"], 0.0) + row["gpu_busy_s"]
    return {"pair": g["span_s"], "F": sum(busy.get(p, 0.0) for p in F_PHASES),
            "BW": sum(busy.get(p, 0.0) for p in BW_PHASES),
            "W": busy.get("mlp(W)", 0.0) + busy.get("attn(W)", 0.0)}


def profile_step(prof: dict, d: dict) -> None:
    """The step composed from the measured pair: a rank holding two 4-MoE-layer stages
    runs pairs x pair + lone chunks x (F + BW) (DualPipe's counts), against the
    simulated busy time (compute + exposed dispatch/combine) of those ranks."""
    print("\nComposed from DeepSeek's measured pair (a rank holding two 4-MoE-layer "
          f"stages): pair {prof['pair'] * 1e3:.1f} ms, lone forward chunk "
          f"{prof['F'] * 1e3:.1f} ms, lone backward chunk (B + W) {prof['BW'] * 1e3:.1f} ms "
          "(kernel busy time under each annotation, all-to-alls included); the "
          "report's bubble (PP/2 - 1)(F&B + B - 3W) = "
          f"{7 * (prof['pair'] + prof['BW'] - 3 * prof['W']):.2f} s:\n")
    composed_table(d, "from the profile: busy (s)",
                   "simulated (MTP, 3 + 4 x 14 + 2): compute + exposed EP (s)",
                   prof["pair"], prof["F"] + prof["BW"])


def composed_table(d: dict, est_head: str, sim_head: str, pair_s: float,
                   lone_s: float) -> None:
    """Pipeline ranks 1, 4 and 7: pairs x ``pair_s`` + lone chunks x ``lone_s`` (a lone
    forward and a lone backward) against the simulated compute + exposed EP (mean over
    the rank's GPUs)."""
    by: dict[int, list] = {}
    for r in d["per_rank"]:
        by.setdefault(r["stage"], []).append(r["breakdown_s"])
    print(f"| pipeline rank | pairs | lone F + lone B | {est_head} | {sim_head} | difference |")
    print("|---|---|---|---|---|---|")
    for h, pairs, lone, _ in dualpipe_counts(16, 120):
        if h not in (1, 4, 7):
            continue
        est = pairs * pair_s + lone * lone_s
        b = by[h]
        sim = sum(x["compute"] + x["ep_dispatch"] + x["ep_combine"] for x in b) / len(b)
        print(f"| {h} | {pairs} | {lone} + {lone} | {est:.2f} | {sim:.2f} | "
              f"{sim / est - 1:+.1%} |")


def lone_parts(profile: str, trace: str, pair: dict, d: dict) -> None:
    """The lone chunks phase by phase, and DeepEP's kernels alone, in a lone chunk and
    inside the profile's pair (``deepseek_lone``); then the rank's busy time composed
    again with the lone chunks' DeepEP calls at DeepEP's published rate alone."""
    import deepseek_lone as dl  # this folder

    from moesim.validation.gpu.summary import summarize
    from moesim.validation.gpu.trace import load_gpu_trace
    prof = dl.profile_lone(summarize(load_gpu_trace(profile)))
    sim = dl.sim_lone(trace, 7, 128)
    ref = dl.alone()
    dl.print_table(sim, prof)
    dl.kernel_table(sim, prof, ref)
    f, bw = dl.lone_at_published(prof, ref)
    print(f"\nComposed again, the lone chunks' DeepEP calls (data kernel, notify, layout) at "
          f"DeepEP's published rate alone, the profile's other kernels kept: lone forward "
          f"{f * 1e3:.1f} ms, lone backward (B + W) {bw * 1e3:.1f} ms; pairs as measured "
          f"({pair['pair'] * 1e3:.1f} ms):\n")
    composed_table(d, "composed, lone DeepEP calls alone (s)",
                   "simulated: compute + exposed EP (s)", pair["pair"], f + bw)

def part_table(rows: list[tuple[str, dict]]) -> None:
    """Per pipeline rank (mean over its 128 GPUs): compute, exposed EP, bubble, the rest;
    rank 0 holds stages 0 and 15, rank 7 stages 7 and 8."""
    print("\nPart by part, per pipeline rank (mean over the rank's 128 GPUs), seconds:\n")
    print("| setting | pipeline rank | compute | exposed dispatch + combine | bubble | "
          "dp + zero | stall + idle | step |")
    print("|---|---|---|---|---|---|---|---|")
    for label, d in rows:
        by: dict[int, list] = {}
        for r in d["per_rank"]:
            by.setdefault(r["stage"], []).append(r["breakdown_s"])
        for s in (0, 1, 7):
            b = by[s]
            m = {k: sum(x[k] for x in b) / len(b) for k in b[0]}
            print(f"| {label} | {s} | {m['compute']:.2f} | "
                  f"{m['ep_dispatch'] + m['ep_combine']:.2f} | {m['bubble']:.2f} | "
                  f"{m['dp'] + m['zero']:.2f} | {m['stall'] + m['idle']:.2f} | "
                  f"{d['step_time_s']:.2f} |")


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--whatifs", action="store_true", help="issue 21's sensitivity table")
    ap.add_argument("--json", help="with --whatifs: write the rows as JSON here")
    ap.add_argument("--before", help="with --whatifs: rows JSON of an earlier revision")
    ap.add_argument("--runs-dir", help="with --whatifs: read the runs' saved --json outputs "
                    f"({', '.join(f + '.json' for f in WHATIF_FILES)}) instead of running")
    ap.add_argument("--profile", help="DeepSeek's train.json (github.com/deepseek-ai/"
                    "profile-data): also compose the step from its measured pair")
    args = ap.parse_args()
    if args.whatifs:
        return whatifs(args.json, args.before, args.runs_dir)
    print(f"published: {PUBLISHED_S:.2f} s per step (DeepSeek-V3 report §1, §4.2)",
          file=sys.stderr)
    print("| setting | step (s) | error vs published | compute, mean over ranks (s) | "
          "exposed dispatch + combine (s) | bubble (s) | stall (s) | peak memory (GB/GPU) |")
    print("|---|---|---|---|---|---|---|---|")
    kept = []
    tmp = tempfile.TemporaryDirectory()
    for label, sets in SETTINGS:
        t0 = time.perf_counter()
        d = run(sets, tmp.name if not kept and args.profile else None)
        b = d["breakdown_s"]
        step = d["step_time_s"]
        print(f"| {label} | {step:.2f} | {step / PUBLISHED_S - 1:+.1%} | {b['compute']:.2f} | "
              f"{b['ep_dispatch'] + b['ep_combine']:.2f} | {b['bubble']:.2f} | "
              f"{b['stall']:.2f} | {d['memory']['peak_bytes_max'] / 1e9:.1f} |", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        if len(kept) < 3:
            kept.append((label.split(" (")[0], d))
    print()
    for label, d in kept[:2]:
        ex = d["breakdown_s"]
        ep = ex["ep_dispatch"] + ex["ep_combine"]
        print(f"{label}: step {d['step_time_s']:.2f} s ({d['step_time_s'] / PUBLISHED_S - 1:+.1%}"
              f"), exposed dispatch + combine {ep:.2f} s = {ep / d['step_time_s']:.1%} of the "
              "step (mean over ranks; target <= 10 %)")
    print("DeepSeek's stage partition is unpublished: the two splits bound the step with MTP.")
    print("The published 19.9 s is wall clock (GPU hours on the cluster), not a step: "
          + deepseek_campaign.line(deepseek_campaign.campaign_wall(kept[0][1]["step_time_s"]),
                                   PUBLISHED_S)
          + " (the checkpoint policy's range: python benchmarks/deepseek_campaign.py)")
    part_table(kept)
    if args.profile:
        pair = profile_parts(args.profile)
        profile_step(pair, kept[0][1])
        lone_parts(args.profile, f"{tmp.name}/trace.json", pair, kept[0][1])
    tmp.cleanup()
    print("\nDualPipe with 16 ranks and 120 micro-batches (15360 / dp 128): every rank runs "
          "120 forward and 120 backward chunks; how many as overlapped F&B pairs (the "
          "profile's unit), by half rank h = min(r, 15 - r), from the reference's loops:\n")
    print("| h | F&B pairs | lone forwards | lone backwards |")
    print("|---|---|---|---|")
    for h, pairs, f, bw in dualpipe_counts(16, 120):
        print(f"| {h} | {pairs} | {f} | {bw} |")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark  # this folder
    sys.exit(run_benchmark(main, "deepseek-settings", "DeepSeek-V3 on 2048 GPUs, one setting at a time"))
