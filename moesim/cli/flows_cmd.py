"""``moesim flows``: run point-to-point flows through a network model.

    moesim flows --topology dgx-h100 --nodes 2 --flows flows.json [--model flow|analytical] [--json]

``flows.json`` is a JSON list of flows between GPU names::

    [{"id": "a", "src": "n0.gpu0", "dst": "n1.gpu0", "bytes": 1e8, "start_s": 0.0}, ...]

``id`` (string or integer, unique), ``src``, ``dst`` and ``bytes`` (a number, or a
size such as "64MB" or "1GiB") are required; ``start_s`` (seconds, default 0) and
``key`` (integer ECMP path choice, default 0) are optional. Prints each flow's
delivery time and the links it crossed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import simpy

from moesim.errors import InputError
from moesim.network import AnalyticalNetwork, FlowNetwork
from moesim.units import parse_bytes, s_to_us

REQUIRED = ("id", "src", "dst", "bytes")
OPTIONAL = ("start_s", "key")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topology", required=True, metavar="FILE_OR_NAME",
                        help="a topology YAML path or a preset name (see moesim topology)")
    parser.add_argument("--nodes", type=int, help="number of servers (hosts for fat-tree)")
    parser.add_argument("--flows", required=True, metavar="FLOWS.json",
                        help='JSON list of {"id", "src", "dst", "bytes", "start_s"}')
    parser.add_argument("--model", choices=("flow", "analytical"), default="flow",
                        help="flow: max-min fair sharing (default); analytical: no contention")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def read_flows(path: str, gpus: list[str], topo_name: str) -> list[dict[str, Any]]:
    """Validated flows from ``path``; raises InputError naming the file and field."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "", "a readable UTF-8 JSON file", str(err)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(path, f"line {err.lineno} column {err.colno}", "valid JSON",
                         err.msg) from None
    if not isinstance(data, list):
        raise InputError(path, "", 'a JSON list of {"id", "src", "dst", "bytes", "start_s"}',
                         type(data).__name__)
    known = set(gpus)
    example = ", ".join(gpus[:2]) + (", ..." if len(gpus) > 2 else "")
    seen: set[Any] = set()
    flows = []
    for i, item in enumerate(data):
        where = f"flows[{i}]"
        if not isinstance(item, dict):
            raise InputError(path, where, "an object with id, src, dst, bytes",
                             type(item).__name__)
        for k in REQUIRED:
            if k not in item:
                raise InputError(path, f"{where}.{k}", f"a value (required: {', '.join(REQUIRED)})",
                                 "missing")
        for k in item:
            if k not in REQUIRED + OPTIONAL:
                raise InputError(path, f"{where}.{k}",
                                 f"only the keys {', '.join(REQUIRED + OPTIONAL)}", k)
        fid = item["id"]
        if isinstance(fid, bool) or not isinstance(fid, str | int):
            raise InputError(path, f"{where}.id", "a string or an integer", fid)
        if fid in seen:
            raise InputError(path, f"{where}.id", "an id not used by an earlier flow", fid)
        seen.add(fid)
        for k in ("src", "dst"):
            if item[k] not in known:
                raise InputError(path, f"{where}.{k}",
                                 f"a GPU name of topology {topo_name} ({example})", item[k])
        raw = item["bytes"]
        try:
            if isinstance(raw, bool):
                raise ValueError("a boolean is not a size")
            nbytes = parse_bytes(raw)
        except (ValueError, TypeError):
            raise InputError(path, f"{where}.bytes",
                             "a size >= 0 (number of bytes, or like 64MB, 1GiB)", raw) from None
        if not math.isfinite(nbytes):
            raise InputError(path, f"{where}.bytes", "a finite size", raw)
        start = item.get("start_s", 0.0)
        if isinstance(start, bool) or not isinstance(start, int | float) \
                or not math.isfinite(start) or start < 0:
            raise InputError(path, f"{where}.start_s", "a number of seconds >= 0", start)
        key = item.get("key", 0)
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise InputError(path, f"{where}.key", "an integer >= 0", key)
        flows.append({"id": fid, "src": item["src"], "dst": item["dst"], "bytes": nbytes,
                      "start_s": float(start), "key": key})
    return flows


def simulate(topo: Any, flows: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """Run the flows; returns one record per flow, in input order."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo) if model == "flow" else AnalyticalNetwork(env, topo)
    finish: dict[int, float] = {}

    def launch(i: int, f: dict[str, Any]) -> None:
        ev = net.transfer(f["src"], f["dst"], f["bytes"], key=f["key"], tag=i)
        ev.callbacks.append(lambda e: finish.__setitem__(e.value, float(env.now)))

    for i, f in enumerate(flows):
        env.timeout(f["start_s"]).callbacks.append(lambda _e, i=i, f=f: launch(i, f))
    env.run()
    out = []
    for i, f in enumerate(flows):
        path = [list(topo.links[lid]) for lid in topo.route(f["src"], f["dst"], f["key"])]
        out.append({"id": f["id"], "src": f["src"], "dst": f["dst"], "start_s": f["start_s"],
                    "finish_s": finish[i], "bytes": f["bytes"], "path": path})
    return out


def render(records: list[dict[str, Any]], topo_name: str, model: str) -> str:
    """A table: times in µs, sizes in bytes, mean rate in GB/s (10^9 B/s)."""
    lines = [f"{len(records)} flow(s) on {topo_name}, model {model}",
             f"{'id':<10}{'src':<12}{'dst':<12}{'bytes':>14}{'start µs':>12}{'finish µs':>12}"
             f"{'GB/s':>9}  path"]
    for r in records:
        dur = r["finish_s"] - r["start_s"]
        rate = f"{r['bytes'] / dur / 1e9:9.2f}" if dur > 0 else f"{'-':>9}"
        hops = [r["src"]] + [v for _u, v in r["path"]]
        lines.append(f"{str(r['id']):<10}{r['src']:<12}{r['dst']:<12}{r['bytes']:>14.0f}"
                     f"{s_to_us(r['start_s']):>12.3f}{s_to_us(r['finish_s']):>12.3f}{rate}  "
                     + " > ".join(hops))
    lines.append("finish = last byte delivered (bandwidth share + path latency); "
                 "GB/s = bytes / (finish - start)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from moesim.cli.common import load_topology_args

    params = {} if args.nodes is None else {"nodes": args.nodes}
    topo = load_topology_args(args.topology, params, {"nodes": "--nodes"})
    flows = read_flows(args.flows, list(topo.gpus), topo.name)
    records = simulate(topo, flows, args.model)
    if args.json:
        print(json.dumps({"topology": topo.name, "model": args.model, "flows": records},
                         indent=1))
    else:
        print(render(records, topo.name, args.model))
    return 0
