"""Chrome trace event format (Perfetto, chrome://tracing): export and load back.

Layout: one process per node (``pid`` = node index, ``process_name`` "node N"),
one thread per rank stream (``tid = rank * TID_STRIDE + stream slot``; slot 0 is
the compute stream, 1 the comm stream, then extra ``comm.<group>`` streams, and
the last slot, :data:`WAIT_SLOT`, a "wait" track holding the rank's stall and
bubble spans so that they never overlap a collective on the comm track).
Spans are complete events (``ph: "X"``) with ``ts``/``dur`` in µs, named
"L3 mb1 fwd.experts", ``cat`` = span kind. Each stall gets a flow arrow
(``ph: "s"`` → ``ph: "f"``, shared ``id``) from the blocking rank's span that
ended the wait. Every Span field is kept in ``args`` so :func:`load_chrome_trace`
gives the spans back.
"""

from __future__ import annotations

import bisect
import gc
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Any

from moesim import __version__
from moesim.errors import InputError
from moesim.trace.result import SimResult
from moesim.trace.spans import SPAN_KINDS, Span

TID_STRIDE = 16
WAIT_SLOT = TID_STRIDE - 1
# Chrome trace viewer's reserved colour names (catapult tracing/base/color_scheme.html)
_CNAME = {"stall": "terrible", "bubble": "yellow"}
_WAIT_KINDS = ("stall", "bubble")


def event_name(sp: Span) -> str:
    parts = []
    if sp.layer >= 0:
        parts.append(f"L{sp.layer}")
    if sp.microbatch >= 0:
        parts.append(f"mb{sp.microbatch}")
    parts.append(sp.name)
    return " ".join(parts)


def _stream_slots(spans: list[Span]) -> dict[str, int]:
    extra = sorted({sp.stream for sp in spans} - {"compute", "comm"})
    slots = {"compute": 0, "comm": 1}
    for i, s in enumerate(extra):
        slots[s] = min(2 + i, WAIT_SLOT - 1)
    return slots


def _assign_tracks(spans: list[Span], slots: dict[str, int]) -> dict[int, tuple[int, str]]:
    """id(span) -> (tid, track name). Spans of one rank stream that overlap in time go to
    extra "overlap" tracks (free slots of that rank), so that no track holds partially
    overlapping slices, which the viewers cannot nest."""
    out: dict[int, tuple[int, str]] = {}
    lanes: dict[tuple[int, str], list[float]] = {}   # (rank, track) -> end time per lane
    extra: dict[tuple[int, str, int], int] = {}       # (rank, track, lane) -> slot
    free: dict[int, list[int]] = {}
    base_slots = set(slots.values()) | {WAIT_SLOT}
    for sp in sorted(spans, key=lambda s: (s.rank, s.start_s, -s.end_s)):
        rank, start = sp.rank, sp.start_s
        if sp.kind in _WAIT_KINDS:
            track, base = "wait", WAIT_SLOT
        else:
            track = sp.stream
            base = slots[track]
        ends = lanes.get((rank, track))
        if ends is None:
            lanes[(rank, track)] = [sp.end_s]
            lane = 0
        elif ends[0] <= start:  # the common case: the first lane is free
            ends[0] = sp.end_s
            lane = 0
        else:
            lane = next((k for k, e in enumerate(ends) if e <= start), len(ends))
            if lane == len(ends):
                ends.append(sp.end_s)
            else:
                ends[lane] = sp.end_s
        slot, name = base, track
        if lane > 0:
            key = (rank, track, lane)
            if key not in extra:
                pool = free.setdefault(rank, [x for x in range(TID_STRIDE) if x not in base_slots])
                extra[key] = pool.pop(0) if pool else base
            slot = extra[key]
            if slot != base:
                name = f"{track} (overlap {lane})"
        out[id(sp)] = (rank * TID_STRIDE + slot, name)
    return out


def _us(t_s: float) -> float:
    return t_s * 1e6


def _span_args(sp: Span) -> dict[str, Any]:
    args: dict[str, Any] = {"rank": sp.rank, "stream": sp.stream, "op": sp.name,
                            "layer": sp.layer, "microbatch": sp.microbatch, "phase": sp.phase}
    if sp.bytes:
        args["bytes"] = sp.bytes
    if sp.tokens:
        args["tokens"] = sp.tokens
    if sp.flops:
        args["flops"] = sp.flops
    if sp.experts:
        args["experts"] = list(sp.experts)
    if sp.peers:
        args["peers"] = list(sp.peers)
    if sp.waited_on >= 0:
        args["waited_on"] = sp.waited_on
    if sp.expert >= 0:
        args["expert"] = sp.expert
    if sp.reason:
        args["reason"] = sp.reason
    if sp.args:
        args["extra"] = sp.args
    return args


