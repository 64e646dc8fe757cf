"""Find the all-to-alls in a Kineto trace and their split sizes.

Forms supported (seen in torch 2.13 gloo traces, and documented for NCCL):

- ``c10d::alltoall_base_`` (``all_to_all_single``; cpu_op, issuing thread):
  ``Concrete Inputs`` [3] and [4] are the output and input split sizes as text
  (``"[265, 247]"``, ``"[]"`` for equal splits); ``Input Dims`` [0]/[1] the output/input
  shapes; ``Input type`` [1] the dtype. Splits are along dim 0; a tensor of more than
  two dims (``[world, C, H]`` buckets, as fairseq/GShard code sends) counts
  ``prod(dims[1:-1])`` rows of width ``dims[-1]`` per unit of split.
- ``c10d::alltoall_`` (the list form ``all_to_all(out_list, in_list)``): ``Input Dims``
  [0]/[1] are *lists* of output/input tensor shapes (``Input type`` ``TensorList``); the
  split sizes are the rows of each listed tensor. The trace gives no dtype for a list:
  it is taken from the matched worker span's ``Input type`` (gloo records it), else
  float32 is assumed.
- ``record_param_comms`` with ``Collective name`` all_to_all*: ``In split size`` /
  ``Out split size``, ``In msg nelems``, ``dtype``, ``Group size``.
- the backend's worker span ``gloo:all_to_all`` / ``nccl:all_to_all`` (another thread):
  matched to the issuing op in order (first unused one starting after the issue whose
  first input dim equals the issuing op's); its end is when the data has arrived, its
  duration ``work_dur_s`` includes waiting for the slowest peer.

A collective carries tokens when its input is floating point with at least two dims
(a 2-D ``record_param_comms`` message: more than one element per row); the rest (the
int64 split-size exchange) are count exchanges.

Not supported: all-to-alls built from other collectives (``torch.distributed.nn.
functional.all_to_all`` on gloo runs ``world`` ``c10d::scatter_`` calls; send/recv
pairs): they are not found, and ingest says there is no token all-to-all.

Training steps of a trace without ``ProfilerStep`` spans are found from these
collectives in :mod:`moesim.validation.cpu.steps`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from moesim.errors import InputError
from moesim.validation.kineto.events import (
    DTYPE_BYTES,
    FLOAT_TYPES,
    Event,
    parse_int_list,
)

ISSUE_OPS = {"c10d::alltoall_base_", "c10d::alltoall_"}
WORKER_RE = re.compile(r"^(gloo|nccl):all_to_all", re.IGNORECASE)


@dataclass(frozen=True)
class Coll:
    """One all-to-all on one rank: rows sent to / received from each rank."""

    issue: Event
    send: list[int]
    recv: list[int]
    row_bytes: int
    width: int           # elements per row (the hidden size for token all-to-alls)
    tokens: bool
    end_s: float
    work_dur_s: float


def _is_shape(x: object) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(d, int) for d in x)


def _rows_width(shape: list[int]) -> tuple[int, int]:
    """(rows per unit of dim 0, row width) of a tensor: width = the last dim (the
    hidden size for tokens), rows per unit = the product of the dims in between."""
    if len(shape) < 2:
        return 1, 1
    return int(np.prod(shape[1:-1])) if len(shape) > 2 else 1, int(shape[-1])


def _parse_issue(ev: Event, world: int | None, source: str) -> dict:
    """Split sizes (rows), width, dtype (None: unknown) and first input dim of one
    issuing op."""
    if ev.name == "record_param_comms":
        send = parse_int_list(ev.args.get("In split size")) or []
        recv = parse_int_list(ev.args.get("Out split size")) or []
        n = int(ev.args.get("Group size") or world or max(len(send), 1))
        nel = int(ev.args.get("In msg nelems") or 0)
        rows_in = sum(send) or n
        width = nel // rows_in if rows_in else 0
        out_rows = sum(recv) or rows_in
        # without split sizes a "row" is a whole chunk: not read as tokens
        return {"send": send or [rows_in // n] * n, "recv": recv or [out_rows // n] * n,
                "width": width, "dtype": str(ev.args.get("dtype", "")),
                "ndim": 2 if width > 1 and send else 1, "first": rows_in}
    dims, types = ev.dims, ev.types
    field = f"{ev.name}.Input Dims"
    want = "output and input shapes (record_shapes=True)"
    if len(dims) < 2 or not isinstance(dims[1], list) or not dims[1]:
        raise InputError(source, field, want, dims)
    if ev.name == "c10d::alltoall_" or (len(types) > 1 and types[1] == "TensorList"):
        outs, ins = dims[0], dims[1]
        if not (isinstance(outs, list) and all(map(_is_shape, outs))
                and all(map(_is_shape, ins))):
            raise InputError(source, field, "lists of output and input tensor shapes "
                             "(the list form all_to_all, record_shapes=True)", dims)
        mult, width = _rows_width(ins[0])
        send = [s[0] * _rows_width(s)[0] for s in ins]
        recv = [s[0] * _rows_width(s)[0] for s in outs]
        return {"send": send, "recv": recv, "width": width, "dtype": None,
                "ndim": len(ins[0]), "first": ins[0][0]}
    if not _is_shape(dims[1]) or not _is_shape(dims[0]):
        raise InputError(source, field, want, dims)
    ci = ev.args.get("Concrete Inputs") or []
    recv = parse_int_list(ci[3]) if len(ci) > 4 else None
    send = parse_int_list(ci[4]) if len(ci) > 4 else None
    n = world or max(len(send or []), 1)
    mult, width = _rows_width(dims[1])
    out_mult = _rows_width(dims[0])[0]
    rows_in, out_rows = dims[1][0], dims[0][0]
    send = [x * mult for x in send] if send else [rows_in // n * mult] * n
    recv = [x * out_mult for x in recv] if recv else [out_rows // n * out_mult] * n
    return {"send": send, "recv": recv, "width": width,
            "dtype": types[1] if len(types) > 1 else "", "ndim": len(dims[1]),
            "first": rows_in}


def find_collectives(events: list[Event], world: int | None, source: str) -> list[Coll]:
    issues, workers = [], []
    for ev in events:
        if ev.name in ISSUE_OPS or (ev.name == "record_param_comms" and "all_to_all" in
                                    str(ev.args.get("Collective name", "")).lower()):
            issues.append(ev)
        elif WORKER_RE.match(ev.name):
            workers.append(ev)
    used: set[int] = set()
    out = []
    for ev in issues:
        p = _parse_issue(ev, world, source)
        # the backend worker span of this collective: first unused one starting after issue
        end, work, wtype = ev.end_s, ev.dur_s, None
        for w in workers:
            if w.idx not in used and w.start_s >= ev.start_s - 1e-9:
                wd = w.dims[0] if w.dims and isinstance(w.dims[0], list) else None
                if wd is None or not wd or wd[0] == p["first"]:
                    used.add(w.idx)
                    end, work = max(end, w.end_s), w.dur_s
                    wtype = w.types[0] if w.types else None
                    break
        typ = p["dtype"]
        if typ is None:     # a TensorList: the worker's dtype, else float32 assumed
            typ = wtype if wtype in DTYPE_BYTES else "float"
        tokens = typ in FLOAT_TYPES and p["ndim"] >= 2 and bool(p["send"])
        row_bytes = p["width"] * DTYPE_BYTES.get(typ, 0)
        out.append(Coll(ev, p["send"], p["recv"], row_bytes, p["width"], tokens, end, work))
    return out
