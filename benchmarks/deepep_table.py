"""Validation table: ``moesim collective --op ep_dispatch|ep_combine`` against DeepEP.

    python benchmarks/deepep_table.py            # every EP size DeepEP reports (~2 min)
    python benchmarks/deepep_table.py --quick    # EP8, EP16 and LL EP8..32 only
    python benchmarks/deepep_table.py --markdown # the table as docs/deepep.md shows it

Published measurements: deepseek-ai/DeepEP, docs/legacy.md ("Performance", the V1
kernels' tables, formerly the README), H800 (~160 GB/s NVLink), one ConnectX-7
InfiniBand 400 Gb/s NIC (~50 GB/s) per GPU.

* Normal kernels: 4096 tokens per rank, hidden 7168, top-4 groups (nodes), top-8 of 256
  experts, FP8 dispatch, BF16 combine; bottleneck bandwidth (NVLink intranode, RDMA
  internode). SMs: 24, as tests/legacy/test_intranode.py and test_internode.py run them
  (``num_sms = 24``).
* Low-latency kernels: 128 tokens per rank, hidden 7168, top-8 of 256 experts (the
  DeepSeek-V3 expert count: 256 divides every EP size listed), FP8 dispatch, BF16
  combine; latency and RDMA bandwidth.

moesim side: topology preset dgx-h800, uniform routing (DeepEP's tests draw random
scores), node-limited to 4 nodes for the normal internode kernels (top-4 groups, one
group per node), seed 0. Nothing here is tuned to the published figures: the error
is what the model gives.
"""

from __future__ import annotations

import argparse
import sys
import time

from moesim.ep.simulate import simulate_ep
from moesim.gating.section import routing_from_dict
from moesim.topology import load_topology

SOURCE = "DeepEP docs/legacy.md, Performance (H800, CX7 IB 400 Gb/s)"
#: (EP, dispatch GB/s, combine GB/s): normal kernels, DeepEP docs/legacy.md
#: "Normal kernels with NVLink and RDMA forwarding" (EP8 NVLink, the others RDMA)
NORMAL = [(8, 153.0, 158.0), (16, 43.0, 43.0), (32, 58.0, 57.0), (64, 51.0, 50.0)]
#: (EP, dispatch µs, dispatch GB/s, combine µs, combine GB/s): low-latency kernels,
#: DeepEP docs/legacy.md "Low-latency kernels with pure RDMA"
LOW_LATENCY = [(8, 77, 98, 114, 127), (16, 118, 63, 195, 74), (32, 155, 48, 273, 53),
               (64, 173, 43, 314, 46), (128, 192, 39, 369, 39), (256, 194, 39, 360, 40)]
GPUS_PER_NODE = 8   # H800 servers of 8 GPUs (DeepSeek-V3 report §3.2.2)
SMS = 24            # tests/legacy/test_internode.py, test_intranode.py: num_sms = 24


def err(sim: float, pub: float) -> float:
    return (sim - pub) / pub * 100.0


def rows(quick: bool = False) -> list[dict]:
    out = []
    for ep, pub_d, pub_c in NORMAL:
        if quick and ep > 16:
            continue
        nodes = max(ep // GPUS_PER_NODE, 1)
        topo = load_topology("dgx-h800", nodes=nodes)
        cfg = routing_from_dict({"max_nodes": 4} if nodes > 1 else {}, "deepep_table")
        for op, dtype, pub in (("ep_dispatch", "fp8", pub_d), ("ep_combine", "bf16", pub_c)):
            t0 = time.perf_counter()
            r = simulate_ep(topo, op, "deepep", tokens=4096, hidden=7168, experts=256, top_k=8,
                            dtype=dtype, routing=cfg, sms=SMS)
            medium = "NVLink" if nodes == 1 else "RDMA"
            sim = r["nvl_GBps"] if nodes == 1 else r["rdma_GBps"]
            out.append({"kernel": "normal", "op": op, "ep": ep, "medium": medium,
                        "time_us": r["time_s"] * 1e6, "pub_us": None,
                        "sim_GBps": sim, "pub_GBps": pub, "err_pct": err(sim, pub),
                        "wall_s": time.perf_counter() - t0})
    for ep, d_us, d_bw, c_us, c_bw in LOW_LATENCY:
        if quick and ep > 32:
            continue
        topo = load_topology("dgx-h800", nodes=max(ep // GPUS_PER_NODE, 1))
        for op, dtype, p_us, p_bw in (("ep_dispatch", "fp8", d_us, d_bw),
                                      ("ep_combine", "bf16", c_us, c_bw)):
            t0 = time.perf_counter()
            r = simulate_ep(topo, op, "deepep-ll", tokens=128, hidden=7168, experts=256,
                            top_k=8, dtype=dtype)
            out.append({"kernel": "low-latency", "op": op, "ep": ep, "medium": "RDMA",
                        "time_us": r["time_s"] * 1e6, "pub_us": float(p_us),
                        "sim_GBps": r["rdma_GBps"], "pub_GBps": float(p_bw),
                        "err_pct": err(r["rdma_GBps"], p_bw),
                        "wall_s": time.perf_counter() - t0})
    return out


def format_rows(table: list[dict], markdown: bool) -> str:
    head = ("kernel", "op", "EP", "medium", "sim time (µs)", "pub time (µs)",
            "sim GB/s", "pub GB/s", "error (bandwidth)")
    lines = []
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
    else:
        lines.append(f"{head[0]:<12} {head[1]:<12} {head[2]:>4} {head[3]:<7} {head[4]:>14} "
                     f"{head[5]:>14} {head[6]:>9} {head[7]:>9} {head[8]:>17}")
    for r in table:
        pub_us = "-" if r["pub_us"] is None else f"{r['pub_us']:.0f}"
        cells = (r["kernel"], r["op"], str(r["ep"]), r["medium"], f"{r['time_us']:.0f}", pub_us,
                 f"{r['sim_GBps']:.1f}", f"{r['pub_GBps']:.0f}", f"{r['err_pct']:+.1f} %")
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(f"{cells[0]:<12} {cells[1]:<12} {cells[2]:>4} {cells[3]:<7} "
                         f"{cells[4]:>14} {cells[5]:>14} {cells[6]:>9} {cells[7]:>9} "
                         f"{cells[8]:>17}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small EP sizes only")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    table = rows(args.quick)
    print(format_rows(table, args.markdown))
    errs = [abs(r["err_pct"]) for r in table]
    print(f"\nsource: {SOURCE}; moesim: dgx-h800 preset, uniform routing, seed 0")
    print(f"mean |error| {sum(errs) / len(errs):.1f} %, max |error| {max(errs):.1f} %; "
          f"wall {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark  # this folder
    sys.exit(run_benchmark(main, "deepep", "DeepEP kernels against DeepEP's published figures"))
