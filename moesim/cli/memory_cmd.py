"""``moesim memory SCENARIO``: per-stage memory of one rank, against device capacity.

Every rank of a pipeline stage holds the same layers and (with balanced routing) the
same bytes, so the table has one row per stage, plus a row for the stage's most loaded
rank where skewed routing gives it larger token buffers
(:func:`moesim.program.routed_memory.stage_max_rows`). Activations alive come from the
schedule (:func:`moesim.schedule.inflight_microbatches`): GPipe keeps m micro-batches,
1F1B p-s on stage s; an interleaved rank holds v chunks, each counted with its own
layers. Categories from :func:`moesim.memory.model.memory_per_rank`.

Sizes print in GiB (2^30 bytes): the capacity is the memory the card reports
(:data:`moesim.compute.devices.DEVICES`), and the verdict is the one every command gives
(:mod:`moesim.memory.fit`: ``fit`` and ``oom`` in ``--json``, a summary line).

``--megatron``: stage 0 beside Megatron-LM's own estimate
(:mod:`moesim.memory.megatron`), per category with the difference.

``moesim memory --matmul M K N [--dtype bf16] [--tp T] [--pp P]``: every tensor of one
matmul Y = X·W (:mod:`moesim.memory.matmul`), whole and per GPU.
"""

from __future__ import annotations

import argparse
import json

from moesim.cli.common import add_output_flags, refuse_serving
from moesim.errors import InputError
from moesim.memory.fit import fit_line, fit_summary, step_fits
from moesim.memory.matmul import DTYPE_BYTES, matmul_report
from moesim.memory.megatron import compare
from moesim.memory.report import memory_table
from moesim.program.routed_memory import stage_max_rows
from moesim.scenario import load_scenario
from moesim.units import GiB
from moesim.wiring import resolve


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?",
                   help="scenario YAML file or shipped name (e.g. toy-cpu)")
    p.add_argument("--matmul", nargs=3, type=int, metavar=("M", "K", "N"),
                   help="instead of a scenario: the tensors of Y = X·W, X (M,K), W (K,N)")
    p.add_argument("--dtype", default=None, help="with --matmul: element type "
                   f"({', '.join(DTYPE_BYTES)}; default bf16)")
    p.add_argument("--tp", type=int, default=None,
                   help="with --matmul: tensor-parallel GPUs (default 1)")
    p.add_argument("--pp", type=int, default=None,
                   help="with --matmul: pipeline stages (default 1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set parallel.zero=1 (repeatable)")
    p.add_argument("--megatron", action="store_true",
                   help="also print Megatron-LM's theoretical memory estimate for the first "
                        "stage beside moesim's, per category (docs/model.md)")
    add_output_flags(p, json_help="print the table as JSON", quiet=False)


def _gib(x: float) -> str:
    return f"{x / GiB:8.2f}"


def format_table(t: dict) -> str:
    lay = t["layout"]
    lines = [
        f"scenario {t['scenario']}: {lay['world']} ranks, tp={lay['tp']} pp={lay['pp']} "
        f"dp={lay['dp']} ep={lay['ep']} edp={lay['edp']}"
        + (f" cp={lay['cp']} etp={lay['etp']}" if "cp" in lay else "")
        + f", ZeRO-{t['zero']}, {t['schedule']} "
        f"m={t['microbatches']}" + (f" v={t['vpp']}" if t["vpp"] > 1 else "")
        + f", recompute {t['recompute']}, device {t['device']}",
        "memory of one rank per pipeline stage, GiB (2^30 bytes)",
        f"{'stage':>5} {'layers':>6} {'inflight':>8} {'weights':>8} {'grads':>8} "
        f"{'optim':>8} {'activ':>8} {'buffers':>8} {'recomp':>8} {'total':>8} "
        f"{'capacity':>8}  OOM",
    ]
    hows = set()
    for r in t["stages"]:
        rows = [(f"{r['stage']:>5}", r)]
        mx = r.get("max_rank")
        if mx and mx["peak_bytes"] > r["peak_bytes"]:
            rows.append((f"r{mx['rank']:<4}"[:5].rjust(5), mx))
            hows.add(mx["how"])
        for label, x in rows:
            lines.append(
                f"{label} {x['layers']:>6} {x['inflight']:>8} {_gib(x['weights'])} "
                f"{_gib(x['gradients'])} {_gib(x['optimizer'])} {_gib(x['activations'])} "
                f"{_gib(x['token_buffers'])} {_gib(x['recompute_workspace'])} "
                f"{_gib(x['peak_bytes'])} {_gib(x['capacity_bytes'])}  "
                f"{'OOM' if x['oom'] else 'ok'}")
    lines.append("inflight: activation sets alive at the stage's peak (micro-batches; "
                 "chunks when interleaved)")
    if hows:
        lines.append("r<N>: the stage's most loaded rank, whose experts receive more tokens "
                     "(larger token buffers); "
                     + ("routed exactly as the run routes them, so its total is the run's "
                        "peak" if hows == {"routed"} else
                        "from expected expert shares (too many micro-batches to route "
                        "here): the run's peak also has sampling variation"))
    lines.append(f"peak over all ranks: {t['peak_bytes_max'] / GiB:.2f} GiB")
    if "fit" in t:
        lines.append(fit_line(t["fit"]).strip())
    lines += [f"warning: {w}" for w in t["warnings"]]
    if "megatron" in t:
        lines += ["", format_megatron(t["megatron"])]
    return "\n".join(lines)


