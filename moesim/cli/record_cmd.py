"""``moesim record``: profile a real torch expert-parallel MoE layer."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from moesim.cli.common import finite_float
    from moesim.validation.recorder.record import RecordConfig

    d = RecordConfig(outdir="")
    parser.add_argument("outdir", metavar="OUTDIR", help="directory for rank{r}.json.gz + routing.json")
    parser.add_argument("--world", type=int, default=d.world, help="processes (ranks)")
    parser.add_argument("--skew", choices=["uniform", "zipf", "hot"], default=d.skew,
                        help="router bias added to the logits")
    parser.add_argument("--zipf-s", type=finite_float, default=d.zipf_s, help="zipf exponent")
    parser.add_argument("--hot-fraction", type=finite_float, default=d.hot_fraction,
                        help="target share of (token, expert) assignments for hot expert 0 "
                             "(with top-k, k times that share of the tokens pick it)")
    parser.add_argument("--hidden", type=int, default=d.hidden, help="model dim")
    parser.add_argument("--ffn", type=int, default=d.ffn, help="expert FFN dim (SwiGLU)")
    parser.add_argument("--experts", type=int, default=d.experts)
    parser.add_argument("--top-k", type=int, default=d.top_k)
    parser.add_argument("--tokens", type=int, default=d.tokens, help="tokens per rank per step")
    parser.add_argument("--steps", type=int, default=d.steps, help="total steps (incl. warm-up)")
    parser.add_argument("--warmup", type=int, default=d.warmup, help="untraced first steps")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default=d.backend)
    parser.add_argument("--no-gzip", action="store_true", help="write plain rank{r}.json")
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUTDIR")
    parser.add_argument("--pin", action="store_true",
                        help="pin rank r to its own CPU core (steadier timings)")
    parser.add_argument("--nice", type=int, default=d.nice,
                        help="niceness increment per rank, e.g. -15 (negative needs root)")
    parser.add_argument("--shape-sweep", action="store_true",
                        help="instead of a run: time the layer's expert GEMMs and memory-bound "
                             "ops on 1 .. world·tokens·top-k rows in one process, for "
                             "moesim calibrate --shape-sweep OUTDIR")
    parser.add_argument("--points", type=int, default=16,
                        help="--shape-sweep: geometric grid points of row counts")
    parser.add_argument("--repeats", type=int, default=5,
                        help="--shape-sweep: traced passes over the grid")
    parser.add_argument("--release-memory", action="store_true",
                        help="let glibc return freed memory to the kernel each step (default: "
                             "keep it, as a caching allocator does; docs/validation.md)")


def run(args: argparse.Namespace) -> int:
    from moesim.validation.recorder.record import RecordConfig, record

    if args.shape_sweep:
        from moesim.validation.recorder.sweep_record import SweepConfig, record_sweep

        record_sweep(SweepConfig(outdir=args.outdir, world=args.world, experts=args.experts,
                                 hidden=args.hidden,
                                 ffn=args.ffn, top_k=args.top_k, tokens=args.tokens,
                                 points=args.points, repeats=args.repeats, seed=args.seed,
                                 gzip=not args.no_gzip, pin=args.pin, nice=args.nice,
                                 keep_memory=not args.release_memory,
                                 device="cuda" if args.backend == "nccl" else "cpu"),
                     force=args.force)
        return 0
    cfg = RecordConfig(outdir=args.outdir, world=args.world, skew=args.skew, zipf_s=args.zipf_s,
                       hot_fraction=args.hot_fraction, hidden=args.hidden, ffn=args.ffn,
                       experts=args.experts, top_k=args.top_k, tokens=args.tokens,
                       steps=args.steps, warmup=args.warmup, seed=args.seed,
                       backend=args.backend, gzip=not args.no_gzip, pin=args.pin,
                       nice=args.nice, keep_memory=not args.release_memory)
    record(cfg, force=args.force)
    return 0
