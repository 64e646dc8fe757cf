"""``moesim topology FILE_OR_NAME``: describe a topology, print it as JSON, or draw it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from moesim.cli.common import CLI, load_topology_args
from moesim.errors import InputError
from moesim.outputs import check_file_target, save_figure
from moesim.topology import presets
from moesim.topology.graph import Topology
from moesim.topology.summary import (
    bisection_Bps,
    gpu_egress_Bps,
    host_uplink_Bps,
    link_classes,
    node_counts,
)
from moesim.units import Bps_to_gbps, s_to_us
from moesim.yamlio import check_finite, load_text

DRAW_SUFFIXES = (".png", ".pdf", ".svg")
BISECTION_MAX_LINKS = 20000  # max flow beyond this is slow for a summary line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topology", metavar="FILE_OR_NAME",
                        help=f"a topology YAML path or a preset name ({', '.join(presets())})")
    parser.add_argument("--nodes", type=int, help="number of servers (same as --set nodes=N)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a preset parameter (e.g. nvlink_GBps=400) or routing "
                             "(routing=ecmp); repeatable")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    parser.add_argument("--draw", metavar="OUT.png", help="save a picture (png, pdf or svg)")
    parser.add_argument("--force", action="store_true", help="let --draw overwrite an existing file")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values read as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise InputError(CLI, f"--set {item}", "KEY=VALUE", item)
        try:
            out[key.strip()] = load_text(text)
        except yaml.YAMLError:
            out[key.strip()] = text
        check_finite(out[key.strip()], CLI, f"--set {key.strip()}")
    return out


def _check_out(path: Path, force: bool) -> None:
    if path.suffix.lower() not in DRAW_SUFFIXES:
        raise InputError(str(path), "--draw", f"a file name ending in {', '.join(DRAW_SUFFIXES)}",
                         path.suffix)
    check_file_target(path, force, "--draw")


def render(topo: Topology) -> str:
    """The human-readable description (GB/s per direction, µs)."""
    lines = [f"{topo.name}: {topo.n_gpus} GPUs = {topo.n_nodes} node(s) x "
             f"{topo.gpus_per_node} GPUs, routing {topo.routing}"]
    if topo.source:
        lines.append(f"source: {topo.source}")
    lines.append("nodes: " + ", ".join(f"{n} {k}" for k, n in node_counts(topo).items()))
    lines.append(f"links: {len(topo.links)} directed; bandwidth per direction")
    lines.append(f"  {'kind':<9}{'between':<18}{'count':>6}{'line GB/s':>11}{'eff':>7}"
                 f"{'GB/s':>9}{'lat µs':>8}")
    for c in link_classes(topo):
        lines.append(f"  {c.kind:<9}{c.between:<18}{c.count:>6}{Bps_to_gbps(c.line_rate_Bps):>11.1f}"
                     f"{c.efficiency:>7.3f}{Bps_to_gbps(c.bandwidth_Bps):>9.1f}"
                     f"{s_to_us(c.latency_s):>8.3f}")
    egress = gpu_egress_Bps(topo, topo.gpus[0])
    lines.append(f"per GPU ({topo.gpus[0]}) out: " + ", ".join(
        f"{k} {Bps_to_gbps(v):.1f} GB/s" for k, v in egress.items()))
    n_up, up = host_uplink_Bps(topo, topo.host_of(topo.gpus[0]))
    if n_up:
        lines.append(f"per node to the fabric: {n_up} links, {Bps_to_gbps(up):.1f} GB/s")
    if topo.n_gpus > 1 and len(topo.links) <= BISECTION_MAX_LINKS:
        half = topo.n_gpus // 2
        lines.append(f"bisection (max flow, GPUs {topo.gpus[0]}..{topo.gpus[half - 1]} -> "
                     f"{topo.gpus[half]}..{topo.gpus[-1]}): "
                     f"{Bps_to_gbps(bisection_Bps(topo)):.1f} GB/s per direction")
    sample = [(topo.gpus[0], topo.gpus[-1])]
    if topo.gpus_per_node > 1:
        sample.insert(0, (topo.gpus[0], topo.gpus[1]))
    for src, dst in sample:
        path = topo.route(src, dst)
        lat = sum(topo.latency_s[i] for i in path)
        bw = min((topo.capacity_Bps[i] for i in path), default=0.0)
        lines.append(f"route {src} -> {dst}: {' -> '.join(topo.path_nodes(src, dst))} "
                     f"({len(path)} links, {s_to_us(lat):.2f} µs, bottleneck "
                     f"{Bps_to_gbps(bw):.1f} GB/s)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    params = parse_sets(args.set)
    if args.nodes is not None:
        params["nodes"] = args.nodes
    routing = params.pop("routing", None)
    out = Path(args.draw) if args.draw else None
    if out is not None:
        _check_out(out, args.force)
    flags = {"nodes": "--nodes" if args.nodes is not None else "--set nodes"}
    topo = load_topology_args(args.topology, params, flags, routing)
    try:
        print(json.dumps(topo.describe(), indent=1) if args.json else render(topo), flush=True)
    except BrokenPipeError:  # e.g. piped into head: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if out is not None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        from moesim.topology.draw import draw_topology, layout

        pos, _ = layout(topo)
        span = max((x for x, _ in pos.values()), default=1.0)
        fig = Figure(figsize=(min(max(8.0, 0.42 * span + 3.0), 60.0), 5.5))
        FigureCanvasAgg(fig)
        draw_topology(topo, fig.add_subplot(1, 1, 1))
        fig.tight_layout()
        save_figure(fig, out, force=args.force, dpi=150)
        if not args.json:
            print(f"wrote {out}")
    return 0
