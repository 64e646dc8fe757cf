"""Find the all-to-alls in a Kineto trace and their split sizes.

Forms supported (seen in torch 2.13 gloo traces, and documented for NCCL):

- ``c10d::alltoall_base_`` (cpu_op, issuing thread): ``Concrete Inputs`` [3] and [4]
  are the output and input split sizes as text (``"[265, 247]"``, ``"[]"`` for equal
  splits); ``Input Dims`` [0]/[1] the output/input shapes; ``Input type`` [1] the dtype.
- ``record_param_comms`` with ``Collective name`` all_to_all*: ``In split size`` /
  ``Out split size``, ``In msg nelems``, ``dtype``, ``Group size``.
- the backend's worker span ``gloo:all_to_all`` / ``nccl:all_to_all`` (another thread):
  matched to the issuing op in order (first unused one starting after the issue with
  the same input rows); its end is when the data has arrived, its duration
  ``work_dur_s`` includes waiting for the slowest peer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from moesim.errors import InputError
from moesim.validation.kineto import DTYPE_BYTES, FLOAT_TYPES, Event, parse_int_list

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
        if ev.name == "record_param_comms":
            send = parse_int_list(ev.args.get("In split size")) or []
            recv = parse_int_list(ev.args.get("Out split size")) or []
            n = int(ev.args.get("Group size") or world or max(len(send), 1))
            nel = int(ev.args.get("In msg nelems") or 0)
            typ = str(ev.args.get("dtype", ""))
            rows_in = sum(send) or n
            width = nel // rows_in if rows_in else 0
            tokens = typ in FLOAT_TYPES and bool(send) and width > 1
            row_bytes = width * DTYPE_BYTES.get(typ, 0)
            out_rows = sum(recv) or rows_in
        else:
            ci = ev.args.get("Concrete Inputs") or []
            dims, types = ev.dims, ev.types
            if len(dims) < 2 or not isinstance(dims[1], list) or not dims[1]:
                raise InputError(source, f"{ev.name}.Input Dims", "output and input shapes "
                                 "(record_shapes=True)", dims)
            recv = parse_int_list(ci[3]) if len(ci) > 4 else None
            send = parse_int_list(ci[4]) if len(ci) > 4 else None
            n = world or max(len(send or []), 1)
            rows_in, out_rows = dims[1][0], dims[0][0]
            width = int(np.prod(dims[1][1:])) if len(dims[1]) > 1 else 1
            typ = types[1] if len(types) > 1 else ""
            tokens = typ in FLOAT_TYPES and len(dims[1]) >= 2
            row_bytes = width * DTYPE_BYTES.get(typ, 0)
        if not send:
            send = [rows_in // n] * n
        if not recv:
            recv = [out_rows // n] * n
        # the backend worker span of this collective: first unused one starting after issue
        end, work = ev.end_s, ev.dur_s
        for w in workers:
            if w.idx not in used and w.start_s >= ev.start_s - 1e-9:
                wd = w.dims[0] if w.dims and isinstance(w.dims[0], list) else None
                if wd is None or not wd or wd[0] == rows_in:
                    used.add(w.idx)
                    end, work = max(end, w.end_s), w.dur_s
                    break
        out.append(Coll(ev, send, recv, row_bytes, width, tokens, end, work))
    return out
