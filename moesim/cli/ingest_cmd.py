"""``moesim ingest``: read torch.profiler traces of an MoE layer (CPU ops) or of a GPU
run (kernels per CUDA stream)."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="TRACE_DIR_OR_FILES",
                        help="a directory of rank traces (*.json, *.json.gz) or the files; "
                             "a trace with GPU kernels is read as a GPU trace")
    parser.add_argument("--json", action="store_true",
                        help="print everything (ops, phases, byte matrices; for a GPU trace "
                             "a 'gpu' object) as JSON, SI units")
    parser.add_argument("--no-ops", action="store_true",
                        help="with --json: leave out op lists (a GPU trace: its kernel list)")


def run(args: argparse.Namespace) -> int:
    from moesim.validation.cpu.ingest import ingest, trace_files
    from moesim.validation.gpu.trace import gpu_traces

    gpu = gpu_traces(trace_files(args.paths))
    if gpu is not None:
        from moesim.validation.gpu.report import text_report as gpu_text
        from moesim.validation.gpu.summary import kernel_dicts, summarize

        sums = [summarize(t) for t in gpu]
        if args.json and not args.no_ops:
            for s, t in zip(sums, gpu, strict=True):
                s["kernel_list"] = kernel_dicts(t)
        if args.json:
            print(json.dumps({"gpu": sums[0] if len(sums) == 1 else sums}, indent=1))
        else:
            print("\n\n".join(gpu_text(s) for s in sums))
        return 0
    from moesim.validation.cpu.ingest_report import text_report, traceset_dict

    ts = ingest(args.paths)
    if args.json:
        print(json.dumps(traceset_dict(ts, with_ops=not args.no_ops), indent=1))
    else:
        print(text_report(ts))
    return 0
