"""``moesim collective``: simulate one collective on a topology, nccl-tests style.

Example::

    moesim collective --topology dgx-h100 --nodes 2 --op all_reduce --bytes 1GiB
    moesim collective --topology dgx-h100 --nodes 4 --op all_to_all --matrix m.json --json
    moesim collective --topology dgx-h800 --nodes 8 --op ep_dispatch --kernel deepep --json
    moesim collective --topology dgx-h100 --op dist_topk --vocab 129280 --k 50 --batch 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from moesim.cli.common import CLI as _CLI
from moesim.cli.common import load_topology_args, print_result
from moesim.cli.ep_collective import EP_DEFAULTS, EP_OPS, add_ep_arguments, run_ep
from moesim.cli.head_collective import HEAD_DEFAULTS, HEAD_OPS, add_head_arguments, run_head
from moesim.cli.nccl_collective import nccl_line, nccl_result
from moesim.collectives.algorithms import ALGOS, OPS, check_op_algo
from moesim.collectives.nccl import ALGORITHMS as NCCL_ALGOS
from moesim.collectives.nccl import PROTOCOLS
from moesim.collectives.simulate import MODELS, simulate_collective
from moesim.errors import InputError
from moesim.units import TiB, parse_bytes

#: Largest --bytes: 1 TiB per rank, above the memory of any GPU in the device
#: catalog (the largest, H200, has 141 GB; moesim.compute.devices).
MAX_COLLECTIVE_BYTES = TiB
#: every --op the command takes: collectives, MoE exchanges, LM-head sampling
ALL_OPS = (*OPS, *EP_OPS, *HEAD_OPS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, metavar="FILE_OR_NAME",
                   help="topology YAML file or preset name (e.g. dgx-h100)")
    p.add_argument("--nodes", type=int, default=None, help="number of nodes (preset default if omitted)")
    p.add_argument("--op", required=True,
                   help=" | ".join(ALL_OPS) + f" ({' and '.join(EP_OPS)}: MoE exchange; "
                        f"{', '.join(HEAD_OPS)}: LM-head sampling; see below)")
    p.add_argument("--bytes", default=None, dest="size",
                   help="size in nccl-tests' sense, e.g. 1GiB, 64MB, 4096 (bytes): per-rank "
                        "buffer; total gathered size for all_gather/reduce_scatter")
    p.add_argument("--algo", default=None,
                   help="; ".join(f"{op}: {'|'.join(a)}" for op, a in ALGOS.items())
                        + " (first is the default); NCCL's " + "|".join(NCCL_ALGOS)
                        + " force NCCL's model to that algorithm")
    p.add_argument("--protocol", default=None,
                   help=" | ".join(PROTOCOLS) + ": force NCCL's model to that protocol "
                        "(default: the one NCCL's tuning model picks)")
    p.add_argument("--ranks", default=None, help="ranks taking part, e.g. 0-7 or 0,2,4 (default all)")
    p.add_argument("--root", type=int, default=None, help="broadcast root rank (default first)")
    p.add_argument("--matrix", default=None, metavar="JSON",
                   help="source x destination byte matrix (JSON list of rows, numbers in bytes "
                        "or sizes like '2MiB'); makes all_to_all an all_to_all_v")
    p.add_argument("--model", default=None,
                   help="network model: flow | analytical (default flow; not for the EP ops)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_ep_arguments(p)
    add_head_arguments(p)


def parse_ranks(text: str) -> list[int]:
    """``0-7``, ``0,2,4`` or a mix like ``0-3,8-11`` -> list of ranks."""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a:
                    raise ValueError(part)
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise InputError(_CLI, "--ranks", "ranks like 0-7 or 0,2,4", text) from None
    return out


def load_matrix(path: str) -> list[list[float]]:
    """Read a byte matrix from JSON: a list of rows, or ``{"matrix": rows}``."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except OSError as err:
        raise InputError(path, "", "a readable JSON file", err.strerror) from None
    except json.JSONDecodeError as err:
        raise InputError(path, "matrix", "valid JSON", f"{err.msg} at line {err.lineno}") from None
    if isinstance(data, dict):
        data = data.get("matrix")
    if not isinstance(data, list) or not all(isinstance(row, list) for row in data):
        raise InputError(path, "matrix", "a list of rows (lists of byte counts)", type(data).__name__)
    rows = []
    for i, row in enumerate(data):
        vals = []
        for j, v in enumerate(row):
            try:
                if isinstance(v, bool):
                    raise ValueError(v)
                vals.append(parse_bytes(v))
            except (TypeError, ValueError):
                raise InputError(path, f"matrix[{i}][{j}]", "a finite byte count >= 0", v) from None
            if vals[-1] > MAX_COLLECTIVE_BYTES:
                raise InputError(path, f"matrix[{i}][{j}]", "at most 1 TiB per pair", v)
        rows.append(vals)
    return rows


