"""``moesim collective --op dist_topk``: the two ways to shard an LM head for sampling.

Example::

    moesim collective --topology dgx-h100 --op dist_topk --vocab 129280 --k 50 --batch 128

Prints the communication of a vocabulary-sharded head with the distributed top-k
(all-reduce of the max and of the sum of exponentials, one fp32 per token each, and an
all-gather of every rank's k candidates with global ids: exact) against a
hidden-dimension-sharded head that all-reduces the vocabulary-sized fp32 logits of every
token (:mod:`moesim.serve.head`), each collective timed on the topology.
"""

from __future__ import annotations

import argparse

from moesim.cli.common import print_result
from moesim.errors import InputError

_CLI = "command line"
HEAD_OPS = ("dist_topk",)
#: flags of the head ops and their defaults (None in the parser: see EP_DEFAULTS)
HEAD_DEFAULTS = {"vocab": None, "k": None, "batch": None, "head_hidden": 7168}


def add_head_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dist_topk (LM head sampling)")
    g.add_argument("--vocab", type=int, default=None, help="vocabulary size V (tokens)")
    g.add_argument("--k", type=int, default=None, help="top-k kept by the sampler")
    g.add_argument("--batch", type=int, default=None, help="tokens sampled at once (requests)")
    g.add_argument("--head-hidden", type=int, default=None, dest="head_hidden",
                   help="hidden size of the head (default 7168; sets its GEMM only)")


def run_head(args: argparse.Namespace, ranks: list[int] | None) -> int:
    from moesim.collectives.simulate import MODELS
    from moesim.serve.head import head_costs
    from moesim.topology import load_topology

    if args.head_hidden is None:
        args.head_hidden = HEAD_DEFAULTS["head_hidden"]
    for flag in ("vocab", "k", "batch"):
        if getattr(args, flag) is None:
            raise InputError(_CLI, f"--{flag}", f"an integer for --op {args.op}", None)
    if args.nodes is not None and args.nodes < 1:
        raise InputError(_CLI, "--nodes", "a number of nodes >= 1", args.nodes)
    if args.model not in MODELS:
        raise InputError(_CLI, "--model", "one of " + ", ".join(MODELS), args.model)
    params = {} if args.nodes is None else {"nodes": args.nodes}
    topo = load_topology(args.topology, **params)
    n = len(topo.gpus)
    if ranks is not None:
        bad = [r for r in ranks if not 0 <= r < n]
        if bad:
            raise InputError(_CLI, "--ranks", f"ranks in 0..{n - 1} ({n} GPUs)", bad[0])
        if len(set(ranks)) != len(ranks):
            raise InputError(_CLI, "--ranks", "distinct ranks", args.ranks)
    res = head_costs(topo, args.vocab, args.head_hidden, args.batch, args.k, ranks, args.model)
    res["topology"] = args.topology
    return print_result(res, args.json, format_head)


def format_head(res: dict) -> str:
    v, h = res["vocab_sharded"], res["hidden_sharded"]
    return "\n".join([
        f"dist_topk on {res['ranks']} ranks ({res['topology']}), V={res['vocab']}, "
        f"k={res['k']}, batch {res['batch']} tokens ({res['model']} model):",
        f"  vocab-sharded + distributed top-k: {v['time_s'] * 1e6:.1f} us "
        f"(all-reduce max {v['all_reduce_max_s'] * 1e6:.1f} us + sum-exp "
        f"{v['all_reduce_sumexp_s'] * 1e6:.1f} us of {v['all_reduce_max_bytes']:,} B each, "
        f"all-gather {v['all_gather_s'] * 1e6:.1f} us of {v['all_gather_bytes']:,} B); "
        f"{v['sent_per_rank_bytes']:,.0f} B sent per rank, "
        f"{v['gathered_elements_per_rank']:,} candidates received per rank",
        f"  hidden-sharded (all-reduce of V logits per token): {h['time_s'] * 1e6:.1f} us "
        f"({h['all_reduce_logits_bytes']:,} B, {h['sent_per_rank_bytes']:,.0f} B sent per rank)",
        "  hidden-sharded / vocab-sharded time: "
        + (f"{res['speedup']:.1f}x" if res["speedup"] is not None else "n/a (one rank)"),
    ])
