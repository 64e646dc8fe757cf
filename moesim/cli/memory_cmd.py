"""``moesim memory SCENARIO``: per-stage memory of one rank, against device capacity.

Every rank of a pipeline stage holds the same layers and (with balanced routing) the
same bytes, so the table has one row per stage. Activations alive come from the
schedule (:func:`moesim.schedule.inflight_microbatches`): GPipe keeps m micro-batches,
1F1B p-s on stage s; an interleaved rank holds v chunks, each counted with its own
layers. Categories from :func:`moesim.memory.model.memory_per_rank`.
"""

from __future__ import annotations

import argparse
import json

from moesim.memory.report import memory_table
from moesim.scenario import load_scenario, resolve
from moesim.units import GB


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file or shipped name (e.g. toy-cpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set parallel.zero=1 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")


def _gb(x: float) -> str:
    return f"{x / GB:8.2f}"


def format_table(t: dict) -> str:
    lay = t["layout"]
    lines = [
        f"scenario {t['scenario']}: {lay['world']} ranks, tp={lay['tp']} pp={lay['pp']} "
        f"dp={lay['dp']} ep={lay['ep']} edp={lay['edp']}, ZeRO-{t['zero']}, {t['schedule']} "
        f"m={t['microbatches']}" + (f" v={t['vpp']}" if t["vpp"] > 1 else "")
        + f", recompute {t['recompute']}, device {t['device']}",
        "memory of one rank per pipeline stage, GB (10^9 bytes)",
        f"{'stage':>5} {'layers':>6} {'inflight':>8} {'weights':>8} {'grads':>8} "
        f"{'optim':>8} {'activ':>8} {'buffers':>8} {'recomp':>8} {'total':>8} "
        f"{'capacity':>8}  OOM",
    ]
    for r in t["stages"]:
        lines.append(
            f"{r['stage']:>5} {r['layers']:>6} {r['inflight']:>8} {_gb(r['weights'])} "
            f"{_gb(r['gradients'])} {_gb(r['optimizer'])} {_gb(r['activations'])} "
            f"{_gb(r['token_buffers'])} {_gb(r['recompute_workspace'])} {_gb(r['peak_bytes'])} "
            f"{_gb(r['capacity_bytes'])}  {'OOM' if r['oom'] else 'ok'}")
    lines.append("inflight: activation sets alive at the stage's peak (micro-batches; "
                 "chunks when interleaved)")
    lines += [f"warning: {w}" for w in t["warnings"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    scn = load_scenario(args.scenario, args.overrides, resolve=False)
    table = memory_table(resolve(scn))
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        print(format_table(table))
    return 0