def format_megatron(c: dict) -> str:
    """moesim's first stage beside Megatron's estimate, GiB, per category."""
    lines = [f"stage 0 against Megatron's estimate ({c['megatron_source']}), GiB (2^30 bytes)",
             f"{'category':<20} {'moesim':>9} {'megatron':>9} {'moesim-meg':>10}"]
    for r in c["rows"]:
        lines.append(f"{r['category']:<20} {r['moesim'] / GiB:9.2f} "
                     f"{r['megatron'] / GiB:9.2f} {r['difference'] / GiB:+10.2f}")
    lines.append("why they differ, category by category: docs/model.md, "
                 "\"Memory against Megatron's estimate\"")
    return "\n".join(lines)


def _gib3(x: float) -> str:
    return f"{x / GiB:10.3f}"


def format_matmul(t: dict) -> str:
    tp, pp = t["tp"], t["pp"]
    lines = [f"Y = X·W with X ({t['m']}, {t['k']}), W ({t['k']}, {t['n']}), {t['dtype']}; "
             f"tp={tp} (W split by columns), pp={pp}; GiB (2^30 bytes), as `moesim memory`",
             f"{'tensor':<22} {'phase':<9} {'shape':>15} {'whole':>10} "
             f"{'per-GPU shape':>15} {'per GPU':>10}"]
    for x in t["tensors"]:
        lines.append(f"{x['name']:<22} {x['phase']:<9} {'x'.join(map(str, x['shape'])):>15} "
                     f"{_gib3(x['bytes'])} {'x'.join(map(str, x['gpu_shape'])):>15} "
                     f"{_gib3(x['gpu_bytes'])}")
    lines += [f"forward (X, W, Y): {t['forward_bytes'] / GiB:.3f} GiB in all, "
              f"{t['forward_gpu_bytes'] / GiB:.3f} GiB per GPU with tp={tp}",
              f"training (+ dY, dX, dW, Adam states): {t['training_bytes'] / GiB:.3f} GiB "
              f"in all, {t['training_gpu_bytes'] / GiB:.3f} GiB per GPU with tp={tp}"]
    if pp > 1:
        lines.append(f"pp={pp} cannot split one matmul (stages hold whole layers): one stage's "
                     f"GPUs hold {t['training_gpu_bytes'] / GiB:.3f} GiB each, the other "
                     f"{pp - 1} stages none of it")
    return "\n".join(lines)


def stage_fits(table: dict) -> list:
    """One :class:`moesim.memory.fit.Fit` per pipeline stage (its most loaded rank), named
    as ``moesim run`` names them."""
    rows = [{"stage": r["stage"], "peak_bytes": max(r["peak_bytes"],
                                                    r.get("max_rank", r)["peak_bytes"])}
            for r in table["stages"]]
    cap = table["stages"][0]["capacity_bytes"] if table["stages"] else float("inf")
    return step_fits({"per_rank": rows, "capacity_bytes": cap})


def run(args: argparse.Namespace) -> int:
    matmul_only = {"--dtype": args.dtype, "--tp": args.tp, "--pp": args.pp}
    if args.matmul is None:
        given = [(f, v) for f, v in matmul_only.items() if v is not None]
        if given:   # a scenario's layout comes from its file (--set parallel.tp=...)
            raise InputError("command line", given[0][0], f"{given[0][0]} only with --matmul "
                             "(for a scenario: --set parallel.tp=N, parallel.pp=N)",
                             given[0][1])
    if args.matmul is not None:
        if args.scenario is not None:
            raise InputError("command line", "--matmul", "either a scenario or --matmul, "
                             "not both", args.scenario)
        if args.overrides:
            raise InputError("command line", "--set", "--set only with a scenario (not "
                             "--matmul)", args.overrides[0])
        if getattr(args, "megatron", False):
            raise InputError("command line", "--megatron", "--megatron only with a scenario "
                             "(not --matmul)", True)
        m, k, n = args.matmul
        t = matmul_report(m, k, n, "bf16" if args.dtype is None else args.dtype,
                          1 if args.tp is None else args.tp, 1 if args.pp is None else args.pp)
        print(json.dumps(t, indent=2) if args.json else format_matmul(t))
        return 0
    if args.scenario is None:
        raise InputError("command line", "scenario", "a scenario file or --matmul M K N", None)
    scn = load_scenario(args.scenario, args.overrides)
    refuse_serving(scn, args.overrides, "memory", "count a training step's gradients and "
                   "optimizer states; `moesim serve` prints the serving memory")
    res = resolve(scn)
    table = memory_table(res)
    maxr = stage_max_rows(res)
    for row in table["stages"]:
        if row["stage"] in maxr:
            row["max_rank"] = maxr[row["stage"]]
    table["peak_bytes_max"] = max(max(r["peak_bytes"], r.get("max_rank", r)["peak_bytes"])
                                  for r in table["stages"])
    table["fit"] = fit_summary(stage_fits(table))
    table["oom"] = table["fit"]["oom"]
    if args.megatron:
        table["megatron"] = compare(res, table["stages"][0])
    if args.json:
        print(json.dumps(table, indent=2))
    else:
        print(format_table(table))
    if args.strict:     # the table is printed; a stage over capacity is then exit 2
        from moesim.memory.fit import fits_of, flag_fits
        flag_fits(fits_of(table["fit"]), "memory", strict=True)
    return 0
