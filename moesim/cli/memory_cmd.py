"""``moesim memory SCENARIO``: per-stage memory of one rank, against device capacity.

Every rank of a pipeline stage holds the same layers and (with balanced routing) the
same bytes, so the table has one row per stage. Activations alive come from the
schedule (:func:`moesim.schedule.inflight_microbatches`): GPipe keeps m micro-batches,
1F1B p-s on stage s; an interleaved rank holds v chunks, each counted with its own
layers. Categories from :func:`moesim.memory.model.memory_per_rank`.

``moesim memory --matmul M K N [--dtype bf16] [--tp T] [--pp P]``: every tensor of one
matmul Y = X·W (:mod:`moesim.memory.matmul`), whole and per GPU.
"""

from __future__ import annotations

import argparse
import json

from moesim.errors import InputError
from moesim.memory.matmul import DTYPE_BYTES, matmul_report
from moesim.memory.report import memory_table
from moesim.scenario import load_scenario, resolve
from moesim.units import GB, GiB


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?",
                   help="scenario YAML file or shipped name (e.g. toy-cpu)")
    p.add_argument("--matmul", nargs=3, type=int, metavar=("M", "K", "N"),
                   help="instead of a scenario: the tensors of Y = X·W, X (M,K), W (K,N)")
    p.add_argument("--dtype", default="bf16", help="with --matmul: element type "
                   f"({', '.join(DTYPE_BYTES)}; default bf16)")
    p.add_argument("--tp", type=int, default=1, help="with --matmul: tensor-parallel GPUs")
    p.add_argument("--pp", type=int, default=1, help="with --matmul: pipeline stages")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set parallel.zero=1 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")


def _gb(x: float) -> str:
    return f"{x / GB:8.2f}"


def format_table(t: dict) -> str:
    lay = t["layout"]
    lines = [
        f"scenario {t['scenario']}: {lay['world']} ranks, tp={lay['tp']} pp={lay['pp']} "
        f"dp={lay['dp']} ep={lay['ep']} edp={lay['edp']}"
        + (f" cp={lay['cp']} etp={lay['etp']}" if "cp" in lay else "")
        + f", ZeRO-{t['zero']}, {t['schedule']} "
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


def _gib(x: float) -> str:
    return f"{x / GiB:10.3f}"


def format_matmul(t: dict) -> str:
    tp, pp = t["tp"], t["pp"]
    lines = [f"Y = X·W with X ({t['m']}, {t['k']}), W ({t['k']}, {t['n']}), {t['dtype']}; "
             f"tp={tp} (W split by columns), pp={pp}; GiB (2^30 bytes)",
             f"{'tensor':<22} {'phase':<9} {'shape':>15} {'whole':>10} "
             f"{'per-GPU shape':>15} {'per GPU':>10}"]
    for x in t["tensors"]:
        lines.append(f"{x['name']:<22} {x['phase']:<9} {'x'.join(map(str, x['shape'])):>15} "
                     f"{_gib(x['bytes'])} {'x'.join(map(str, x['gpu_shape'])):>15} "
                     f"{_gib(x['gpu_bytes'])}")
    lines += [f"forward (X, W, Y): {t['forward_bytes'] / GiB:.3f} GiB in all, "
              f"{t['forward_gpu_bytes'] / GiB:.3f} GiB per GPU with tp={tp}",
              f"training (+ dY, dX, dW, Adam states): {t['training_bytes'] / GiB:.3f} GiB in "
              f"all, {t['training_gpu_bytes'] / GiB:.3f} GiB per GPU with tp={tp}"]
    if pp > 1:
        lines.append(f"pp={pp} cannot split one matmul (stages hold whole layers): one stage's "
                     f"GPUs hold {t['training_gpu_bytes'] / GiB:.3f} GiB each, the other "
                     f"{pp - 1} stages none of it")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.matmul is not None:
        if args.scenario is not None:
            raise InputError("command line", "--matmul", "either a scenario or --matmul, "
                             "not both", args.scenario)
        m, k, n = args.matmul
        t = matmul_report(m, k, n, args.dtype, args.tp, args.pp)
        print(json.dumps(t, indent=2) if args.json else format_matmul(t))
        return 0
    if args.scenario is None:
        raise InputError("command line", "scenario", "a scenario file or --matmul M K N", None)
    scn = load_scenario(args.scenario, args.overrides, resolve=False)
    table = memory_table(resolve(scn))
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        print(format_table(table))
    return 0
