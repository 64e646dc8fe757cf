"""``moesim models``: what a scenario can name, one line each.

Model presets (``model: {preset: NAME}``): layers, width, attention, routed experts /
top-k (+ shared), parameters in total and active per token (:func:`moesim.model.count_params`;
active includes the embedding table and the output head). Devices (``cluster.device``):
memory as the card reports it, peak dense bf16 / fp8 tensor FLOP/s and HBM bandwidth
(:data:`moesim.compute.devices.DEVICES`). Topologies (``cluster.topology``): GPUs per node
and nodes at the file's defaults (``--nodes`` or ``--set nodes=N`` scales the cluster
ones), the device the file names.

``moesim models CONFIG_JSON`` shows what a Hugging Face config.json maps to (the model a
scenario gets from ``model: {hf_config: PATH}``) and what it could not map.
"""

from __future__ import annotations

import argparse
import json

from moesim.cli.common import add_output_flags
from moesim.compute.devices import DEVICES
from moesim.errors import InputError
from moesim.model import PRESETS, count_params
from moesim.topology import presets
from moesim.topology.loader import read_yaml, resolve, topology_size
from moesim.units import GB, TB, GiB

CLI = "command line"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", metavar="CONFIG_JSON",
                   help="a Hugging Face config.json (or the checkpoint folder holding it): "
                        "show the model moesim reads from it instead of the lists")
    add_output_flags(p, json_help="print the lists as JSON on stdout (nothing else there)",
                     strict=False, quiet=False)


def model_row(name: str, spec) -> dict:
    c = count_params(spec)
    return {"name": name, "layers": spec.layers, "hidden": spec.hidden,
            "attention": spec.attention, "experts": spec.n_experts, "top_k": spec.top_k,
            "shared_experts": spec.n_shared_experts, "moe_layers": spec.n_moe_layers,
            "params_total": c.total, "params_active": c.active}


def device_row(d) -> dict:
    return {"name": d.name, "memory_bytes": d.hbm_bytes, "peak_bf16_flops": d.peak_bf16_flops,
            "peak_fp8_flops": d.peak_fp8_flops, "hbm_bytes_per_s": d.hbm_Bps}


def topology_row(name: str) -> dict:
    nodes, per_node, dev = topology_size(name)  # a preset's size without building it
    gpus = nodes * per_node
    desc = read_yaml(resolve(name)).get("description", "")
    return {"name": name, "gpus_per_node": per_node, "nodes": nodes, "gpus": gpus,
            "device": dev,
            "description": str(desc) or "(nodes and links listed in the file)"}


def listing() -> dict:
    return {"models": [model_row(n, s) for n, s in sorted(PRESETS.items())],
            "devices": [device_row(d) for d in DEVICES.values()],
            "topologies": [topology_row(n) for n in presets()]}


def _experts(m: dict) -> str:
    if not m["experts"]:
        return "dense"
    shared = f" +{m['shared_experts']} shared" if m["shared_experts"] else ""
    return f"{m['experts']} experts top-{m['top_k']}{shared}"


def model_line(m: dict, width: int = 16) -> str:
    return (f"  {m['name']:<{width}} {m['layers']:>4} layers  hidden {m['hidden']:>5}  "
            f"{m['attention'].upper():<3}  {_experts(m):<26} "
            f"{m['params_total'] / 1e9:>8.2f} B total {m['params_active'] / 1e9:>7.2f} B active")


def _tflops(flops: float) -> str:
    t = flops / 1e12
    return f"{t:>6.0f}" if t >= 10 else f"{t:>6.2f}"


def fmt(res: dict) -> str:
    lines = ["model presets (model: {preset: NAME}); params: weights, active per token "
             "incl. embedding and head"]
    lines += [model_line(m) for m in res["models"]]
    lines.append("devices (cluster.device); memory as the card reports it; dense peaks")
    for d in res["devices"]:
        fp8 = _tflops(d["peak_fp8_flops"]) if d["peak_fp8_flops"] else "     -"
        lines.append(f"  {d['name']:<16} {d['memory_bytes'] / GiB:>7.1f} GiB "
                     f"({d['memory_bytes'] / GB:>6.1f} GB)  bf16 "
                     f"{_tflops(d['peak_bf16_flops'])} TFLOP/s  fp8 {fp8} TFLOP/s  "
                     f"HBM {d['hbm_bytes_per_s'] / TB:>5.2f} TB/s")
    lines.append("topologies (cluster.topology); nodes at the file's default "
                 "(cluster.nodes or --nodes sets it)")
    for t in res["topologies"]:
        lines.append(f"  {t['name']:<16} {t['gpus_per_node']:>2} GPUs/node x "
                     f"{t['nodes']:>2} nodes  {t['device'] or '-':<5}  {t['description']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.config is None:
        res = listing()
        print(json.dumps(res, sort_keys=True) if args.json else fmt(res))
        return 0
    from moesim.model.hf import config_path, load
    from moesim.model.read import model_from_dict

    try:
        path = config_path(args.config, CLI)
    except InputError:
        raise InputError(CLI, "CONFIG_JSON", "an existing Hugging Face config.json (or the "
                         "checkpoint folder holding it)", args.config) from None
    spec = model_from_dict({"hf_config": str(path)}, CLI)
    hf = load(str(path), CLI)
    res = {"config": str(path), "architecture": hf.architecture,
           "model": {f: getattr(spec, f) for f in spec.__dataclass_fields__},
           "params_total": count_params(spec).total,
           "params_active": count_params(spec).active, "unmapped": list(hf.unmapped)}
    if args.json:
        print(json.dumps(res, sort_keys=True))
        return 0
    print(f"{path}: {hf.architecture}")
    print(model_line(model_row(spec.name, spec), width=len(spec.name)))
    print("  model: {" + ", ".join(f"{k}: {v}" for k, v in res["model"].items()) + "}")
    if hf.unmapped:
        print("  not mapped: " + "; ".join(hf.unmapped))
    return 0
