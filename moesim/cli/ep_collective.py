"""``moesim collective --op ep_dispatch|ep_combine``: one MoE dispatch or combine.

Example::

    moesim collective --topology dgx-h800 --nodes 8 --op ep_dispatch --kernel deepep \\
        --tokens 4096 --hidden 7168 --experts 256 --top-k 8 --max-nodes 4 --dtype fp8 --json
"""

from __future__ import annotations

import argparse
import math

from moesim.cli.common import print_result
from moesim.errors import InputError

_CLI = "command line"
EP_OPS = ("ep_dispatch", "ep_combine")

EPILOG = """\
ep_dispatch / ep_combine: one MoE dispatch or combine of --tokens tokens per rank over
the EP group (all GPUs of the topology unless --ranks), routed by --routing, with
--kernel deepep (DeepEP normal kernels: one RDMA copy per (token, node) to the GPU
with the same local index, forwarded over NVLink once per (token, GPU); intranode
kernels on one node), deepep-ll (low-latency: one message per (token, expert)) or
nccl (pairwise all-to-all, one copy per (token, expert)).
Bandwidths are DeepEP's "bottleneck bandwidth": rdma_GBps = rdma_bytes_per_rank /
time_s and nvl_GBps = nvl_bytes_per_rank / time_s, the bytes the slowest rank
logically moves over that medium (its own node's share included: for dispatch the
(token, node) copies it sends, resp. the (token, GPU) copies it receives; payload
only, as DeepEP's tests count it) divided by the kernel time, notify excluded.
"""


def add_ep_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    g = p.add_argument_group("ep_dispatch / ep_combine")
    g.add_argument("--kernel", default="deepep", help="deepep | deepep-ll | nccl (default deepep)")
    g.add_argument("--tokens", type=int, default=4096, help="tokens per rank (default 4096)")
    g.add_argument("--hidden", type=int, default=7168, help="hidden size (default 7168)")
    g.add_argument("--experts", type=int, default=256, help="routed experts (default 256)")
    g.add_argument("--top-k", type=int, default=8, dest="top_k",
                   help="experts per token (default 8)")
    g.add_argument("--max-nodes", type=int, default=None, dest="max_nodes",
                   help="node-limited routing: a token's experts on at most this many nodes")
    g.add_argument("--dtype", default=None,
                   help="fp8 | bf16 (default fp8 for ep_dispatch, bf16 for ep_combine)")
    g.add_argument("--routing", default="uniform", help="uniform | zipf | hot | dirichlet")
    g.add_argument("--zipf-s", type=float, default=None, dest="zipf_s", help="zipf exponent")
    g.add_argument("--hot-experts", type=int, default=None, dest="hot_experts",
                   help="hot routing: experts 0..n-1 are hot")
    g.add_argument("--hot-fraction", type=float, default=None, dest="hot_fraction",
                   help="hot routing: share of assignments to the hot experts")
    g.add_argument("--sms", type=int, default=None,
                   help="SMs of the DeepEP normal kernels, even (default 20)")
    g.add_argument("--seed", type=int, default=0, help="routing seed (default 0)")


def run_ep(args: argparse.Namespace, ranks: list[int] | None) -> int:
    from moesim.ep.plan import DEFAULT_SMS
    from moesim.ep.simulate import simulate_ep
    from moesim.gating.config import routing_from_dict
    from moesim.topology import load_topology

    if args.nodes is not None and args.nodes < 1:
        raise InputError(_CLI, "--nodes", "a number of nodes >= 1", args.nodes)
    for flag in ("zipf_s", "hot_fraction"):
        v = getattr(args, flag)
        if v is not None and not math.isfinite(v):
            raise InputError(_CLI, "--" + flag.replace("_", "-"), "a finite number", v)
    from moesim.gating.config import KINDS

    if args.routing not in KINDS or args.routing == "file":
        raise InputError(_CLI, "--routing", "one of uniform, zipf, hot, dirichlet", args.routing)
    if args.max_nodes is not None and args.max_nodes < 1:
        raise InputError(_CLI, "--max-nodes", "an integer >= 1", args.max_nodes)
    rd: dict = {"kind": args.routing}
    for key in ("zipf_s", "hot_experts", "hot_fraction", "max_nodes"):
        if getattr(args, key) is not None:
            rd[key] = getattr(args, key)
    cfg = routing_from_dict(rd, _CLI)
    dtype = args.dtype or ("fp8" if args.op == "ep_dispatch" else "bf16")
    params = {} if args.nodes is None else {"nodes": args.nodes}
    topo = load_topology(args.topology, **params)
    res = simulate_ep(topo, args.op, args.kernel, tokens=args.tokens, hidden=args.hidden,
                      experts=args.experts, top_k=args.top_k, dtype=dtype, routing=cfg,
                      ranks=ranks, sms=DEFAULT_SMS if args.sms is None else args.sms,
                      seed=args.seed)
    res["topology"] = args.topology
    return print_result(res, args.json, format_ep)


def format_ep(res: dict) -> str:
    sms = "" if res["sms"] is None else f", {res['sms']} SMs"
    return (f"{res['op']} {res['kernel']} on {res['ranks']} ranks ({res['topology']}, "
            f"{res['ranks_per_node']} per node{sms}), {res['tokens']} tokens/rank, "
            f"{res['dtype']}: {res['time_s'] * 1e6:.1f} us "
            f"(+ notify {res['notify_s'] * 1e6:.1f} us), "
            f"RDMA {res['rdma_GBps']:.1f} GB/s ({res['rdma_bytes_per_rank'] / 1e6:.2f} MB/rank), "
            f"NVLink {res['nvl_GBps']:.1f} GB/s ({res['nvl_bytes_per_rank'] / 1e6:.2f} MB/rank)")
