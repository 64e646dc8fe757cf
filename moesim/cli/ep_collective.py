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
kernels on one node), deepep-ll (low-latency: one message per (token, expert)),
nccl (pairwise all-to-all, one copy per (token, expert)) or hybridep (DeepEP's copies
at HybridEP's published H100 rates; H100 only, 16-64 ranks of 8 a node).
Bandwidths are DeepEP's "bottleneck bandwidth": rdma_GBps = rdma_bytes_per_rank /
time_s and nvl_GBps = nvl_bytes_per_rank / time_s, the bytes the slowest rank
logically moves over that medium (its own node's share included: for dispatch the
(token, node) copies it sends, resp. the (token, GPU) copies it receives; payload
only, as DeepEP's tests count it) divided by the kernel time, notify excluded.
"""


#: flags of the EP ops and their defaults (None in the parser, so that a flag given to
#: an op it does not apply to is seen and refused)
EP_DEFAULTS = {"kernel": "deepep", "tokens": 4096, "hidden": 7168, "experts": 256,
               "top_k": 8, "max_nodes": None, "dtype": None, "routing": "uniform",
               "zipf_s": None, "hot_experts": None, "hot_fraction": None, "sms": None,
               "seed": 0}


def add_ep_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    g = p.add_argument_group("ep_dispatch / ep_combine")
    g.add_argument("--kernel", default=None,
                   help="deepep | deepep-ll | nccl | hybridep (default deepep)")
    g.add_argument("--tokens", type=int, default=None, help="tokens per rank (default 4096)")
    g.add_argument("--hidden", type=int, default=None, help="hidden size (default 7168)")
    g.add_argument("--experts", type=int, default=None, help="routed experts (default 256)")
    g.add_argument("--top-k", type=int, default=None, dest="top_k",
                   help="experts per token (default 8)")
    g.add_argument("--max-nodes", type=int, default=None, dest="max_nodes",
                   help="node-limited routing: a token's experts on at most this many of "
                        "the nodes the EP ranks span")
    g.add_argument("--dtype", default=None,
                   help="fp8 | bf16 (default fp8 for ep_dispatch, bf16 for ep_combine)")
    g.add_argument("--routing", default=None,
                   help="uniform | zipf | hot | dirichlet (default uniform)")
    g.add_argument("--zipf-s", type=float, default=None, dest="zipf_s", help="zipf exponent")
    g.add_argument("--hot-experts", type=int, default=None, dest="hot_experts",
                   help="hot routing: experts 0..n-1 are hot")
    g.add_argument("--hot-fraction", type=float, default=None, dest="hot_fraction",
                   help="hot routing: share of assignments to the hot experts")
    g.add_argument("--sms", type=int, default=None,
                   help="SMs of the DeepEP normal kernels (--kernel deepep), even, fewer "
                        "than the device's (default 20)")
    g.add_argument("--seed", type=int, default=None, help="routing seed (default 0)")


def run_ep(args: argparse.Namespace, ranks: list[int] | None) -> int:
    from moesim.ep.simulate import ep_layout, simulate_ep
    from moesim.gating.section import routing_from_dict
    from moesim.scenario.limits import check_ep_exchange
    from moesim.topology import load_topology

    for key, default in EP_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.nodes is not None and args.nodes < 1:
        raise InputError(_CLI, "--nodes", "a number of nodes >= 1", args.nodes)
    for flag in ("zipf_s", "hot_fraction"):
        v = getattr(args, flag)
        if v is not None and not math.isfinite(v):
            raise InputError(_CLI, "--" + flag.replace("_", "-"), "a finite number", v)
    from moesim.gating.kinds import names

    if args.routing not in names(files=False):
        raise InputError(_CLI, "--routing", "one of " + ", ".join(names(files=False)),
                         args.routing)
    if args.max_nodes is not None and args.max_nodes < 1:
        raise InputError(_CLI, "--max-nodes", "an integer >= 1", args.max_nodes)
    if args.sms is not None and args.kernel not in ("deepep", "hybridep"):
        raise InputError(_CLI, "--sms", "no --sms with --kernel " + str(args.kernel) + " (it "
                         "sets the SMs of DeepEP's normal kernels or HybridEP's, --kernel "
                         "deepep or hybridep)", args.sms)
    rd: dict = {"kind": args.routing}
    for key in ("zipf_s", "hot_experts", "hot_fraction", "max_nodes"):
        if getattr(args, key) is not None:
            rd[key] = getattr(args, key)
    cfg = routing_from_dict(rd, _CLI)
    dtype = args.dtype or ("fp8" if args.op == "ep_dispatch" else "bf16")
    params = {} if args.nodes is None else {"nodes": args.nodes}
    topo = load_topology(args.topology, **params)
    gpus, per_node = ep_layout(topo, ranks)
    check_ep_exchange(len(gpus), args.tokens, args.experts, args.top_k)
    nodes = len(gpus) // max(per_node, 1)
    if args.max_nodes is not None and args.max_nodes > nodes:
        raise InputError(_CLI, "--max-nodes", f"at most the {nodes} node(s) the {len(gpus)} "
                         "EP ranks span (node-limited routing picks among them)",
                         args.max_nodes)
    dev_sms = _device_sms(topo)
    if args.sms is not None and dev_sms and args.sms >= dev_sms:
        raise InputError(_CLI, "--sms", f"fewer than the device's {dev_sms} SMs "
                         f"({getattr(topo, 'device', '')})", args.sms)
    res = simulate_ep(topo, args.op, args.kernel, tokens=args.tokens, hidden=args.hidden,
                      experts=args.experts, top_k=args.top_k, dtype=dtype, routing=cfg,
                      ranks=ranks, sms=_default_sms(args.kernel) if args.sms is None
                      else args.sms,
                      seed=args.seed)
    res["topology"] = args.topology
    return print_result(res, args.json, format_ep)


def _default_sms(kernel: str) -> int:
    """SMs unless told: DeepEP's 20, HybridEP's 16 (Megatron's moe_hybridep_num_sms)."""
    from moesim.ep.plan import DEFAULT_SMS
    from moesim.scenario.schema import HYBRIDEP_DEFAULT_SMS

    return HYBRIDEP_DEFAULT_SMS if kernel == "hybridep" else DEFAULT_SMS


def _device_sms(topo) -> int:
    """SMs of the topology's GPUs (0 where it names no device)."""
    from moesim.compute.devices import get_device

    dev = getattr(topo, "device", None)
    if dev is None:
        return 0
    spec = get_device(dev) if isinstance(dev, str) else dev
    return int(getattr(spec, "sms", 0) or 0)


def format_ep(res: dict) -> str:
    sms = "" if res["sms"] is None else f", {res['sms']} SMs"
    return (f"{res['op']} {res['kernel']} on {res['ranks']} ranks ({res['topology']}, "
            f"{res['ranks_per_node']} per node{sms}), {res['tokens']} tokens/rank, "
            f"{res['dtype']}: {res['time_s'] * 1e6:.1f} us "
            f"(+ notify {res['notify_s'] * 1e6:.1f} us), "
            f"RDMA {res['rdma_GBps']:.1f} GB/s ({res['rdma_bytes_per_rank'] / 1e6:.2f} MB/rank), "
            f"NVLink {res['nvl_GBps']:.1f} GB/s ({res['nvl_bytes_per_rank'] / 1e6:.2f} MB/rank)")
