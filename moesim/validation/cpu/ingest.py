"""Turn torch.profiler traces of an expert-parallel MoE layer into plain data.

What is assumed (what any such code must contain; our ``moe/*`` labels are used
when present, never required):

- all-to-alls of ``torch.distributed``. Forms supported: the issuing op
  ``c10d::alltoall_base_`` (``Concrete Inputs`` [3]/[4] = output/input split
  sizes, ``"[]"`` = equal splits; ``Input Dims`` [0]/[1] = output/input shapes; a
  tensor of more than two dims, such as ``[world, C, H]`` buckets, counts rows of
  width ``dims[-1]``), the list form ``c10d::alltoall_`` (``Input Dims`` [0]/[1] =
  lists of output/input tensor shapes; split sizes = their rows; dtype from the
  worker span, else float32), ``record_param_comms`` with ``Collective name``
  all_to_all* and ``In split size``/``Out split size``, and the backend's worker span
  (``gloo:all_to_all`` / ``nccl:all_to_all``, matched in issue order), whose end is
  when the data has arrived. A collective whose input is floating point with at least
  two dims carries tokens; others (the int64 split-size exchange) are
  ``count_exchange`` (see :mod:`moesim.validation.cpu.collectives`).
- matmuls (``aten::mm/addmm/bmm/baddbmm/matmul/linear``; the innermost one counts)
  whose ``Input Dims`` give batch, m, k, n;
- ``ProfilerStep#N`` spans; without them the training steps are found from the
  forward/backward order of the token all-to-alls and numbered 0, 1, ... (synthetic
  ``ProfilerStep#k`` spans added by :func:`moesim.validation.cpu.steps.step_events`);
  a trace with one step (or no backward) is one step, N = 0.

Memory-bound samples are the innermost ``aten::`` ops other than matmuls,
views/allocations (``NO_BYTES``) and random number generation (``NOT_MEMORY``):
ops none of whose descendants is anything but a view or allocation. So
``aten::index_select`` or ``aten::cat``, which call ``aten::empty``/``select`` inside,
count (their cost grows with the tokens a rank holds), and ``aten::argsort`` (which
calls ``aten::sort``) does not, its child does.

Phases per rank and step (seconds): the backward starts at the first autograd op
(``autograd::engine::*`` or ``*Backward*``) or the ``moe/backward`` label. Token
all-to-alls before it alternate dispatch, combine; after it combine_grad,
dispatch_grad. ``dispatch_s``/``combine_s`` are the forward collectives' spans on
the rank (issue → data arrived, so they include waiting for peers); ``experts_s``
is ``moe/experts`` or, unlabelled, combine start − dispatch end; ``forward_s`` is
``moe/forward`` or first matmul → backward start; ``backward_s`` is
``moe/backward`` or backward start → end of the last autograd op.

``tokens_per_local_expert`` are the m of the forward down-projections (n = hidden,
k ≠ hidden, between dispatch and combine); a batched one (``bmm``/``baddbmm`` over
capacity-padded buckets) gives its m once per batch entry: the padded rows each expert
computed, not the tokens routed to it (those are not in the trace).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from moesim.errors import InputError
from moesim.validation.cpu.collectives import Coll, find_collectives
from moesim.validation.cpu.steps import step_events
from moesim.validation.kineto.events import (
    DTYPE_BYTES,
    MATMUL_OPS,
    Event,
    ancestors,
    is_backward_name,
    load_trace,
    rank_of,
    world_of,
)
from moesim.validation.kineto.op_cost import gemm_dims, tensor_bytes

MATMULS = MATMUL_OPS
# ops that only make views or allocate: no bytes moved, not calibration samples
NO_BYTES = {"aten::as_strided", "aten::view", "aten::t", "aten::transpose", "aten::reshape",
            "aten::detach", "detach", "aten::expand", "aten::slice", "aten::select",
            "aten::narrow", "aten::unsqueeze", "aten::squeeze", "aten::resolve_conj",
            "aten::resolve_neg", "aten::empty", "aten::empty_strided", "aten::empty_like",
            "aten::new_empty", "aten::flatten", "aten::alias", "aten::permute", "aten::split",
            "aten::result_type", "aten::item", "aten::_local_scalar_dense", "aten::lift_fresh",
            "aten::resize_", "aten::split_with_sizes", "aten::unbind", "aten::_unsafe_view",
            "aten::to", "aten::contiguous", "aten::type_as", "aten::expand_as", "aten::view_as"}
# leaf ops that are not bandwidth-bound (random number generation: the input batch)
NOT_MEMORY = {"aten::normal_", "aten::uniform_", "aten::bernoulli_", "aten::random_",
              "aten::randn", "aten::rand", "aten::randint", "aten::randperm"}


@dataclass(frozen=True)
class TracedOp:
    """One op on one rank in one step. ``kind``: ``gemm``, ``memory`` (other compute),
    ``all_to_all`` (carries tokens) or ``count_exchange``. Times in seconds from the
    step start; ``work_dur_s`` is the backend worker's span (a collective only)."""

    kind: str
    name: str
    start_s: float
    dur_s: float
    role: str = ""                  # dispatch/combine/combine_grad/dispatch_grad, router/expert
    flops: float = 0.0              # FLOP (gemm)
    bytes: float = 0.0              # bytes read + written (memory ops, estimated)
    m: int = 0
    n: int = 0
    k: int = 0
    send_rows: tuple[int, ...] = ()  # rows (tokens) to each destination rank
    recv_rows: tuple[int, ...] = ()  # rows from each source rank
    row_bytes: int = 0               # bytes per row (hidden × dtype size)
    work_dur_s: float = 0.0
    backward: bool = False           # starts at or after the step's backward start

    @property
    def send_bytes(self) -> tuple[float, ...]:
        return tuple(float(r * self.row_bytes) for r in self.send_rows)

    @property
    def recv_bytes(self) -> tuple[float, ...]:
        return tuple(float(r * self.row_bytes) for r in self.recv_rows)


