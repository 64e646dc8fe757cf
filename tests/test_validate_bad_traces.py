"""Corrupt, truncated and non-MoE traces: one error line naming the file, exit 2.

Each case goes through ``moesim ingest``, ``moesim calibrate`` and ``moesim validate``
(the three commands that read traces)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from moesim.cli import main
from tests.test_validate import rank_events, write_calib, write_traces


def _commands(trace: Path, tmp_path: Path) -> list[list[str]]:
    calib = write_calib(tmp_path / "calib.json")
    return [["ingest", str(trace)],
            ["calibrate", str(trace), "-o", str(tmp_path / "out.json")],
            ["validate", str(trace), "--calibration", str(calib)]]


def _check(capsys, args: list[str], where: str, what: str) -> None:
    assert main(args) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    assert where in lines[0] and what in lines[0], lines[0]


def test_truncated_gzip(tmp_path, capsys):
    d = write_traces(tmp_path / "t")
    gz = d / "rank1.json.gz"
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2])           # cut mid-stream
    for args in _commands(d, tmp_path):
        _check(capsys, args, "rank1.json.gz", "gzip")


def test_truncated_json(tmp_path, capsys):
    d = write_traces(tmp_path / "t")
    (d / "rank0.json.gz").unlink()
    text = json.dumps({"distributedInfo": {"rank": 0, "world_size": 2},
                       "traceEvents": rank_events(0)})
    (d / "rank0.json").write_text(text[: len(text) // 2])   # a run killed while writing
    for args in _commands(d, tmp_path):
        _check(capsys, args, "rank0.json", "JSON")


def test_valid_kineto_trace_without_all_to_all(tmp_path, capsys):
    """A well-formed trace of a dense layer (matmuls, no torch.distributed all-to-all)."""
    d = write_traces(tmp_path / "t")
    ev = [e for e in rank_events(1) if "all_to_all" not in e["name"]
          and "alltoall" not in e["name"]]
    assert any(e["name"] == "aten::mm" for e in ev)
    doc = {"distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": ev}
    (d / "rank1.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    for args in _commands(d, tmp_path):
        _check(capsys, args, "rank1.json.gz", "all-to-all")


@pytest.mark.parametrize("payload", [b"", b"\x00\x01binary", b"[1, 2, 3]"])
def test_empty_binary_or_wrong_json_shape(tmp_path, capsys, payload):
    d = write_traces(tmp_path / "t")
    (d / "rank0.json.gz").unlink()
    (d / "rank0.json").write_bytes(payload)
    _check(capsys, ["ingest", str(d)], "rank0.json", "expected")
