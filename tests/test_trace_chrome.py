"""Chrome trace export: schema of the event format, round trip, flows, bad input."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.engine.breakdown import CATEGORIES, breakdown
from moesim.errors import InputError
from moesim.trace.chrome import (
    TID_STRIDE,
    WAIT_SLOT,
    _json_default,
    chrome_trace,
    chrome_trace_json,
    load_chrome_trace,
    load_chrome_trace_dict,
    write_chrome_trace,
)
from moesim.trace.spans import Span
from tests.test_trace_fixtures import MS, hot_expert_result, many_rank_result


def check_schema(trace: dict) -> None:
    """Required keys per phase type of the Chrome trace event format."""
    evs = trace["traceEvents"]
    named_pids = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    named_tids = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    flows: dict[int, list[str]] = {}
    for e in evs:
        assert e["ph"] in ("X", "M", "s", "f")
        if e["ph"] == "X":
            for k in ("name", "ph", "ts", "dur", "pid", "tid"):
                assert k in e, (k, e)
            assert e["dur"] >= 0
        if e["ph"] in ("X", "s", "f"):
            assert e["pid"] in named_pids
            assert (e["pid"], e["tid"]) in named_tids
        if e["ph"] in ("s", "f"):
            for k in ("name", "id", "ts", "pid", "tid", "cat"):
                assert k in e
            flows.setdefault(e["id"], []).append(e["ph"])
    for phs in flows.values():
        assert sorted(phs) == ["f", "s"]
    # slices on one track are disjoint or nested, never partially overlapping
    tracks: dict[tuple, list[tuple[float, float]]] = {}
    for e in evs:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for ivs in tracks.values():
        stack: list[float] = []
        for a, b in sorted(ivs, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= a:
                stack.pop()
            assert not stack or b <= stack[-1], ("partial overlap", a, b, stack)
            stack.append(b)
    json.dumps(trace, allow_nan=False)


def test_schema_layout_and_names():
    res = hot_expert_result()
    tr = chrome_trace(res)
    check_schema(tr)
    evs = tr["traceEvents"]
    xs = [e for e in evs if e["ph"] == "X"]
    assert len(xs) == len(res.spans)
    procs = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert procs == {0: "node 0"}  # 2 ranks, 2 per node
    threads = {e["tid"]: e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert threads == {0: "rank 0 compute", 1: "rank 0 comm", WAIT_SLOT: "rank 0 wait",
                       TID_STRIDE: "rank 1 compute"}
    hot = next(e for e in xs if e["tid"] == TID_STRIDE and "experts" in e["name"])
    assert hot["name"] == "L3 mb1 fwd.experts"
    assert hot["cat"] == "compute"
    assert hot["ts"] == pytest.approx(1500.0) and hot["dur"] == pytest.approx(2000.0)
    assert hot["args"]["experts"] == [2, 3] and hot["args"]["tokens"] == 800
    stall = next(e for e in xs if e["cat"] == "stall")
    assert stall["tid"] == WAIT_SLOT and stall["cname"] == "terrible"
    assert stall["args"]["waited_on"] == 1 and stall["args"]["expert"] == 3
    assert stall["dur"] == pytest.approx(1200.0)
    dp = next(e for e in xs if e["cat"] == "dp")
    assert dp["name"] == "dp.bucket0"  # no layer/micro-batch → bare op name


def test_flow_links_stall_to_hot_expert_compute():
    tr = chrome_trace(hot_expert_result())
    s = [e for e in tr["traceEvents"] if e["ph"] == "s"]
    f = [e for e in tr["traceEvents"] if e["ph"] == "f"]
    assert len(s) == len(f) == 1
    # starts inside rank 1's expert compute (1.5-3.5 ms), ends inside rank 0's stall (2.3-3.5)
    assert s[0]["tid"] == TID_STRIDE and 1500 < s[0]["ts"] < 3500
    assert f[0]["tid"] == WAIT_SLOT and 2300 < f[0]["ts"] < 3500 and f[0]["bp"] == "e"


def test_nodes_become_processes():
    res = many_rank_result(16, rpn=8)
    tr = chrome_trace(res)
    check_schema(tr)
    procs = sorted(e["pid"] for e in tr["traceEvents"] if e["name"] == "process_name")
    assert procs == [0, 1]
    r9 = [e for e in tr["traceEvents"] if e["ph"] == "X" and e["args"]["rank"] == 9]
    assert {e["pid"] for e in r9} == {1}
    assert len([e for e in tr["traceEvents"] if e["ph"] == "s"]) == 15  # one per stall


def test_round_trip_matches_summary_per_rank(tmp_path):
    res = hot_expert_result()
    path = write_chrome_trace(res, tmp_path / "trace.json")
    spans = load_chrome_trace(path)
    assert len(spans) == len(res.spans)
    back = breakdown(spans, res.n_ranks, res.step_time_s)[1]
    for pr_back, pr_sum in zip(back, res.summary["per_rank"], strict=True):
        for k in CATEGORIES:
            assert pr_back[k] == pytest.approx(pr_sum["breakdown_s"][k], abs=1e-12)
    key = lambda s: (s.rank, s.start_s, s.name)  # noqa: E731
    for a, b in zip(sorted(spans, key=key), sorted(res.spans, key=key), strict=True):
        assert (a.rank, a.stream, a.kind, a.name, a.layer, a.microbatch, a.phase, a.tokens,
                a.experts, a.peers, a.waited_on, a.expert, a.reason) == (
            b.rank, b.stream, b.kind, b.name, b.layer, b.microbatch, b.phase, b.tokens,
            b.experts, b.peers, b.waited_on, b.expert, b.reason)
        assert a.start_s == pytest.approx(b.start_s, abs=1e-15)
        assert a.end_s == pytest.approx(b.end_s, abs=1e-12)


def test_overlapping_spans_on_one_stream_get_extra_tracks():
    res = hot_expert_result()
    # two collectives on rank 1's comm stream that overlap in time
    res.spans.append(Span(1, "comm", "dp", "dp.bucket0", 1.0 * MS, 1.5 * MS))
    res.spans.append(Span(1, "comm", "tp", "tp.allreduce", 1.2 * MS, 1.8 * MS, layer=3))
    tr = chrome_trace(res)
    check_schema(tr)
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "thread_name"}
    assert "rank 1 comm (overlap 1)" in names
    tp = next(e for e in tr["traceEvents"] if e.get("cat") == "tp")
    assert tp["tid"] // TID_STRIDE == 1 and tp["tid"] % TID_STRIDE not in (0, 1, WAIT_SLOT)
    spans = load_chrome_trace_dict(tr)[0]
    assert [s.stream for s in spans if s.kind == "tp"] == ["comm"]


def test_numpy_values_in_span_args(tmp_path):
    import numpy as np

    res = hot_expert_result()
    res.spans.append(Span(1, "comm", "dp", "dp.bucket1", 4.0 * MS, 4.2 * MS,
                          args={"bucket_bytes": np.float64(1e6), "ids": np.arange(2)}))
    spans = load_chrome_trace(write_chrome_trace(res, tmp_path / "t.json"))
    extra = next(s.args for s in spans if s.name == "dp.bucket1")
    assert extra == {"bucket_bytes": 1e6, "ids": [0, 1]}


def test_same_result_same_bytes(tmp_path):
    a = write_chrome_trace(hot_expert_result(), tmp_path / "a.json").read_bytes()
    b = write_chrome_trace(hot_expert_result(), tmp_path / "b.json").read_bytes()
    assert a == b


@pytest.mark.parametrize("content,field", [
    ("{not json", "line 1"),
    ('{"events": []}', "traceEvents"),
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "pid": 0, "tid": 0, "cat": "compute"}]}',
     "traceEvents[0].dur"),
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": -1, "pid": 0, "tid": 0,'
     ' "cat": "compute"}]}', "traceEvents[0].dur"),
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 0, "tid": 0,'
     ' "cat": "kernel"}]}', "traceEvents[0].cat"),
])
def test_corrupt_trace_is_input_error(tmp_path, content, field):
    p = tmp_path / "trace.json"
    p.write_text(content)
    with pytest.raises(InputError) as ei:
        load_chrome_trace(p)
    assert ei.value.field.startswith(field)
    assert ei.value.source == str(p)


def test_plot_cli_corrupt_trace_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"step_time_s": 4.5 * MS}))
    (run / "trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": "late"}]}')
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "trace.json" in err[0] and "traceEvents[0].ts" in err[0] and "Traceback" not in err[0]


def _dict_json(res) -> str:
    return json.dumps(chrome_trace(res), separators=(",", ":"), allow_nan=False,
                      default=_json_default)


def test_text_writer_same_bytes_as_the_dict(tmp_path):
    import numpy as np

    res = hot_expert_result()
    res.spans += [
        # every optional field, ints where floats are usual and the other way round
        Span(1, "comm", "dp", 'dp "b1"\\µ←', 4.0 * MS, 4.2 * MS, layer=-1, microbatch=-1,
             phase="bwd", bytes=1000, tokens=3, flops=2.5e9, experts=(1, 2), peers=(0, 1),
             waited_on=0, expert=2, reason='rank 0 "late" ← µ',
             args={"bucket_bytes": np.float64(1e6), "ids": np.arange(2), "s": {3, 1}}),
        # numpy scalars in the typed fields take the slow path
        Span(np.int64(0), "comm", "pp", "send", np.float64(4.5 * MS), np.float64(4.5 * MS),
             layer=np.int64(2), microbatch=np.int32(0), experts=(np.int64(5),)),
        Span(1, "compute", "bubble", "wait", 0.0, 0, waited_on=0),
        Span(0, "comm.ep", "ep_dispatch", "a2a", 1.0 * MS, 1.2 * MS, peers=(True, 1)),
        # overlapping spans of one stream: extra tracks
        Span(1, "comm", "tp", "tp.allreduce", 1.2 * MS, 1.8 * MS, layer=3),
        Span(1, "comm", "tp", "tp.allreduce2", 1.3 * MS, 1.4 * MS, layer=3),
    ]
    res.spans.append(Span(1, "comm", "tp", "tp.reversed", 2.0 * MS, 1.9 * MS))  # dur < 0
    text = chrome_trace_json(res)
    assert text == _dict_json(res)
    assert write_chrome_trace(res, tmp_path / "t.json").read_text() == text
    json.loads(text)


def test_text_writer_refuses_non_finite_times():
    res = hot_expert_result()
    res.spans.append(Span(1, "comm", "dp", "dp.bucket1", float("nan"), float("inf")))
    with pytest.raises(ValueError):
        _dict_json(res)
    with pytest.raises(ValueError):
        chrome_trace_json(res)