@dataclass(frozen=True)
class TraceStep:
    rank: int
    step: int                        # N of ProfilerStep#N (0 when there were none)
    dur_s: float
    ops: tuple[TracedOp, ...]
    phases: dict[str, float] = field(default_factory=dict)
    tokens_per_local_expert: tuple[int, ...] = ()   # rows of each forward down-projection

    def collectives(self, kind: str = "all_to_all") -> list[TracedOp]:
        return [o for o in self.ops if o.kind == kind]

    def role(self, role: str) -> TracedOp | None:
        return next((o for o in self.ops if o.role == role), None)


@dataclass(frozen=True)
class RankTrace:
    rank: int
    source: str
    world: int
    steps: tuple[TraceStep, ...]


@dataclass(frozen=True)
class TraceSet:
    """All ranks of one recording. ``hidden`` is the token width seen in the dispatch."""

    ranks: tuple[RankTrace, ...]
    hidden: int
    n_experts: int                    # from the router matmul's n (0 if not found)

    @property
    def world(self) -> int:
        return len(self.ranks)

    def step_ids(self) -> list[int]:
        ids = [s.step for s in self.ranks[0].steps]
        return [i for i in ids if all(any(s.step == i for s in r.steps) for r in self.ranks)]

    def step(self, rank: int, step: int) -> TraceStep:
        return next(s for s in self.ranks[rank].steps if s.step == step)

    def token_matrix(self, step: int, role: str = "dispatch") -> np.ndarray:
        """[src, dst] rows sent by the collective ``role`` in ``step``."""
        mat = np.zeros((self.world, self.world), dtype=np.int64)
        for r in range(self.world):
            op = self.step(r, step).role(role)
            if op is not None:
                mat[r, : len(op.send_rows)] = op.send_rows
        return mat

    def byte_matrix(self, step: int, role: str = "dispatch") -> np.ndarray:
        mat = np.zeros((self.world, self.world))
        for r in range(self.world):
            op = self.step(r, step).role(role)
            if op is not None:
                mat[r, : len(op.send_rows)] = op.send_bytes
        return mat


def _is_backward(ev: Event) -> bool:
    return is_backward_name(ev.name)


def _steps(events: list[Event]) -> list[tuple[int, float, float]]:
    marks = [(int(m.group(1)), ev.start_s, ev.end_s) for ev in events
             if (m := re.fullmatch(r"ProfilerStep#(\d+)", ev.name))]
    if marks:
        return sorted(marks)
    return [(0, min(e.start_s for e in events), max(e.end_s for e in events))]


