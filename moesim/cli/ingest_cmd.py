"""``moesim ingest``: read torch.profiler traces of an MoE layer."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="TRACE_DIR_OR_FILES",
                        help="a directory of rank traces (*.json, *.json.gz) or the files")
    parser.add_argument("--json", action="store_true",
                        help="print everything (ops, phases, byte matrices) as JSON, SI units")
    parser.add_argument("--no-ops", action="store_true", help="with --json: leave out op lists")


def run(args: argparse.Namespace) -> int:
    from moesim.validation.ingest import ingest
    from moesim.validation.ingest_report import text_report, traceset_dict

    ts = ingest(args.paths)
    if args.json:
        print(json.dumps(traceset_dict(ts, with_ops=not args.no_ops), indent=1))
    else:
        print(text_report(ts))
    return 0
