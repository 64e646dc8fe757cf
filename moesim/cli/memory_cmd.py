"""``moesim memory SCENARIO``: per-stage memory of one rank, against device capacity.

Every rank of a pipeline stage holds the same layers and (with balanced routing) the
same bytes, so the table has one row per stage. Activations alive come from the
schedule (:func:`moesim.schedule.inflight_microbatches`): GPipe keeps m micro-batches,
1F1B p-s on stage s; an interleaved rank holds v chunks, each counted with its own
layers. Categories from :func:`moesim.memory.memory_per_rank`.
"""

from __future__ import annotations

import argparse
import json

from moesim.errors import InputError
from moesim.scenario import load_scenario, resolve
from moesim.scenario.resolve import Resolved
from moesim.schedule import make_order
from moesim.units import GB

# bytes per element of the dispatched tokens: bf16 2; fp8 1 plus one fp32 scale per 128
# values (REFERENCE.md, DeepSeek-V3: 7168 + 224 bytes per token for hidden 7168)
DISPATCH_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0 + 4.0 / 128}
CATEGORIES = ("weights", "gradients", "optimizer", "activations", "token_buffers",
              "recompute_workspace")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file or shipped name (e.g. toy-cpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set parallel.zero=1 (repeatable)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")


def memory_table(res: Resolved) -> dict:
    """Per-stage memory of one rank (bytes), plus the layout it was computed for."""
    from moesim.memory import memory_per_rank, split_layers

    scn, lay = res.scenario, res.layout
    if res.model is None or res.device is None:
        raise InputError(scn.source, "model", "a model and device the memory model can read "
                         "(moesim.model and moesim.compute.devices)", None)
    sch, par = scn.schedule, scn.parallel
    v = par.vpp if sch.kind == "interleaved" else 1
    order = make_order(sch.kind, par.pp, sch.microbatches, v)
    common = dict(micro_batch_tokens=sch.tokens_per_microbatch, seq_len=sch.seq_len,
                  tp=par.tp, pp=par.pp, ep=par.ep, dp=lay.dp, zero=par.zero,
                  recompute=scn.memory.recompute, device=res.device, source=scn.source,
                  dispatch_bytes_per_elem=DISPATCH_BYTES[scn.routing.dispatch_dtype])
    chunks = split_layers(res.model.layers, par.pp * v)  # virtual stage c*p + s
    rows = []
    for s in range(par.pp):
        ops = order[s]
        # chunk activation sets alive at the stage's peak (counting F as +1, B as -1)
        alive = [0] * v
        best, best_alive, total = -1, alive[:], 0
        for o in ops:
            alive[o.chunk] += 1 if o.kind == "F" else -1
            total += 1 if o.kind == "F" else -1
            if total > best:
                best, best_alive = total, alive[:]
        layers = [i for c in range(v) for i in chunks[c * par.pp + s]]
        mem = memory_per_rank(res.model, stage=s, layers=layers, inflight_microbatches=1,
                              **common)
        acts = 0.0
        for c in range(v):
            if best_alive[c] > 0:
                acts += memory_per_rank(res.model, stage=s, layers=list(chunks[c * par.pp + s]),
                                        inflight_microbatches=best_alive[c],
                                        **common).activations
        d = mem.as_dict()
        d["activations"] = acts
        d["peak_bytes"] = sum(d[k] for k in CATEGORIES)
        d["oom"] = d["peak_bytes"] > d["capacity_bytes"]
        ranks = [g[s] for g in lay.pp_groups]
        rows.append({"stage": s, "ranks": len(ranks), "first_rank": min(ranks),
                     "layers": len(layers), "inflight": best, **d})
    return {"scenario": scn.name, "source": scn.source, "device": res.device.name,
            "layout": lay.describe(), "schedule": sch.kind, "microbatches": sch.microbatches,
            "vpp": v, "recompute": scn.memory.recompute, "zero": par.zero,
            "warnings": list(res.warnings), "stages": rows}


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
