"""``moesim compare RUN_A RUN_B``: the differences between two runs' summaries."""

from __future__ import annotations

import argparse
import json

from moesim.trace.compare import compare_summaries, format_table, load_summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", help="first run directory (or its summary.json)")
    p.add_argument("run_b", help="second run directory (or its summary.json)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    rows = compare_summaries(load_summary(args.run_a), load_summary(args.run_b))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"A = {args.run_a}\nB = {args.run_b}\n")
        print(format_table(rows))
    return 0
