"""The one engine interface: both engines behind ``moesim.engine.api.simulate``, chosen
by ``engine.mode``, reporting the same summary keys."""

from __future__ import annotations

import pytest

from moesim.engine.api import ENGINES
from moesim.errors import InputError
from moesim.wiring import resolve_path, simulate

TOY = ["cluster.nodes=1", "model.layers=2", "schedule.microbatches=2"]


def test_registry_names_both_engines():
    assert sorted(ENGINES) == ["exact", "fast"]


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_engine_mode_picks_the_engine(mode):
    r = simulate("hot-expert", [*TOY, f"engine.mode={mode}"])
    assert (r.summary.get("engine") == "fast") == (mode == "fast")
    assert r.step_time_s > 0
    # every rank's categories sum to the step (the shared summary's invariant)
    for row in r.summary["per_rank"]:
        assert sum(row["breakdown_s"].values()) == pytest.approx(r.step_time_s, rel=1e-9)


def test_both_engines_report_the_same_keys():
    res = resolve_path("hot-expert", TOY)
    a = simulate(res, engine="exact")
    b = simulate(res, engine="fast")
    common = set(a.summary) - {"engine"}
    assert common <= set(b.summary)
    assert set(a.summary["experts"]) == set(b.summary["experts"])
    assert a.summary["experts"] == b.summary["experts"]     # same routing, same seeds
    assert a.summary["memory"] == b.summary["memory"]


def test_unknown_engine_names_the_field():
    with pytest.raises(InputError) as e:
        simulate("hot-expert", TOY, engine="warp")
    assert "engine.mode" in str(e.value)


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_progress_counts_every_item_of_a_dualpipe_step(mode):
    seen = []
    simulate("hot-expert", ["model.layers=2", "schedule.microbatches=4", "parallel.pp=2",
                            "parallel.ep=4",
                            "schedule.kind=dualpipe", f"engine.mode={mode}"],
             progress=lambda what, n: seen.append((what, n)))
    assert seen[0][0] == "built" and seen[0][1] > 0
    assert sum(n for what, n in seen[1:]) <= seen[0][1]
