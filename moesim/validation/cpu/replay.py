"""Turn traced steps into simulator programs (pure: no simpy, no trace durations).

Only routing and shapes come from the trace: for each rank, the traced op sequence in
order. A matmul or memory-bound op becomes a compute :class:`~moesim.program.ops.Op`
whose duration is the calibration's time for a :class:`~moesim.compute.base.Kernel`
built from the op's FLOPs, bytes and m/n/k; each all-to-all (and the small count
exchange) becomes a collective Op carrying the trace's byte matrix, the same
:class:`~moesim.collectives.CollectiveSpec` on every member. The measured durations
(``TracedOp.dur_s``) are never read here.

A compute op also pays the calibration's host gap (framework dispatch between
consecutive ops: ``gap_s(op.backward)``, the forward or backward figure; 0 for
calibrations without it).

Op ``i`` of ``programs[rank]`` is ``TraceStep.ops[i]`` of that rank, and depends on op
``i - 1`` (the recorded layer runs one op at a time: all-to-alls are blocking calls).

The recording machine (:func:`moesim.topology.machine.machine_topology`) is modelled as N
ranks on one host, each linked to one switch
node; each link has the calibration's bandwidth and half its latency, so a
point-to-point transfer of B bytes takes ``latency_s + B / bandwidth_Bps`` — the
calibrated all-to-all cost, where B is the busiest rank's off-rank bytes.
"""

from __future__ import annotations

import numpy as np

from moesim.collectives.communicator import CollectiveSpec
from moesim.compute.base import Kernel
from moesim.compute.calibrated import CalibratedComputeModel
from moesim.errors import InputError
from moesim.program.ops import Op
from moesim.validation.cpu.ingest import TracedOp, TraceSet

COLL_KINDS = ("all_to_all", "count_exchange")
#: all-to-all role -> span kind (the count exchange is part of dispatching tokens)
ROLE_KIND = {"dispatch": "ep_dispatch", "dispatch_grad": "ep_dispatch",
             "count_exchange": "ep_dispatch", "combine": "ep_combine",
             "combine_grad": "ep_combine"}


def kernel_of(op: TracedOp) -> Kernel:
    """The kernel a traced compute op stands for: shapes, FLOPs and bytes only."""
    if op.kind == "gemm":
        name = "router_gemm" if op.role == "router" else (
            "expert_gemm" if op.role == "expert" else "gemm")
        return Kernel(name, op.flops, op.bytes, m=op.m, n=op.n, k=op.k)
    return Kernel(op.name, op.flops, op.bytes)


def exchange_matrices(ts: TraceSet, step: int) -> list[tuple[str, np.ndarray]]:
    """(role, [src, dst] bytes) of the k-th collective of ``step``, from every rank's
    send sizes; checks that what r receives from s is what s sends to r."""
    per_rank = [[o for o in ts.step(r, step).ops if o.kind in COLL_KINDS]
                for r in range(ts.world)]
    src = ts.ranks[0].source
    if len({len(p) for p in per_rank}) != 1:
        raise InputError(src, f"ProfilerStep#{step}", "the same number of all-to-alls on every "
                         "rank", [len(p) for p in per_rank])
    out = []
    for k in range(len(per_rank[0])):
        ops = [p[k] for p in per_rank]
        roles = {o.role for o in ops}
        if len(roles) != 1:
            raise InputError(src, f"ProfilerStep#{step}", f"all-to-all #{k} with the same role "
                             "on every rank", sorted(roles))
        rows = np.zeros((ts.world, ts.world))
        recv = np.zeros((ts.world, ts.world))
        for r, o in enumerate(ops):
            if len(o.send_rows) != ts.world or len(o.recv_rows) != ts.world:
                raise InputError(ts.ranks[r].source, f"ProfilerStep#{step}",
                                 f"split sizes for {ts.world} ranks in all-to-all #{k}",
                                 (o.send_rows, o.recv_rows))
            rows[r] = o.send_bytes
            recv[:, r] = o.recv_bytes
        if not np.allclose(rows, recv):
            raise InputError(src, f"ProfilerStep#{step}", f"all-to-all #{k} ({ops[0].role}): "
                             "rank r receiving from s what s sends to r",
                             {"sent": rows.tolist(), "received": recv.tolist()})
        out.append((ops[0].role, rows))
    return out


def _hot(ts: TraceSet, rank: int, step: int) -> tuple[int, int]:
    """(global expert id, tokens) of the rank's most loaded local expert; experts are
    placed contiguously (rank r holds r·E/N … (r+1)·E/N − 1)."""
    rows = ts.step(rank, step).tokens_per_local_expert
    if not rows:
        return -1, 0
    j = int(np.argmax(rows))
    return rank * len(rows) + j, int(rows[j])


def build_programs(ts: TraceSet, step: int, model: CalibratedComputeModel) -> list[list[Op]]:
    """Per-rank op programs for one traced step (``programs[r][i]`` ↔ ``ops[i]``)."""
    group = tuple(range(ts.world))
    mats = exchange_matrices(ts, step)
    programs = []
    for r in range(ts.world):
        s = ts.step(r, step)
        hot_e, hot_t = _hot(ts, r, step)
        backward = False
        k = 0
        prog: list[Op] = []
        for i, o in enumerate(s.ops):
            deps = (i - 1,) if i else ()
            if o.kind in COLL_KINDS:
                role, mat = mats[k]
                backward = backward or role.endswith("_grad")
                spec = CollectiveSpec("all_to_all_v", group, matrix=mat)
                prog.append(Op("comm", ROLE_KIND.get(role, "ep_dispatch"), role or o.name,
                               deps=deps, coll=spec, key=("a2a", step, k),
                               nbytes=float(sum(o.send_bytes)),
                               phase="bwd" if backward else "fwd",
                               tokens=int(sum(o.send_rows)) if o.kind == "all_to_all" else 0))
                k += 1
            else:
                kern = kernel_of(o)
                is_expert = o.kind == "gemm" and (o.role == "expert" or backward)
                prog.append(Op("compute", "compute", kern.name if o.kind == "gemm" else o.name,
                               deps=deps, duration_s=model.gap_s(o.backward) + model.time_s(kern),
                               phase="bwd" if backward else "fwd", flops=o.flops,
                               tokens=o.m, hot_expert=hot_e if is_expert else -1,
                               hot_tokens=hot_t if is_expert else 0))
        programs.append(prog)
    return programs


def outside_fitted_range(ts: TraceSet, model: CalibratedComputeModel) -> dict:
    """Compute ops whose time the calibration extrapolates (``model.in_range`` false)
    over every traced step of every rank: ``{"gemm": n, "memory": n, "compute_ops": n,
    "largest": description of the largest such op}``."""
    out = {"gemm": 0, "memory": 0, "compute_ops": 0}
    worst: tuple[float, str] = (0.0, "")
    for r in ts.ranks:
        for s in r.steps:
            for o in s.ops:
                if o.kind in COLL_KINDS:
                    continue
                out["compute_ops"] += 1
                if model.in_range(kernel_of(o)):
                    continue
                out[o.kind] += 1
                size = o.flops if o.kind == "gemm" else o.bytes
                if size > worst[0]:
                    worst = (size, f"{o.name} {o.m}x{o.k}x{o.n} ({o.flops / 1e9:.3g} GFLOP)"
                             if o.kind == "gemm" else f"{o.name} ({o.bytes / 1e6:.3g} MB)")
    return {**out, "largest": worst[1]}
