"""``moesim kernels SCENARIO [--layer N] [--pass fwd|dgrad|wgrad] [--json]``: one layer's
kernels on one rank, as a profiler would show them.

For one micro-batch of the scenario (``micro_batch_size · seq_len / cp`` tokens per rank,
balanced routing: :mod:`moesim.program.inventory`), every kernel of layer N in each pass
(forward; dgrad = the input-gradient backward ``B``; wgrad = the weight-gradient ``W``),
op by op: its name, class, kind, dtype, shape, FLOPs, HBM bytes, what priced it (a
kernel catalog row, or the roofline) and its time on the scenario's compute model.
Identical kernels of one op (a rank's experts' shares of one grouped launch) are one row
with their multiplicity ``x``.

``--fusion NAMES`` (or the scenario's ``compute.fusion``) lists the fused kernels and
then the layer unfused and fused side by side: per op and pass, the time, HBM bytes and
launches of each, and each pass's memory-bound total (:mod:`moesim.model.kernels.fusion`).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from moesim.cli.common import add_output_flags
from moesim.errors import InputError
from moesim.program.inventory import PASSES, balanced_rows, layer_ops, price
from moesim.scenario import load_scenario
from moesim.wiring import resolve


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file or shipped name (e.g. toy-cpu)")
    p.add_argument("--layer", type=int, default=None,
                   help="layer index (default: the first MoE layer, else 0)")
    p.add_argument("--pass", dest="pass_", choices=PASSES, default=None,
                   help="one pass only (default: all three)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set compute.precision=fp8 (repeatable)")
    p.add_argument("--fusion", default=None, metavar="NAMES",
                   help="fuse kernel pairs (comma-separated: residual_norm, norm_cast, "
                        "act_cast, permute_cast, ce_chunked; = --set compute.fusion=NAMES) "
                        "and show the layer unfused and fused side by side")
    add_output_flags(p, json_help="print the kernels as JSON", strict=False, quiet=False)


def shape(k) -> str:
    if k.kind in ("attn_fwd", "attn_bwd"):
        return f"t{k.m} s{k.seq} h{k.heads}x{k.head_dim}" + (" causal" if k.causal else "")
    if k.m and k.n and k.k:
        return f"{k.m}x{k.n}x{k.k}"
    return ""


def rows_of(res, layer: int, pass_: str) -> list[dict]:
    out = []
    for o in layer_ops(res, layer, pass_):
        for k, n in Counter(o.kernels).items():
            t, src, detail = price(res.compute, k)
            out.append({"pass": pass_, "op": o.op, "kernel": k.name, "x": n,
                        "class": k.kclass, "kind": k.kind, "dtype": k.dtype or "-",
                        "shape": shape(k), "m": k.m, "n": k.n, "k": k.k, "flops": k.flops,
                        "bytes": k.bytes, "launches": 0 if k.fused else k.count,
                        "priced_by": src, "detail": detail, "time_s": t})
    return out


def inventory(res, layer: int, passes: tuple[str, ...]) -> dict:
    spec, sch = res.model, res.scenario.schedule
    local, rows = balanced_rows(res)
    return {
        "scenario": res.scenario.name, "layer": layer, "moe": spec.is_moe_layer(layer),
        "device": getattr(res.device, "name", str(res.device)),
        "compute_model": getattr(res.compute, "name", type(res.compute).__name__),
        "precision": spec.precision,
        # the FP8 recipe's quantisation kernels (compute.fp8_recipe), under FP8 GEMMs
        "fp8_recipe": getattr(spec, "fp8_recipe", "blockwise") if spec.precision == "fp8"
        else None,
        "tokens_per_rank": sch.micro_batch_size * sch.seq_len // max(res.layout.cp, 1),
        "local_experts": local, "rows_per_expert": rows,
        "kernels": [r for p in passes for r in rows_of(res, layer, p)],
        "units": "FLOP, bytes (HBM read + written), seconds; x = identical kernels",
    }


def _totals(rows: list[dict]) -> dict:
    """{(pass, op): [seconds, bytes, launches]} and {(pass, "memory-bound"): ...}."""
    out: dict = {}
    for r in rows:
        for key in ((r["pass"], r["op"]),) + (((r["pass"], "memory-bound"),)
                                              if r["kind"] == "memory" else ()):
            t = out.setdefault(key, [0.0, 0.0, 0])
            t[0] += r["x"] * r["time_s"]
            t[1] += r["x"] * r["bytes"]
            t[2] += r["x"] * r["launches"]
    return out


def side_by_side(unfused: list[dict], fused: list[dict]) -> list[dict]:
    """Per pass and op (then each pass's memory-bound kernels), unfused against fused."""
    a, b = _totals(unfused), _totals(fused)
    return [{"pass": p, "op": op, "unfused_s": a.get((p, op), [0.0])[0],
             "fused_s": b.get((p, op), [0.0])[0],
             "bytes_saved": a.get((p, op), [0, 0.0])[1] - b.get((p, op), [0, 0.0])[1],
             "launches_saved": a.get((p, op), [0, 0, 0])[2] - b.get((p, op), [0, 0, 0])[2]}
            for p, op in sorted(dict.fromkeys([*a, *b]),
                                key=lambda k: (PASSES.index(k[0]), k[1] == "memory-bound"))]


def _fmt_fusion(doc: dict) -> str:
    f = doc["fusion"]
    lines = ["", f"fusion {', '.join(f['names'])}: layer {doc['layer']} unfused and fused",
             f"{'pass':<7}{'op':<16}{'unfused us':>11}{'fused us':>11}{'change':>9}"
             f"{'MB saved':>10}{'launches saved':>16}"]
    for r in f["ops"]:
        ch = (r["fused_s"] / r["unfused_s"] - 1) if r["unfused_s"] else 0.0
        lines.append(f"{r['pass']:<7}{r['op']:<16}{r['unfused_s'] * 1e6:>11.1f}"
                     f"{r['fused_s'] * 1e6:>11.1f}{ch:>+9.1%}{r['bytes_saved'] / 1e6:>10.2f}"
                     f"{r['launches_saved']:>16d}")
    u = sum(r["unfused_s"] for r in f["ops"] if r["op"] != "memory-bound")
    v = sum(r["fused_s"] for r in f["ops"] if r["op"] != "memory-bound")
    lines.append(f"layer total {u * 1e3:.3f} ms unfused, {v * 1e3:.3f} ms fused "
                 f"({(v / u - 1) if u else 0.0:+.2%})")
    return "\n".join(lines)


def _fmt(doc: dict) -> str:
    lines = [f"scenario {doc['scenario']}, layer {doc['layer']} "
             f"({'MoE' if doc['moe'] else 'dense'}), one rank, one micro-batch of "
             f"{doc['tokens_per_rank']} tokens, {doc['precision']} GEMMs"
             + (f" ({doc['fp8_recipe']} recipe)" if doc.get("fp8_recipe") else "")
             + ", device "
             f"{doc['device']}, compute model {doc['compute_model']}"]
    if doc["moe"]:
        lines.append(f"balanced routing: {doc['local_experts']} local experts x "
                     f"{doc['rows_per_expert']} rows")
    head = (f"{'op':<15}{'kernel':<32}{'x':>3} {'class':<12}{'kind':<14}{'dtype':<6}"
            f"{'shape (m x n x k)':<24}{'GFLOP':>9}{'MB':>9}{'time us':>10}  priced by")
    for p in PASSES:
        ks = [r for r in doc["kernels"] if r["pass"] == p]
        if not ks:
            continue
        lines += ["", f"pass {p}", head]
        for r in ks:
            by = r["priced_by"] + (f": {r['detail']}" if r["detail"] else "")
            lines.append(f"{r['op']:<15}{r['kernel'][:31]:<32}{r['x']:>3} {r['class']:<12}"
                         f"{r['kind']:<14}{r['dtype']:<6}{r['shape'][:23]:<24}"
                         f"{r['x'] * r['flops'] / 1e9:>9.2f}{r['x'] * r['bytes'] / 1e6:>9.1f}"
                         f"{r['x'] * r['time_s'] * 1e6:>10.1f}  {by}")
        total = sum(r["x"] * r["time_s"] for r in ks)
        by_cls: dict[str, float] = {}
        for r in ks:
            by_cls[r["class"]] = by_cls.get(r["class"], 0.0) + r["x"] * r["time_s"]
        lines.append(f"pass {p} total {total * 1e3:.3f} ms: " + ", ".join(
            f"{c} {t * 1e3:.3f}" for c, t in sorted(by_cls.items(), key=lambda x: -x[1])))
        roof = [r for r in ks if r["priced_by"] != "catalog"]
        if any(r["priced_by"] == "catalog" for r in ks) or roof:
            rt = sum(r["x"] * r["time_s"] for r in roof)
            lines.append(f"pass {p} priced by the roofline: {sum(r['x'] for r in roof)} of "
                         f"{sum(r['x'] for r in ks)} kernels, "
                         f"{rt / total if total else 0:.1%} of the pass's time")
    if "fusion" in doc:
        lines.append(_fmt_fusion(doc))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from moesim.cli.common import refuse_serving
    from moesim.cli.layout_cmd import refuse_rl
    overrides = list(args.overrides)
    if args.fusion is not None:
        overrides.append(f"compute.fusion={args.fusion}")
    scn = load_scenario(args.scenario, overrides)
    refuse_serving(scn, overrides, "kernels", "list a training layer's kernels")
    refuse_rl(scn, args.scenario, overrides, "kernels",
              "list the kernels of the parallel: section's layout")
    res = resolve(scn)
    spec = res.model
    if args.layer is None:
        layer = next((i for i in range(spec.layers) if spec.is_moe_layer(i)), 0)
    else:
        layer = args.layer
        top = getattr(spec, "blocks", spec.layers)     # MTP layers follow the decoder's
        if not 0 <= layer < top:
            raise InputError("command line", "--layer",
                             f"a layer index from 0 to {top - 1}", layer)
    passes = (args.pass_,) if args.pass_ else PASSES
    doc = inventory(res, layer, passes)
    names = tuple(scn.compute.fusion)
    if names:
        plain = resolve(load_scenario(args.scenario, [*overrides, "compute.fusion=[]"]))
        doc["fusion"] = {"names": list(names), "ops": side_by_side(
            inventory(plain, layer, passes)["kernels"], doc["kernels"])}
    print(json.dumps(doc, indent=1) if args.json else _fmt(doc))
    return 0
