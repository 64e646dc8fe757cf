"""``moesim schedule``: stage-time step, idle and activations; one-line errors."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main


def _json(capsys, *argv: str) -> dict:
    assert main(["schedule", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_dualpipe_against_1f1b(capsys):
    # P=8, N=20, F=W=1, B=2, F&B=3: every rank computes N(F+B) = 60; 1F1B idles
    # (P-1)(F+B) = 21 (step 81), DualPipe (P/2-1)(F&B+B-3W) = 6 (step 66)
    one = _json(capsys, "1f1b", "--pp", "8", "--microbatches", "20")
    dual = _json(capsys, "dualpipe", "--pp", "8", "--microbatches", "20")
    assert one["step"] == 81 and one["idle"] == [21] * 8 and one["compute"] == [60] * 8
    assert dual["step"] == 66 and dual["idle"] == [6] * 8 and dual["compute"] == [60] * 8
    assert dual["bubble_formula"]["value"] == 6 and one["bubble_formula"]["value"] == 21
    assert dual["inflight"] == [9] * 8 and one["inflight"][0] == 8
    assert "order" not in dual


def test_dualpipev_text_and_order(capsys, tmp_path):
    png = tmp_path / "v.png"
    assert main(["schedule", "dualpipev", "--pp", "2", "--microbatches", "4", "--order",
                 "--times", "F=1,B=2,W=1,FB=5/2", "--unit", "ms", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "2 ranks, 4 stages" in out and "step 24 ms" in out
    assert "rank 1: F0.1 F0.2 F1.1 F1.2 F2.1 BW0.2" in out
    assert png.stat().st_size > 0


@pytest.mark.parametrize("argv, words", [
    (["dualpipe", "--pp", "3", "--microbatches", "6"], "--pp: expected an even number"),
    (["dualpipe", "--pp", "4", "--microbatches", "6"], ">= 2 x --pp = 8 for dualpipe, got 6"),
    (["dualpipev", "--pp", "0", "--microbatches", "6"], "--pp: expected an integer >= 1"),
    (["1f1b", "--pp", "2", "--microbatches", "4", "--times", "F=1,B=2"], "--times"),
    (["1f1b", "--pp", "2", "--microbatches", "4", "--times", "F=1,B=1,W=2,FB=2"], "W <= B"),
    (["1f1b", "--pp", "2", "--microbatches", "4", "--times", "F=nan,B=2,W=1,FB=3"], "--times"),
    (["1f1b", "--pp", "2", "--microbatches", "4", "--plot", "/nonexistent-dir/x.png"],
     "--plot: expected an existing folder for the output file"),   # before the work
])
def test_bad_input_is_one_line(capsys, argv, words):
    assert main(["schedule", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
