"""Low-level reading of Kineto (torch.profiler) JSON: files, events, nesting, shapes.

No torch needed. Times in the file are µs; everything returned here is seconds.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moesim.errors import InputError

# Bytes per element of the dtype names torch.profiler writes in "Input type".
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    # record_param_comms spells them differently
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Byte": 1,
    "Char": 1, "Bool": 1,
}
#: matmul ops (the innermost of nested ones is the kernel); ``baddbmm`` is a batched
#: ``addmm`` (bias + batch1 @ batch2), as GShard/Switch-style expert code writes it
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
              "aten::linear"}
FLOAT_TYPES = {"float", "double", "c10::Half", "c10::BFloat16", "c10::Float8_e4m3fn",
               "c10::Float8_e5m2", "Float", "Double", "Half", "BFloat16"}


@dataclass(frozen=True, slots=True)
class Event:
    """One complete ('X') event. ``idx`` is its position in the file."""

    idx: int
    name: str
    cat: str
    tid: str
    start_s: float
    dur_s: float
    args: dict[str, Any]

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s

    @property
    def dims(self) -> list:
        d = self.args.get("Input Dims")
        return d if isinstance(d, list) else []

    @property
    def strides(self) -> list:
        st = self.args.get("Input Strides")
        return st if isinstance(st, list) else []

    @property
    def types(self) -> list:
        t = self.args.get("Input type")
        return t if isinstance(t, list) else []


def load_trace(path: Path) -> dict[str, Any]:
    """Read a Kineto JSON file (plain or gzip) into a dict with a ``traceEvents`` list."""
    src = str(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise InputError(src, "", "a readable torch.profiler trace file", str(err)) from err
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise InputError(src, "", "a valid gzip file", "a corrupt gzip stream") from err
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(src, "", "a torch.profiler (Kineto) JSON trace", "not JSON") from err
    if isinstance(doc, list):  # the bare Chrome trace array form
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise InputError(src, "traceEvents", "a list of trace events", type(doc).__name__
                         if not isinstance(doc, dict) else "missing")
    return doc


def complete_events(doc: dict[str, Any], source: str, origin_us: float = 0.0) -> list[Event]:
    """The 'X' events with numeric ts/dur, as :class:`Event` (seconds), sorted by start
    then by longest first (so a parent precedes its children). Training steps of a
    trace without ``ProfilerStep`` spans: :func:`moesim.validation.cpu.steps.step_events`.
    Times are counted from ``origin_us`` (µs, the file's clock): epoch-based µs of
    ~1.7e15 keep only ~0.2 µs in a double once in seconds, so GPU ingest passes the
    trace's first timestamp."""
    out = []
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        for field, v in (("ts", ts), ("dur", dur)):   # a complete event has both, numbers
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InputError(source, f"traceEvents[{i}].{field}", "a number (µs) in "
                                 "every complete ('X') event", v)
        if not math.isfinite(ts):
            raise InputError(source, f"traceEvents[{i}].ts", "a finite time (µs)", ts)
        if not math.isfinite(dur) or dur < 0:
            raise InputError(source, f"traceEvents[{i}].dur", "a finite duration >= 0", dur)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        out.append(Event(i, str(e.get("name", "")), str(e.get("cat", "")),
                         f"{e.get('pid', '')}/{e.get('tid', '')}", (ts - origin_us) * 1e-6,
                         dur * 1e-6, args))
    out.sort(key=lambda ev: (ev.start_s, -ev.dur_s, ev.idx))
    return out


def is_backward_name(name: str) -> bool:
    """An op run by the autograd engine (``autograd::engine::*``, ``*Backward*``)."""
    return name.startswith("autograd::engine") or "Backward" in name


def ancestors(events: list[Event]) -> dict[int, list[int]]:
    """For each event idx, the idx of the events on the same thread that enclose it
    (outermost first). ``events`` must be sorted as :func:`complete_events` returns."""
    stacks: dict[str, list[Event]] = {}
    out: dict[int, list[int]] = {}
    eps = 1e-9
    for ev in events:
        st = stacks.setdefault(ev.tid, [])
        while st and st[-1].end_s < ev.end_s - eps:
            st.pop()
        out[ev.idx] = [p.idx for p in st]
        st.append(ev)
    return out


def parse_int_list(text: Any) -> list[int] | None:
    """``"[265, 247]"`` or ``[265, 247]`` → ``[265, 247]``; ``"[]"`` → ``[]``; else None."""
    if isinstance(text, list) and all(isinstance(x, int) for x in text):
        return list(text)
    if not isinstance(text, str):
        return None
    nums = re.findall(r"-?\d+", text)
    if not re.fullmatch(r"\s*\[[\s\d,\-\[\]]*\]\s*", text):
        return None
    return [int(n) for n in nums]


def rank_of(doc: dict[str, Any], path: Path) -> int | None:
    """The rank recorded in ``distributedInfo`` or, failing that, in the file name."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = re.search(r"rank[_-]?(\d+)", path.name)
    return int(m.group(1)) if m else None


def world_of(doc: dict[str, Any]) -> int | None:
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("world_size"), int):
        return int(info["world_size"])
    return None
