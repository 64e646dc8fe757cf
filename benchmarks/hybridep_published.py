"""DeepEP's normal kernels as moesim prices them, against HybridEP's published H100 table,
and Megatron's Qwen3-30B-A3B on 16 H100 with its all-to-alls priced either way.

``scenarios/qwen3-30b-a3b-16-h100.yaml`` runs Megatron-Bridge's recipe, whose dispatcher
is HybridEP (DeepEP's hybrid-ep branch, NVIDIA's). HybridEP publishes its own H100
figures (deepseek-ai/DeepEP ``docs/README_Hybrid-EP.md`` at 41cad944, "H100 Platform":
4096 tokens a rank, hidden 7168, top-8, random uniform routing, 8 local experts, 4/8/16
SMs, 16/32/64 ranks; "IB bandwidth", algorithm bandwidth, through the torch API and for
the kernel alone). Its test counts the bytes as DeepEP's do (``tests/test_hybrid_ep.py``:
``count_rdma_send_from_routing_map`` counts the (token, node) pairs, "To align with the
implementation in the DeepEP, we do not set the local node map to zeros"; BF16 2·H bytes
a copy), which is moesim's ``rdma_GBps`` (docs/deepep.md), so the two compare directly.
The table does not say how many GPUs a node held; DGX H100's 8 are taken. 64 ranks of
that shape are over moesim's size limit for one exchange (docs/scenarios.md), so the
16- and 32-rank rows are compared.

First, DeepEP's normal kernels as moesim models them on that benchmark's shape, against
the table: why they cannot stand for HybridEP. Then the 30B's BF16 step with DeepEP
standing for HybridEP and with ``parallel.ep_backend.kind: hybridep`` (the table's torch
API rates, :mod:`moesim.ep.hybridep`), part by part against the measured BF16 step of the
same layout (Megatron-Bridge ``skills/nemo-mbridge-perf-moe-comm-overlap/card.yaml`` at
7ded17da, PR 5094: 24.714 s; its profile's parts as docs/results/published.md derives
them). The measured step sets nothing: the rates are HybridEP's own benchmark's.

    python benchmarks/hybridep_published.py [--write-docs]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_page import print_table  # noqa: E402  (this folder)

#: HybridEP on H100, GB/s ("IB", algorithm bandwidth): (ranks, SMs) -> (torch API: dispatch
#: FP8, dispatch BF16, combine; kernel only: the same three). deepseek-ai/DeepEP
#: docs/README_Hybrid-EP.md at 41cad944, "HybridEP Performance Results (IB Bandwidth in GB/s)"
HYBRIDEP_H100 = {
    (16, 4): (28.09, 37.08, 42.47, 34.00, 44.40, 52.00),
    (16, 8): (44.87, 57.74, 56.96, 62.00, 76.80, 68.00),
    (16, 16): (48.26, 54.47, 53.35, 68.48, 71.71, 62.95),
    (32, 4): (32.58, 44.88, 43.60, 38.50, 52.60, 51.00),
    (32, 8): (41.23, 46.54, 50.68, 51.30, 54.50, 56.40),
    (32, 16): (42.10, 47.36, 52.53, 55.35, 57.69, 57.46),
    (64, 4): (30.42, 40.63, 41.00, 37.50, 48.00, 46.00),
    (64, 8): (35.71, 41.46, 47.68, 46.63, 50.55, 51.03),
    (64, 16): (35.01, 41.24, 46.57, 46.52, 49.97, 49.77),
}
#: the benchmark's shape (the same README and tests/test_hybrid_ep.py defaults)
TOKENS, HIDDEN, TOP_K, LOCAL_EXPERTS = 4096, 7168, 8, 8
#: columns of HYBRIDEP_H100 by (op, dtype)
COLUMNS = {("ep_dispatch", "fp8"): 0, ("ep_dispatch", "bf16"): 1, ("ep_combine", "bf16"): 2}
#: Megatron-Bridge's measured BF16 step of the 30B layout (card.yaml at 7ded17da, PR 5094)
MEASURED_STEP_S = 24.7138
#: the same card's profile: the union of GPU-active intervals on rank 0
MEASURED_GPU_ACTIVE_S = 22.820667
#: its communication kernels, derived on docs/results/published.md (9.079 ms overlapped =
#: 0.11 % of them, the share rounded: 0.105-0.115 %)
MEASURED_COMM_S = (9.079e-3 / 0.00115, 9.079e-3 / 0.00105)


def moesim(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-m", "moesim", *args], capture_output=True, text=True,
                       cwd=ROOT, check=False)
    if p.returncode:
        raise SystemExit(f"moesim {' '.join(args)}: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout)


def exchange(ranks: int, op: str, dtype: str, sms: int, hidden: int = HIDDEN) -> dict:
    return moesim(["collective", "--topology", "dgx-h100", "--nodes", str(ranks // 8),
                   "--op", op, "--kernel", "deepep", "--tokens", str(TOKENS), "--hidden",
                   str(hidden), "--experts", str(LOCAL_EXPERTS * ranks), "--top-k", str(TOP_K),
                   "--dtype", dtype, "--sms", str(sms), "--json"])


def table_rows() -> list[dict]:
    rows = []
    for (ranks, sms), pub in HYBRIDEP_H100.items():
        if ranks > 32:
            continue
        for (op, dtype), col in COLUMNS.items():
            d = exchange(ranks, op, dtype, sms)
            rows.append({"ranks": ranks, "sms": sms, "op": op, "dtype": dtype,
                         "moesim_GBps": d["rdma_GBps"], "torch_GBps": pub[col],
                         "kernel_GBps": pub[col + 3], "time_s": d["time_s"]})
    return rows


def qwen3_steps() -> dict:
    """The 30B's BF16 step with DeepEP's normal kernels standing for HybridEP and with
    HybridEP at its published rates (``parallel.ep_backend.kind: hybridep``, the scenario's)."""
    out = {}
    for kind in ("deepep", "hybridep"):
        d = moesim(["run", "qwen3-30b-a3b-16-h100", "--set", "compute.precision=bf16",
                    "--set", f"parallel.ep_backend.kind={kind}", "--no-files", "--json",
                    "--quiet"])
        b = d["breakdown_s"]
        out[kind] = {"step_s": d["step_time_s"], "ep_s": b["ep_dispatch"] + b["ep_combine"],
                     "compute_s": b["compute"],
                     "wait_s": b.get("stall", 0.0) + b.get("idle", 0.0)}
    return out


def main() -> int:
    t0 = time.perf_counter()
    print("HybridEP's published H100 table (deepseek-ai/DeepEP docs/README_Hybrid-EP.md at "
          "41cad944) against moesim's DeepEP normal kernels on DGX H100 (8 GPUs a node), "
          f"{TOKENS} tokens a rank, hidden {HIDDEN}, top-{TOP_K}, {LOCAL_EXPERTS} local "
          "experts, uniform routing; GB/s = (token, node) copies x bytes / time, own node "
          "included, as both count them; error = moesim / published - 1")
    print()
    rows = table_rows()
    print_table(("ranks", "SMs", "op", "dtype", "moesim GB/s", "torch API GB/s", "error",
                 "kernel only GB/s", "error"),
                ((str(r["ranks"]), str(r["sms"]), r["op"], r["dtype"],
                  f"{r['moesim_GBps']:.1f}", f"{r['torch_GBps']:.2f}",
                  f"{r['moesim_GBps'] / r['torch_GBps'] - 1:+.1%}", f"{r['kernel_GBps']:.2f}",
                  f"{r['moesim_GBps'] / r['kernel_GBps'] - 1:+.1%}") for r in rows))
    print()
    errs = sorted(r["moesim_GBps"] / r["kernel_GBps"] - 1 for r in rows)
    errt = sorted(r["moesim_GBps"] / r["torch_GBps"] - 1 for r in rows)
    print(f"moesim against the kernel-only figures: {errs[0]:+.1%} .. {errs[-1]:+.1%} "
          f"(median {errs[len(errs) // 2]:+.1%}); against the torch API figures: "
          f"{errt[0]:+.1%} .. {errt[-1]:+.1%} (median {errt[len(errt) // 2]:+.1%}).")
    print()
    q = qwen3_steps()
    lo, hi = MEASURED_COMM_S
    print("Qwen3-30B-A3B on 16 H100, BF16 (`qwen3-30b-a3b-16-h100 --set compute.precision="
          "bf16`), seconds per step, mean over ranks; measured: Megatron-Bridge's card at "
          "7ded17da and the parts docs/results/published.md derives from its profile")
    print()
    print_table(("part", "measured", "DeepEP standing for HybridEP", "hybridep (published "
                 "rates)"), (
        ("step", f"{MEASURED_STEP_S:.2f}",
         f"{q['deepep']['step_s']:.2f} ({q['deepep']['step_s'] / MEASURED_STEP_S - 1:+.1%})",
         f"{q['hybridep']['step_s']:.2f} "
         f"({q['hybridep']['step_s'] / MEASURED_STEP_S - 1:+.1%})"),
        ("EP dispatch + combine (measured: all communication kernels)", f"{lo:.2f}-{hi:.2f}",
         f"{q['deepep']['ep_s']:.2f}", f"{q['hybridep']['ep_s']:.2f}"),
        ("compute", f"{MEASURED_GPU_ACTIVE_S - hi:.2f}-{MEASURED_GPU_ACTIVE_S - lo:.2f}",
         f"{q['deepep']['compute_s']:.2f}", f"{q['hybridep']['compute_s']:.2f}"),
        ("GPU idle (measured: the timed step less the profiled GPU-active union, an "
         "estimate; moesim: stall and idle)", f"{MEASURED_STEP_S - MEASURED_GPU_ACTIVE_S:.2f}",
         f"{q['deepep']['wait_s']:.2f}",
         f"{q['hybridep']['wait_s']:.2f}")))
    print()
    by = {(r["ranks"], r["sms"], r["op"], r["dtype"]): r["moesim_GBps"] for r in rows}
    grow = by[(16, 16, "ep_dispatch", "bf16")] / by[(16, 4, "ep_dispatch", "bf16")]
    pub_grow = HYBRIDEP_H100[(16, 16)][4] / HYBRIDEP_H100[(16, 4)][4]
    print(f"Read: from 4 to 16 SMs at 16 ranks moesim's DeepEP dispatch (BF16) gains "
          f"x{grow:.1f}, HybridEP's published kernel x{pub_grow:.1f}: DeepEP's normal kernels "
          "copy through the SMs they hold, HybridEP's through TMA, so DeepEP's model is no "
          "stand-in for HybridEP; `parallel.ep_backend.kind: hybridep` prices HybridEP at "
          "its published torch API rates instead (moesim.ep.hybridep). The measured step "
          "was not used to set anything.")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "hybridep-published",
                           "DeepEP's normal kernels against HybridEP's published H100 table"))
