"""moesim memory includes the most loaded rank's larger token buffers, so its peak is
the run's (issue 12 item 19)."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.program.routed_memory import stage_max_rows
from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate


def _table(capsys, scenario, *sets):
    args = ["memory", scenario, "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("scenario,sets", [
    ("hot-expert", ()),                                        # 34.55 GB, was 34.25
    ("mixtral-8x7b-64gpu", ("model.layers=8", "schedule.microbatches=4")),   # PP4, zipf
])
def test_memory_peak_equals_the_run_peak(capsys, scenario, sets):
    t = _table(capsys, scenario, *sets)
    run = simulate(scenario, list(sets), record_series=False)
    assert t["peak_bytes_max"] == run.summary["memory"]["peak_bytes_max"]
    per_rank = {r["rank"]: r for r in run.summary["memory"]["per_rank"]}
    for row in t["stages"]:
        mx = row["max_rank"]
        assert mx["how"] == "routed"
        assert mx["peak_bytes"] == per_rank[mx["rank"]]["peak_bytes"]
        assert mx["token_buffers"] >= row["token_buffers"]


def test_hot_expert_rank_row_shows_larger_buffers(capsys):
    assert main(["memory", "hot-expert"]) == 0
    out = capsys.readouterr().out
    hot = [ln for ln in out.splitlines() if ln.startswith("r3 ")]
    peak = float(out.split("peak over all ranks: ")[1].split()[0])
    assert hot and f"{peak:.2f}" in hot[0]
    # a fused attention kernel keeps no score matrix (issue 20.11): asking for a
    # materialising one adds 4 Mixtral layers x (5·32·4096·4096 - 4·32·4096) bytes
    assert main(["memory", "hot-expert", "--set", "memory.attention=materialized"]) == 0
    out = capsys.readouterr().out
    mat = float(out.split("peak over all ranks: ")[1].split()[0])
    assert mat - peak == pytest.approx(4 * (5 * 32 * 4096**2 - 4 * 32 * 4096) / 2**30, abs=0.011)


def test_expected_shares_beyond_the_budget(monkeypatch):
    import moesim.program.routed_memory as memory_routed

    res = resolve(load_scenario("hot-expert", []))
    monkeypatch.setattr(memory_routed, "ROUTE_BUDGET", 0)
    (row,) = stage_max_rows(res).values()
    # expert 3 takes 40 % of the top-2 assignments: 0.8 of the 8 × 4096 tokens of the EP
    # group, every micro-batch: rank 3 receives 26,214.4 tokens per MoE layer
    assert row["how"] == "expected" and row["rank"] == 3
    assert row["received"] == [26214] * 4
