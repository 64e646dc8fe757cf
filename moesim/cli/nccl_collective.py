"""``moesim collective``'s NCCL column: what NCCL's own tuning model
(:mod:`moesim.collectives.nccl`) picks and estimates for the collective that the flow
network just simulated, shown beside the flow time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from moesim.cli.common import CLI
from moesim.collectives.nccl import NCCL_OPS, estimate, facts_from_params
from moesim.errors import InputError

_FLAGS = {"algo": "--algo", "protocol": "--protocol", "bytes": "--bytes"}


def nccl_result(topo: Any, op: str, nbytes: float, ranks: Sequence[int],
                algo: str | None, protocol: str | None, strict: bool = True) -> dict | None:
    """NCCL's choice and estimate as a JSON-able dict, or None where NCCL's model does
    not apply (all_to_all_v, a topology without the facts the model reads). A forced
    ``algo``/``protocol`` that cannot apply is an error naming the flag, except an
    ``algo`` given for the flow network (``strict`` False, e.g. ``--algo tree`` for a
    broadcast, which NCCL runs only as a ring): NCCL's model then chooses freely."""
    forced = (algo is not None and strict) or protocol is not None
    reason = None
    if op not in NCCL_OPS:
        reason = f"no NCCL model for {op}"
    hosts = Counter(topo.host_of(topo.gpus[r]) for r in ranks)
    nodes = len(hosts)
    per_node = len(ranks) // nodes
    if reason is None and len(set(hosts.values())) != 1:
        reason = "ranks spread unevenly over nodes"
    facts = None
    if reason is None:
        try:
            facts = facts_from_params(dict(getattr(topo, "params", {}) or {}),
                                      getattr(topo, "device", None), nodes, per_node)
        except (InputError, KeyError, TypeError, ValueError) as err:
            reason = f"topology lacks what NCCL's model reads ({err})"
    if facts is None:
        if forced:
            flag = "--protocol" if protocol is not None else "--algo"
            raise InputError(CLI, flag, f"a collective NCCL's model prices ({reason})",
                             protocol if protocol is not None else algo)
        return None
    if algo is not None and not strict:
        try:
            estimate(op, nbytes, per_node, nodes, facts, algo=algo)
        except InputError:
            algo = None
    try:
        t, a, p, bd = estimate(op, nbytes, per_node, nodes, facts, algo=algo, protocol=protocol)
    except InputError as err:
        raise InputError(CLI, _FLAGS.get(err.field, err.field), *err.args[2:]) from None
    return {"algo": a, "protocol": p, "time_s": t, "latency_s": bd["latency_us"] * 1e-6,
            "bandwidth_GBps": bd["bandwidth_GBps"], "nccl_model": bd["nccl_model"],
            "nodes": nodes, "ranks_per_node": per_node,
            "channels": facts.graphs["ring"].n_channels if a == "p2p" else
            facts.graphs[a].n_channels,
            "forced": {"algo": algo, "protocol": protocol},
            "candidates_s": {k: v * 1e-6 for k, v in bd["candidates"].items()}}


def nccl_line(res: dict) -> str:
    """The text output's NCCL line ('' when NCCL's model does not apply)."""
    n = res.get("nccl")
    if not n:
        return ""
    how = "forced" if any(n["forced"].values()) else "NCCL's choice"
    kind = "NCCL tuning model" if n["nccl_model"] else "NCCL constants, moesim's p2p pricing"
    return (f"\nNCCL: {n['algo']}/{n['protocol']} ({how}): {n['time_s'] * 1e6:.2f} us "
            f"= latency {n['latency_s'] * 1e6:.2f} us + bytes at {n['bandwidth_GBps']:.2f} "
            f"GB/s ({kind}); flow network {res['time_s'] * 1e6:.2f} us")