class EndIndex:
    """One rank's spans sorted by end time, for "latest span ending by t" queries."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = sorted(spans, key=attrgetter("end_s", "start_s", "stream", "name"))
        self.ends = [s.end_s for s in self.spans]

    def upto(self, t_s: float) -> int:
        """Number of spans ending at or before ``t_s``."""
        return bisect.bisect_right(self.ends, t_s)


def index_by_rank(spans: list[Span]) -> dict[int, EndIndex]:
    groups: dict[int, list[Span]] = {}
    for sp in spans:
        groups.setdefault(sp.rank, []).append(sp)
    return {r: EndIndex(g) for r, g in groups.items()}


def blocking_span(index: EndIndex, t_end: float, tol_s: float = 1e-9) -> Span | None:
    """The span of the blocking rank that ended the wait at ``t_end``: among its
    non-wait spans ending at ``t_end`` (within tol), the compute one first, then the
    longest; else the latest ending before ``t_end``."""
    exact: list[Span] = []
    for i in range(index.upto(t_end + tol_s) - 1, -1, -1):
        sp = index.spans[i]
        if sp.kind in _WAIT_KINDS:
            continue
        if abs(sp.end_s - t_end) <= tol_s:
            exact.append(sp)
            continue
        if not exact:
            return sp
        break
    if not exact:
        return None
    return min(exact, key=lambda s: (s.stream != "compute", -s.dur_s, s.start_s))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Cyclic GC off while building ~10^5 small objects (no cycles among them): the
    collections it would trigger as the heap grows cost about a third of the build."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class _Layout:
    """What both writers share: spans in event order, their (tid, track), flow arrows
    (id, src ts/pid/tid, dst ts/pid/tid), metadata events and ``otherData``."""

    spans: list[Span]
    rpn: int
    tids: dict[int, tuple[int, str]]
    flows: list[tuple[int, float, int, int, float, int, int]]
    meta: list[dict]
    other: dict[str, Any]


def _layout(result: SimResult) -> _Layout:
    spans = sorted(result.spans, key=lambda s: (s.rank, s.start_s, s.end_s, s.stream, s.name))
    rpn = max(1, int(result.ranks_per_node))
    tids = _assign_tracks(spans, _stream_slots(spans))
    tid_name: dict[tuple[int, int], str] = {}   # (pid, tid) -> thread name, first use
    for sp in spans:
        tid, track = tids[id(sp)]
        if (sp.rank // rpn, tid) not in tid_name:
            tid_name[(sp.rank // rpn, tid)] = f"rank {sp.rank} {track}"

    by_rank = index_by_rank(spans)
    flows = []
    for sp in spans:
        if sp.kind != "stall" or sp.waited_on < 0 or sp.dur_s <= 0:
            continue
        if sp.waited_on not in by_rank:
            continue
        blk = blocking_span(by_rank[sp.waited_on], sp.end_s)
        if blk is None or blk.dur_s <= 0:
            continue
        # flow ends bind to the enclosing slice, so put both ends strictly inside
        src_ts = _us(blk.end_s) - min(_us(blk.dur_s) / 2, 0.5)
        dst_ts = _us(sp.end_s) - min(_us(sp.dur_s) / 2, 0.5)
        flows.append((len(flows) + 1, src_ts, blk.rank // rpn, tids[id(blk)][0],
                      dst_ts, sp.rank // rpn, tids[id(sp)][0]))

    meta: list[dict] = []
    for pid in sorted({p for p, _ in tid_name}):
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": f"node {pid}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
    for (pid, tid) in sorted(tid_name):
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": tid_name[(pid, tid)]}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}})
    other = {"generator": f"moesim {__version__}", "n_ranks": result.n_ranks,
             "ranks_per_node": result.ranks_per_node,
             "step_time_s": result.step_time_s, "hot_ranks": list(result.hot_ranks)}
    return _Layout(spans, rpn, tids, flows, meta, other)


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace as a JSON-able dict ``{"traceEvents": [...], ...}``;
    :func:`write_chrome_trace` writes the same as JSON text without building it."""
    with _gc_paused():
        lay = _layout(result)
        events: list[dict] = []
        for sp in lay.spans:
            tid = lay.tids[id(sp)][0]
            ev = {"name": event_name(sp), "cat": sp.kind, "ph": "X", "ts": _us(sp.start_s),
                  "dur": max(0.0, _us(sp.end_s) - _us(sp.start_s)), "pid": sp.rank // lay.rpn,
                  "tid": tid, "args": _span_args(sp)}
            if sp.kind in _CNAME:
                ev["cname"] = _CNAME[sp.kind]
            events.append(ev)
        for fid, src_ts, src_pid, src_tid, dst_ts, dst_pid, dst_tid in lay.flows:
            common = {"name": "blocked by", "cat": "stall", "id": fid}
            events.append({**common, "ph": "s", "ts": src_ts, "pid": src_pid, "tid": src_tid})
            events.append({**common, "ph": "f", "bp": "e", "ts": dst_ts, "pid": dst_pid,
                           "tid": dst_tid})
        return {"traceEvents": lay.meta + events, "displayTimeUnit": "ms",
                "otherData": lay.other}