#: flags -> the ops they apply to (every other op refuses them: a flag that would be
#: ignored is an error, not a silent default)
FLAG_OPS: dict[str, tuple[str, ...]] = {
    **{f: OPS for f in ("size", "algo", "matrix", "protocol")},
    "root": ("broadcast",),
    "model": (*OPS, *HEAD_OPS),
    **{f: EP_OPS for f in EP_DEFAULTS},
    **{f: HEAD_OPS for f in HEAD_DEFAULTS},
}
_FLAG_NAMES = {"size": "--bytes", "top_k": "--top-k", "max_nodes": "--max-nodes",
               "zipf_s": "--zipf-s", "hot_experts": "--hot-experts",
               "hot_fraction": "--hot-fraction", "head_hidden": "--head-hidden"}


def check_flags_apply(args: argparse.Namespace) -> None:
    """Refuse, in one line, a flag given with an ``--op`` it does not apply to."""
    for dest, ops in FLAG_OPS.items():
        v = getattr(args, dest, None)
        if v is not None and args.op not in ops:
            flag = _FLAG_NAMES.get(dest, "--" + dest)
            raise InputError(_CLI, flag, f"no {flag} with --op {args.op} (it applies to "
                             f"--op {' | '.join(ops)})", v)


def run(args: argparse.Namespace) -> int:
    op = args.op
    if op not in ALL_OPS:
        raise InputError(_CLI, "--op", "one of " + ", ".join(ALL_OPS), op)
    check_flags_apply(args)
    if args.model is None:
        args.model = "flow"
    if op in EP_OPS:
        return run_ep(args, parse_ranks(args.ranks) if args.ranks else None)
    if op in HEAD_OPS:
        return run_head(args, parse_ranks(args.ranks) if args.ranks else None)
    if op == "all_to_all" and args.matrix is not None:
        op = "all_to_all_v"
    if args.protocol is not None and args.protocol not in PROTOCOLS:
        raise InputError(_CLI, "--protocol", "one of " + ", ".join(PROTOCOLS), args.protocol)
    # an NCCL algorithm the flow network does not run forces NCCL's model only
    nccl_only = args.algo in NCCL_ALGOS and args.algo not in ALGOS.get(op, ())
    algo = check_op_algo(op, None if nccl_only else args.algo)
    if args.model not in MODELS:
        raise InputError(_CLI, "--model", "one of " + ", ".join(MODELS), args.model)
    matrix = None
    nbytes = 0.0
    if args.size is not None:
        try:
            nbytes = parse_bytes(args.size)
        except ValueError as err:
            raise InputError(_CLI, "--bytes", str(err), args.size) from None
        if nbytes > MAX_COLLECTIVE_BYTES:
            raise InputError(_CLI, "--bytes", f"at most {MAX_COLLECTIVE_BYTES / TiB:.0f} TiB per "
                             "rank (no GPU holds more; larger sizes only lose float precision)",
                             args.size)
    elif op != "all_to_all_v":
        raise InputError(_CLI, "--bytes", f"a size for {op} (e.g. 1GiB)", None)
    if args.nodes is not None and args.nodes < 1:
        raise InputError(_CLI, "--nodes", "a number of nodes >= 1", args.nodes)
    ranks = parse_ranks(args.ranks) if args.ranks else None
    if op == "all_to_all_v":
        if args.matrix is None:
            raise InputError(_CLI, "--matrix", "a JSON byte matrix for all_to_all_v", None)
        matrix = load_matrix(args.matrix)

    params = {} if args.nodes is None else {"nodes": args.nodes}
    topo = load_topology_args(args.topology, params, {"nodes": "--nodes"})
    n = len(topo.gpus)
    if ranks is not None:
        bad = [r for r in ranks if not 0 <= r < n]
        if bad:
            raise InputError(_CLI, "--ranks", f"ranks in 0..{n - 1} ({n} GPUs)", bad[0])
    if args.root is not None and args.root not in (range(n) if ranks is None else ranks):
        members = f"0..{n - 1}" if ranks is None else args.ranks
        raise InputError(_CLI, "--root", f"a rank taking part ({members})", args.root)
    if matrix is not None:
        size = n if ranks is None else len(ranks)
        if len(matrix) != size or any(len(row) != size for row in matrix):
            raise InputError(args.matrix, "matrix", f"{size}x{size} (one row and column per rank)",
                             f"{len(matrix)} rows of lengths {sorted({len(r) for r in matrix})}")
    res = simulate_collective(topo, op, nbytes, algo=algo, ranks=ranks, model=args.model,
                              matrix=matrix, root=args.root)
    res.pop("wall_s")  # keep the output a function of the inputs only
    res["topology"] = args.topology
    res["nodes"] = getattr(topo, "n_nodes", None)
    nccl_algo = args.algo if args.algo in NCCL_ALGOS else None
    res["nccl"] = nccl_result(topo, op, nbytes, res["ranks"], nccl_algo, args.protocol,
                              strict=nccl_only)
    return print_result(res, args.json, format_result)


def format_result(res: dict) -> str:
    nodes = f"{res['nodes']} node" + ("" if res["nodes"] == 1 else "s")
    return (f"{res['op']} {res['algo']} on {res['n']} ranks ({res['topology']}, "
            f"{nodes}), {res['bytes'] / 2**20:.2f} MiB: "
            f"{res['time_s'] * 1e3:.4f} ms, algbw {res['algbw_GBps']:.2f} GB/s, "
            f"busbw {res['busbw_GBps']:.2f} GB/s ({res['model']} model, {res['flows']} flows)"
            + nccl_line(res))
