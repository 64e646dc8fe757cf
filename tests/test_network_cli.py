"""`moesim flows` end to end on a tiny explicit topology (hand-computed times)."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main

TOPO = """\
name: star3
routing: shortest
nodes:
  - {id: g0, kind: gpu, host: 0, local: 0}
  - {id: g1, kind: gpu, host: 0, local: 1}
  - {id: g2, kind: gpu, host: 0, local: 2}
  - {id: sw, kind: nvswitch, host: 0}
links:   # test values: 10 GB/s = 1e10 B/s per direction, 1 µs per link
  - {src: g0, dst: sw, kind: nvlink, bandwidth_GBps: 10, latency_us: 1}
  - {src: g1, dst: sw, kind: nvlink, bandwidth_GBps: 10, latency_us: 1}
  - {src: g2, dst: sw, kind: nvlink, bandwidth_GBps: 10, latency_us: 1}
"""

FLOWS = [
    {"id": "a", "src": "g0", "dst": "g1", "bytes": 1e6, "start_s": 0.0},
    {"id": "b", "src": "g0", "dst": "g2", "bytes": "1MB", "start_s": 0.0},
    {"id": 7, "src": "g1", "dst": "g2", "bytes": 5e5, "start_s": 1e-4},
    {"id": "self", "src": "g2", "dst": "g2", "bytes": 1e9},
]


@pytest.fixture
def files(tmp_path):
    topo = tmp_path / "star3.yaml"
    topo.write_text(TOPO)
    flows = tmp_path / "flows.json"
    flows.write_text(json.dumps(FLOWS))
    return topo, flows, tmp_path


def run_json(capsys, *argv) -> dict:
    assert main(["flows", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_flow_model_times_and_paths(files, capsys) -> None:
    # a and b share g0->sw (1e10 B/s): 5e9 B/s each, 1e6 B -> 200 µs, + 2 links x 1 µs.
    # 7 joins at 100 µs on g1->sw, sw->g2 (shared with b): max-min gives b and 7 5e9 B/s
    # each (b is held to 5e9 by g0->sw anyway): 5e5 B / 5e9 = 100 µs -> 200 µs, + 2 µs.
    topo, flows, _ = files
    out = run_json(capsys, "--topology", str(topo), "--flows", str(flows))
    got = {f["id"]: f for f in out["flows"]}
    assert [f["id"] for f in out["flows"]] == ["a", "b", 7, "self"]
    assert got["a"]["finish_s"] == pytest.approx(202e-6, rel=1e-12)
    assert got["b"]["finish_s"] == pytest.approx(202e-6, rel=1e-12)
    assert got[7]["finish_s"] == pytest.approx(202e-6, rel=1e-12)
    assert got["self"]["finish_s"] == 0.0 and got["self"]["path"] == []
    assert got["a"]["path"] == [["g0", "sw"], ["sw", "g1"]]
    assert got["b"]["bytes"] == 1e6


def test_analytical_model_times(files, capsys) -> None:
    # alone on its path: a, b: 1e6 / 1e10 = 100 µs + 2 µs; 7: 100 + 50 + 2 µs
    topo, flows, _ = files
    out = run_json(capsys, "--topology", str(topo), "--flows", str(flows), "--model", "analytical")
    got = {f["id"]: f["finish_s"] for f in out["flows"]}
    assert got == {"a": pytest.approx(102e-6, rel=1e-12), "b": pytest.approx(102e-6, rel=1e-12),
                   7: pytest.approx(152e-6, rel=1e-12), "self": 0.0}


def test_table_output_has_units(files, capsys) -> None:
    topo, flows, _ = files
    assert main(["flows", "--topology", str(topo), "--flows", str(flows)]) == 0
    out = capsys.readouterr().out
    assert "finish µs" in out and "GB/s" in out
    assert "g0 > sw > g1" in out
    assert "202.000" in out


@pytest.mark.parametrize(("content", "field", "expected"), [
    ('[{"id": 1, "src": "g0", "dst": "g1"}]', "flows[0].bytes", "required"),
    ('[{"id": 1, "src": "g0", "dst": "g1", "bytes": -5}]', "flows[0].bytes", "size >= 0"),
    ('[{"id": 1, "src": "g0", "dst": "gX", "bytes": 5}]', "flows[0].dst", "GPU name"),
    ('[{"id": 1, "src": "g0", "dst": "g1", "bytes": 5, "start_s": -1}]', "flows[0].start_s", ">= 0"),
    ('[{"id": 1, "src": "g0", "dst": "g1", "bytes": 5}, {"id": 1, "src": "g0", "dst": "g1", "bytes": 5}]',
     "flows[1].id", "not used"),
    ('[{"id": 1, "src": "g0", "dst": "g1", "bytes": 5, "colour": 3}]', "flows[0].colour", "only the keys"),
    ('[{"id": 1, "src": "g0",', "line 1", "valid JSON"),
    ('{"id": 1}', "", "JSON list"),
])
def test_bad_flows_file_exits_2_with_one_line(files, capsys, content, field, expected) -> None:
    topo, _, tmp = files
    bad = tmp / "bad.json"
    bad.write_text(content)
    assert main(["flows", "--topology", str(topo), "--flows", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(bad) in err and field in err and expected in err


def test_missing_flows_file_exits_2(files, capsys) -> None:
    topo, _, tmp = files
    assert main(["flows", "--topology", str(topo), "--flows", str(tmp / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.json" in err and "readable" in err


def test_unknown_topology_exits_2(files, capsys) -> None:
    _, flows, _ = files
    assert main(["flows", "--topology", "no-such-preset", "--flows", str(flows)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-preset" in err


def test_same_input_same_output_bytes(files, capsys) -> None:
    topo, flows, _ = files
    outs = []
    for _ in range(2):
        assert main(["flows", "--topology", str(topo), "--flows", str(flows), "--json"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