def _label(events: list[Event], name: str) -> list[Event]:
    return [e for e in events if e.name == name]


def ingest_file(path: Path, world: int | None = None) -> tuple[RankTrace, int, int]:
    """One rank's trace → (RankTrace, hidden, n_experts)."""
    src = str(path)
    doc = load_trace(path)
    events = step_events(doc, src)
    world = world_of(doc) or world
    colls = find_collectives(events, world, src)
    if not any(c.tokens for c in colls):
        raise InputError(src, "traceEvents", "torch.distributed all-to-all ops carrying tokens "
                         "(c10d::alltoall_base_, c10d::alltoall_ or record_param_comms, "
                         "recorded with record_shapes=True; all-to-alls built from scatter "
                         "or send/recv are not read), or GPU kernel events (a GPU trace)",
                         "none found")
    world = world or len(colls[0].send)
    rank = rank_of(doc, path)
    anc = ancestors(events)
    issue_ids = {c.issue.idx for c in colls}
    matmul_parent = {p for e in events if e.name in MATMULS for p in anc[e.idx]}
    # ancestors of anything but a view/allocation: not innermost, not a sample
    has_child = {p for e in events if e.name not in NO_BYTES for p in anc[e.idx]}
    hidden = next(c.width for c in colls if c.tokens)
    # a TensorList (torch.cat of activations) has no dtype in the trace: the tokens'
    elem = next((c.row_bytes // c.width for c in colls if c.tokens and c.width), 4) or 4
    n_experts = 0
    steps = []
    for sid, t0, t1 in _steps(events):
        inside = [e for e in events if e.start_s >= t0 - 1e-9 and e.start_s < t1]
        s_colls = [c for c in colls if t0 - 1e-9 <= c.issue.start_s < t1]
        bwd_label = _label(inside, "moe/backward")
        bwd_ops = [e for e in inside if _is_backward(e)]
        bwd_start = bwd_label[0].start_s if bwd_label else (
            min(e.start_s for e in bwd_ops) if bwd_ops else t1)
        ops: list[TracedOp] = []
        roles = {}
        fwd_i = bwd_i = 0
        for c in s_colls:
            if not c.tokens:
                role = "count_exchange"
            elif c.issue.start_s < bwd_start:
                role = ("dispatch", "combine")[fwd_i % 2]
                fwd_i += 1
            else:
                role = ("combine_grad", "dispatch_grad")[bwd_i % 2]
                bwd_i += 1
            roles.setdefault(role, c)
            ops.append(TracedOp("all_to_all" if c.tokens else "count_exchange", c.issue.name,
                                c.issue.start_s - t0, c.end_s - c.issue.start_s, role,
                                send_rows=tuple(c.send), recv_rows=tuple(c.recv),
                                row_bytes=c.row_bytes, work_dur_s=c.work_dur_s))
        disp, comb = roles.get("dispatch"), roles.get("combine")
        first_mm = None
        down_rows = []
        for e in inside:
            if e.idx in issue_ids or any(p in issue_ids for p in anc[e.idx]):
                continue
            if e.name in MATMULS and e.idx not in matmul_parent:
                dims = gemm_dims(e)
                if dims is None:
                    continue
                b, m, k, n = dims
                first_mm = e if first_mm is None else first_mm
                role = ""
                if disp and e.end_s <= disp.issue.start_s and k == hidden:
                    role = "router?"        # the last such matmul is the router
                elif disp and comb and disp.end_s <= e.start_s and e.end_s <= comb.issue.start_s:
                    role = "expert"
                    if n == hidden and k != hidden:
                        # a batched matmul runs b experts' (padded) buckets of m rows
                        down_rows += [m] * b
                # operand traffic: A (m×k), B (k×n) read, C (m×n) written, once each
                elem = next((DTYPE_BYTES[t] for t in e.types if t in DTYPE_BYTES), 4)
                ops.append(TracedOp("gemm", e.name, e.start_s - t0, e.dur_s, role,
                                    flops=2.0 * b * m * k * n, m=m, n=n, k=k,
                                    bytes=float(b * (m * k + k * n + m * n) * elem)))
            elif (e.idx not in has_child and e.name.startswith("aten::")
                  and e.name not in NO_BYTES and e.name not in NOT_MEMORY
                  and e.name not in MATMULS):
                nbytes = tensor_bytes(e, elem)
                if nbytes > 0:
                    ops.append(TracedOp("memory", e.name, e.start_s - t0, e.dur_s,
                                        bytes=nbytes))
        ops.sort(key=lambda o: o.start_s)
        ops = [replace(o, backward=True) if o.start_s >= bwd_start - t0 - 1e-12 else o
               for o in ops]
        cand = [i for i, o in enumerate(ops) if o.role == "router?"]
        for i in cand:
            ops[i] = replace(ops[i], role="router" if i == cand[-1] else "")
        if cand:
            n_experts = ops[cand[-1]].n
        phases = _phases(inside, roles, first_mm, bwd_start, bwd_ops)
        steps.append(TraceStep(rank if rank is not None else -1, sid, t1 - t0, tuple(ops),
                               phases, tuple(down_rows)))
    return RankTrace(rank if rank is not None else -1, src, world, tuple(steps)), hidden, n_experts


def _phases(inside: list[Event], roles: dict[str, Coll], first_mm: Event | None,
            bwd_start: float, bwd_ops: list[Event]) -> dict[str, float]:
    ph: dict[str, float] = {}
    fwd = _label(inside, "moe/forward")
    bwd = _label(inside, "moe/backward")
    if fwd:
        ph["forward_s"] = fwd[0].dur_s
    elif first_mm is not None:
        ph["forward_s"] = bwd_start - first_mm.start_s
    if bwd:
        ph["backward_s"] = bwd[0].dur_s
    elif bwd_ops:
        ends = [e.end_s for e in bwd_ops] + [c.end_s for r, c in roles.items()
                                              if r.endswith("_grad")]
        ph["backward_s"] = max(ends) - bwd_start
    for role, c in roles.items():
        if role != "count_exchange":
            ph[f"{role}_s"] = c.end_s - c.issue.start_s
    exp = _label(inside, "moe/experts")
    if exp:
        ph["experts_s"] = sum(e.dur_s for e in exp)
    elif "dispatch" in roles and "combine" in roles:
        ph["experts_s"] = roles["combine"].issue.start_s - roles["dispatch"].end_s
    return ph


def _is_trace_name(name: str) -> bool:
    return name.endswith((".json", ".json.gz")) and not name.startswith(".")


def trace_files(paths: list[str]) -> list[Path]:
    """Expand directories to their rank traces: ``rank*.json[.gz]`` (moesim record) or
    ``*.pt.trace.json[.gz]`` (torch's tensorboard handler); failing both, every
    ``*.json[.gz]`` except ``routing.json``."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            names = sorted(f for f in p.iterdir() if _is_trace_name(f.name))
            found = [f for f in names if f.name.startswith("rank") or ".pt.trace." in f.name]
            found = found or [f for f in names if f.name != "routing.json"]
            if not found:
                raise InputError(str(p), "", "a directory with torch.profiler traces "
                                 "(rank*.json[.gz] or *.pt.trace.json[.gz])", "none")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise InputError(str(p), "", "an existing trace file or directory", "missing")
    return files


def ingest(paths: list[str]) -> TraceSet:
    """Read the traces of all ranks (files or directories) into a :class:`TraceSet`."""
    files = trace_files(paths)
    ranks, hidden, n_exp = [], 0, 0
    for i, f in enumerate(files):
        rt, h, e = ingest_file(f, world=None)
        if rt.rank < 0:
            rt = RankTrace(i, rt.source, rt.world, tuple(
                TraceStep(i, s.step, s.dur_s, s.ops, s.phases, s.tokens_per_local_expert)
                for s in rt.steps))
        ranks.append(rt)
        hidden, n_exp = hidden or h, n_exp or e
    ranks.sort(key=lambda r: r.rank)
    if [r.rank for r in ranks] != list(range(len(ranks))):
        raise InputError(", ".join(map(str, files)), "distributedInfo.rank",
                         "one trace per rank 0..N-1", [r.rank for r in ranks])
    return TraceSet(tuple(ranks), hidden, n_exp)