def _json_default(obj: Any) -> Any:
    """numpy scalars/arrays, tuples and sets that engines put in ``Span.args``."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, set | frozenset | tuple):
        return sorted(obj) if isinstance(obj, set | frozenset) else list(obj)
    return str(obj)


_dumps = partial(json.dumps, separators=(",", ":"), allow_nan=False, default=_json_default)
_enc = json.encoder.encode_basestring_ascii   # what json.dumps uses for str (ensure_ascii)
_frepr, _irepr = float.__repr__, int.__repr__


def _num(x: Any) -> str:
    """``_dumps(x)`` for a number, fast for plain finite floats and ints."""
    t = type(x)
    if t is float and x - x == 0.0:  # finite
        return _frepr(x)
    if t is int:
        return _irepr(x)
    return _dumps(x)


def _str(x: Any) -> str:
    return _enc(x) if type(x) is str else _dumps(x)


def _int_list(t: tuple, cache: dict[int, str]) -> str:
    """JSON of the tuple ``t``, cached by object: the engines share one peers tuple among
    the spans of a collective group. ``t`` must stay alive while ``cache`` is used."""
    text = cache.get(id(t))
    if text is None:
        text = cache[id(t)] = "[" + ",".join([_num(e) for e in t]) + "]"
    return text


def _x_event_json(sp: Span, pid: int, tid: int, lists: dict[int, str]) -> str:
    """``_dumps`` of :func:`chrome_trace`'s event of ``sp``, written directly (one f-string
    instead of two dicts and the encoder's walk: this runs once per span). ``lists``: the
    :func:`_int_list` cache."""
    rank, layer, mb, op = sp.rank, sp.layer, sp.microbatch, sp.name
    name = op
    if mb >= 0:
        name = f"mb{mb} {name}"
    if layer >= 0:
        name = f"L{layer} {name}"
    ts = sp.start_s * 1e6
    dur = sp.end_s * 1e6 - ts
    kind = sp.kind
    # plain ints format as json writes them; anything else goes through _num
    if not (type(rank) is int and type(layer) is int and type(mb) is int):
        rank, layer, mb, pid, tid = _num(rank), _num(layer), _num(mb), _num(pid), _num(tid)
    ts_txt = repr(ts) if type(ts) is float and ts - ts == 0.0 else _num(ts)
    dur_txt = (repr(dur) if type(dur) is float and dur - dur == 0.0 else _num(dur)) \
        if dur > 0.0 else "0.0"
    text = (f'{{"name":{_str(name)},"cat":{_str(kind)},"ph":"X","ts":{ts_txt},'
            f'"dur":{dur_txt},"pid":{pid},"tid":{tid},'
            f'"args":{{"rank":{rank},"stream":{_str(sp.stream)},"op":{_str(op)},'
            f'"layer":{layer},"microbatch":{mb},"phase":{_str(sp.phase)}')
    if sp.bytes:
        text += f',"bytes":{_num(sp.bytes)}'
    if sp.tokens:
        text += f',"tokens":{_num(sp.tokens)}'
    if sp.flops:
        text += f',"flops":{_num(sp.flops)}'
    if sp.experts:
        text += ',"experts":' + _int_list(sp.experts, lists)
    if sp.peers:
        text += ',"peers":' + _int_list(sp.peers, lists)
    if sp.waited_on >= 0:
        text += f',"waited_on":{_num(sp.waited_on)}'
    if sp.expert >= 0:
        text += f',"expert":{_num(sp.expert)}'
    if sp.reason:
        text += f',"reason":{_str(sp.reason)}'
    if sp.args:
        text += f',"extra":{_dumps(sp.args)}'
    if kind in _CNAME:
        return text + f'}},"cname":{_enc(_CNAME[kind])}}}'
    return text + "}}"


def chrome_trace_json(result: SimResult) -> str:
    """``json.dumps(chrome_trace(result), separators=(",", ":"), allow_nan=False)``
    (same bytes) without the dicts: the span events are written as text (for the 131 k
    spans of mixtral-8x7b-64gpu 1.0 s instead of 1.6 s, Python allocations peaking at
    158 MB instead of 201 MB)."""
    with _gc_paused():
        lay = _layout(result)
        tids, rpn = lay.tids, lay.rpn
        parts = [_dumps(ev) for ev in lay.meta]
        lists: dict[int, str] = {}
        parts += [_x_event_json(sp, sp.rank // rpn, tids[id(sp)][0], lists)
                  for sp in lay.spans]
        for fid, src_ts, src_pid, src_tid, dst_ts, dst_pid, dst_tid in lay.flows:
            parts.append(f'{{"name":"blocked by","cat":"stall","id":{fid},"ph":"s",'
                         f'"ts":{_num(src_ts)},"pid":{_num(src_pid)},"tid":{_num(src_tid)}}}')
            parts.append(f'{{"name":"blocked by","cat":"stall","id":{fid},"ph":"f","bp":"e",'
                         f'"ts":{_num(dst_ts)},"pid":{_num(dst_pid)},"tid":{_num(dst_tid)}}}')
        return ('{"traceEvents":[' + ",".join(parts) + '],"displayTimeUnit":"ms","otherData":'
                + _dumps(lay.other) + "}")


def write_chrome_trace(result: SimResult, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(chrome_trace_json(result))
    return path


def _need(ev: dict, key: str, types: tuple, src: str, i: int) -> Any:
    if key not in ev or not isinstance(ev[key], types) or isinstance(ev[key], bool):
        raise InputError(src, f"traceEvents[{i}].{key}", "a number (µs)", ev.get(key, "<missing>"))
    return ev[key]


def load_chrome_trace_dict(data: Any, source: str = "<trace>") -> tuple[list[Span], dict]:
    """Spans and ``otherData`` from a trace dict written by :func:`chrome_trace`."""
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(source, "traceEvents", "a JSON object with a traceEvents list",
                         type(data).__name__)
    names: dict[tuple[int, int], str] = {}
    for ev in data["traceEvents"]:
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev.get("pid"), ev.get("tid"))] = str(ev.get("args", {}).get("name", ""))
    spans: list[Span] = []
    for i, ev in enumerate(data["traceEvents"]):
        if not isinstance(ev, dict):
            raise InputError(source, f"traceEvents[{i}]", "an event object", type(ev).__name__)
        if ev.get("ph") != "X":
            continue
        ts = float(_need(ev, "ts", (int, float), source, i))
        dur = float(_need(ev, "dur", (int, float), source, i))
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
            raise InputError(source, f"traceEvents[{i}].dur", "a finite duration >= 0 µs", dur)
        kind = ev.get("cat")
        if kind not in SPAN_KINDS:
            raise InputError(source, f"traceEvents[{i}].cat", f"one of {', '.join(SPAN_KINDS)}",
                             kind)
        a = ev.get("args") or {}
        rank = a.get("rank")
        stream = a.get("stream")
        if rank is None or stream is None:  # fall back on the thread name "rank R stream"
            parts = names.get((ev.get("pid"), ev.get("tid")), "").split()
            if len(parts) != 3 or parts[0] != "rank" or not parts[1].isdigit():
                raise InputError(source, f"traceEvents[{i}].args.rank",
                                 "a rank in args or a thread_name 'rank R stream'", a)
            rank, stream = int(parts[1]), parts[2]
        try:
            spans.append(Span(
                rank=int(rank), stream=str(stream), kind=kind,
                name=str(a.get("op", ev.get("name", ""))),
                start_s=ts / 1e6, end_s=(ts + dur) / 1e6,
                layer=int(a.get("layer", -1)), microbatch=int(a.get("microbatch", -1)),
                phase=str(a.get("phase", "")), bytes=float(a.get("bytes", 0.0)),
                tokens=int(a.get("tokens", 0)), experts=tuple(int(e) for e in a.get("experts", ())),
                peers=tuple(int(p) for p in a.get("peers", ())),
                waited_on=int(a.get("waited_on", -1)), expert=int(a.get("expert", -1)),
                reason=str(a.get("reason", "")), flops=float(a.get("flops", 0.0)),
                args=dict(a.get("extra", {})),
            ))
        except (TypeError, ValueError) as err:
            raise InputError(source, f"traceEvents[{i}].args", "span fields of the right types",
                             str(err)) from None
    other = data.get("otherData") if isinstance(data.get("otherData"), dict) else {}
    return spans, other


def load_chrome_trace(path: str | Path) -> list[Span]:
    """Spans from a trace.json written by :func:`write_chrome_trace`."""
    return load_chrome_trace_file(path)[0]


def load_chrome_trace_file(path: str | Path) -> tuple[list[Span], dict]:
    """Spans and the trace's ``otherData`` (n_ranks, ranks_per_node, step_time_s, hot_ranks)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(str(path), "", "a readable Chrome trace JSON file", err.strerror) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(str(path), f"line {err.lineno} column {err.colno}", "valid JSON",
                         err.msg) from None
    return load_chrome_trace_dict(data, str(path))
