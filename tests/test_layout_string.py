"""Megatron-Core pipeline layouts (moesim.schedule.layout_string): each named piece on its
stage, worked out by hand."""

from __future__ import annotations

import pytest

from moesim.errors import InputError
from moesim.program.build import build_step
from moesim.scenario import load_scenario
from moesim.schedule.layout_string import expand, layout_chunks, uneven_chunks
from moesim.wiring import resolve, simulate

TOY2 = ["parallel.pp=2", "parallel.ep=1", "schedule.microbatches=2"]


def test_deepseek_layout_string_by_hand():
    # "Et*3|(tt|)*29m|L" = Ettt | tt x 29 | m | L: 32 stages, PP16 x VPP2
    assert expand("Et*3|(tt|)*2m|L") == "Ettt|tt|tt|m|L"
    c = layout_chunks("Et*3|(tt|)*29m|L", layers=61, mtp=1, n_stages=32)
    assert c[0] == range(0, 3) and c[1] == range(3, 5) and c[29] == range(59, 61)
    assert c[30] == range(61, 62)          # the MTP layer, index layers + 0
    assert c[31] == range(61, 61)          # the loss alone
    # virtual stage i = chunk·pp + rank: the MTP stage is pipeline rank 14's second chunk
    assert divmod(30, 16) == (1, 14)


@pytest.mark.parametrize("bad,n,why", [
    ("Et|t|L", 2, "2 stages"), ("tE|tL", 2, "E (the embedding)"), ("Et|tLt", 2, "L (the loss)"),
    ("Et|L", 2, "2 t"), ("Et|mtL", 2, "after the last t"), ("Et|tq|L", 3, "separated by |")])
def test_bad_layouts_name_the_field(bad, n, why):
    with pytest.raises(InputError) as ei:
        layout_chunks(bad, layers=2, mtp=1 if "m" in bad else 0, n_stages=n)
    assert ei.value.field == "parallel.pipeline_layout" and why in str(ei.value)


def test_uneven_first_and_last_stages():
    # 10 layers, pp 4: first 1, last 3, the middle two share 6
    assert [len(r) for r in uneven_chunks(10, 4, 1, 1, 3)] == [1, 3, 3, 3]
    # interleaved: each rank's layers split over its 2 chunks, chunk-major order
    c = uneven_chunks(8, 2, 2, 2, 6)
    assert [list(r) for r in c] == [[0], [1, 2, 3], [4], [5, 6, 7]]
    assert [len(r) for r in uneven_chunks(10, 4, 1, 1, None)] == [1, 3, 3, 3]
    with pytest.raises(InputError):
        uneven_chunks(10, 4, 1, 2, None)    # 8 left over 3 stages does not divide


def _programs(layout: str):
    scn = load_scenario("toy-cpu", [*TOY2, f"parallel.pipeline_layout={layout}"])
    return build_step(resolve(scn)).programs


def test_layout_puts_each_piece_on_its_stage():
    # toy: 2 layers, 2 ranks, pp 2 -> rank 0 is stage 0, rank 1 stage 1
    progs = _programs("E|ttL")
    names0 = {op.name for op in progs[0]}
    names1 = {op.name for op in progs[1]}
    assert "fwd.embedding" in names0 and not any(op.layer >= 0 and op.kind == "compute"
                                                 and op.name != "opt.adam"
                                                 for op in progs[0])
    assert {op.layer for op in progs[1] if op.name == "fwd.attn" or op.name == "fwd.router"} \
        >= {0, 1}
    assert "fwd.lm_head" in names1 and "fwd.embedding" not in names1
    even = _programs("Et|tL")
    assert {op.layer for op in even[0] if op.name == "fwd.router"} == {0}


def test_layout_may_give_stages_no_decoder_layer():
    # 2 layers on pp 2 x vpp 2 = 4 virtual stages: without a layout too many chunks; with
    # "E|t|t|L" (the embedding and the loss alone, as xtuner's Qwen3-235B PP32 VPP3 split
    # of 94 layers over 96 stages) each stage's pieces are laid out as written
    over = ["parallel.pp=2", "parallel.ep=1", "parallel.vpp=2", "schedule.kind=interleaved",
            "schedule.microbatches=4"]
    with pytest.raises(InputError) as ei:
        resolve(load_scenario("toy-cpu", over))
    assert ei.value.field.endswith("parallel.vpp")
    res = resolve(load_scenario("toy-cpu", [*over, "parallel.pipeline_layout=E|t|t|L"]))
    progs = build_step(res).programs
    # rank 0 holds virtual stages 0 (E) and 2 (t: layer 1); rank 1 stages 1 (layer 0), 3 (L)
    assert {op.layer for op in progs[0] if op.name == "fwd.attn"} == {1}
    assert {op.layer for op in progs[1] if op.name == "fwd.attn"} == {0}
    assert "fwd.embedding" in {op.name for op in progs[0]}
    assert "fwd.lm_head" in {op.name for op in progs[1]}
    # and both engines run those stages to the same step time
    steps = [simulate(resolve(load_scenario("toy-cpu", [
        *over, "parallel.pipeline_layout=E|t|t|L", f"engine.mode={m}"]))).summary[
        "step_time_s"] for m in ("exact", "fast")]
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)
