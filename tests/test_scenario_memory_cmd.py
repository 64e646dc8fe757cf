"""``moesim memory``: per-stage table composed from the layout, the schedule's in-flight
counts and the memory model; bad input is one line and exit status 2."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.memory.model import memory_per_rank, split_layers
from moesim.scenario import load_scenario
from moesim.wiring import resolve


def _json(capsys, *argv: str) -> dict:
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_text(capsys):
    assert main(["memory", "toy-cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("scenario toy-cpu: 2 ranks, tp=1 pp=1 dp=2 ep=2 edp=1")
    assert "GiB (2^30 bytes)" in out[1] and out[2].split()[-3:] == ["total", "capacity", "OOM"]
    assert out[3].split()[0] == "0" and out[3].split()[-1] == "ok"


def test_1f1b_stage_rows_compose_the_memory_model(capsys):
    t = _json(capsys, "mixtral-8x7b-ep8")
    res = resolve(load_scenario("mixtral-8x7b-ep8"))
    assert [r["inflight"] for r in t["stages"]] == [2, 1]  # 1F1B: p - s
    assert [r["ranks"] for r in t["stages"]] == [8, 8]
    for r, layers in zip(t["stages"], split_layers(32, 2), strict=True):
        one = memory_per_rank(res.model, micro_batch_tokens=4096, seq_len=4096, tp=1, pp=2,
                              ep=8, dp=8, zero=1, stage=r["stage"], layers=list(layers),
                              inflight_microbatches=1, recompute="full", device=res.device)
        assert r["activations"] == pytest.approx(r["inflight"] * one.activations)
        assert r["optimizer"] == pytest.approx(one.optimizer)
        parts = ("weights", "gradients", "optimizer", "activations", "token_buffers",
                 "recompute_workspace")
        assert r["peak_bytes"] == pytest.approx(sum(r[k] for k in parts))
        assert r["oom"] == (r["peak_bytes"] > r["capacity_bytes"]) and r["capacity_bytes"] == 81559 * 2**20


def test_interleaved_counts_chunks(capsys):
    t = _json(capsys, "mixtral-8x7b-64gpu")
    p, v = 4, 2
    # Megatron warm-up 2(p-s-1) + (v-1)p, plus the one in flight
    assert [r["inflight"] for r in t["stages"]] == [2 * (p - s - 1) + (v - 1) * p + 1
                                                    for s in range(p)]
    assert [r["layers"] for r in t["stages"]] == [8] * 4  # 32 layers / 4 stages, 2 chunks of 4
    acts = [r["activations"] for r in t["stages"]]
    assert acts == sorted(acts, reverse=True)


def test_oom_flag(capsys):
    t = _json(capsys, "hot-expert", "--set", "schedule.seq_len=65536")
    assert t["stages"][0]["oom"] is True and t["stages"][0]["peak_bytes"] > 80e9


@pytest.mark.parametrize("argv, field", [
    (["hot-expert", "--set", "parallel.ep=3"], "parallel.ep"),
    (["hot-expert", "--set", "parallel.pp=3"], "parallel.pp"),
    (["hot-expert", "--set", "parallel.bogus=1"], "parallel.bogus"),
    (["hot-expert", "--set", "model.preset=nope"], "model.preset"),
    (["mixtral-8x7b-64gpu", "--set", "schedule.microbatches=6"], "schedule.microbatches"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, field):
    assert main(["memory", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moesim memory: error: ") and field in err[0]


def test_malformed_yaml_exit_2(capsys, tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nparallel: {tp: 1\n")
    assert main(["memory", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(p) in err[0] and "line 3" in err[0] and "valid YAML" in err[0]
