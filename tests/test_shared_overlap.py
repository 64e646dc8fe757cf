"""Shared experts beside the dispatcher (overlap.shared_expert, Megatron-Core's
moe_shared_expert_overlap): fc1+activation under the dispatch, fc2 under the combine
(backward mirrored); each layer pass shrinks by min(shared part, all-to-all), worked
out on the toy model with one shared expert on two ranks; both engines agree."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.engine.fast.engine import simulate_fast
from moesim.errors import InputError
from moesim.model import PRESETS, costs
from moesim.program.shared_overlap import split
from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate

# padded to capacity: every expert computes exactly its capacity, so both ranks reach each
# exchange together (no stall) and the saving is per exchange, by hand
SHARED = ["model.n_shared_experts=1", "model.shared_ffn=1024", "engine.mode=exact",
          "routing.capacity_factor=1.0", "routing.pad_to_capacity=true"]


def _run(*sets, fast=False, base=SHARED):
    res = resolve(load_scenario("toy-cpu", [*base, *sets]))
    return res, (simulate_fast(res) if fast else simulate(res))


def _spans(result, rank, name):
    return sorted((s for s in result.spans if s.rank == rank and s.name == name),
                  key=lambda s: (s.layer, s.microbatch, s.start_s))


def test_split_puts_fc1_and_act_under_the_first_all_to_all():
    spec = dataclasses.replace(PRESETS["toy"], n_shared_experts=1, shared_ffn=1024)
    fwd = costs.shared_expert_kernels(spec, 128, 1, "fwd")
    a, b = split(fwd, "fwd")
    assert [k.name for k in a] == ["shared_gemm", "shared_act"]
    assert [k.name for k in b] == ["shared_gemm"]
    bwd = costs.shared_expert_kernels(spec, 128, 1, "bwd")
    a, b = split(bwd, "bwd")     # fc2's dgrad+wgrad under the combine's backward
    assert [k.name for k in a] == ["shared_gemm_dgrad", "shared_gemm_wgrad"]
    assert b[0].name == "shared_act_bwd" and len(a) + len(b) == len(bwd)
    assert sum(k.flops for k in a + b) == sum(k.flops for k in bwd)


def test_each_pass_shrinks_by_the_smaller_of_shared_part_and_all_to_all():
    _, base = _run()
    res, ov = _run("overlap.shared_expert=true")
    for phase, first, second in (("fwd", "dispatch", "combine"),
                                 ("bwd", "combine", "dispatch")):
        # the program without overlap: the whole shared expert inside the unpermute op
        for rank in (0, 1):
            p1, p2 = (_spans(ov, rank, f"{phase}.shared_fc{i}") for i in (1, 2))
            pa = p1 if phase == "fwd" else p2     # the part beside the first a2a
            pb = p2 if phase == "fwd" else p1
            for x, y in ((pa, _spans(ov, rank, f"{phase}.{first}")),
                         (pb, _spans(ov, rank, f"{phase}.{second}"))):
                comm = [s for s in y if s.kind.startswith("ep_")]
                assert len(x) == len(comm) > 0
                for s, c in zip(x, comm, strict=True):
                    # both start when the previous compute ends; the next op waits for both
                    nxt = [t for t in ov.spans if t.rank == rank and t.stream == "compute"
                           and t.start_s >= max(s.end_s, c.end_s) - 1e-15
                           and t.name != s.name]
                    assert min(t.start_s for t in nxt) == pytest.approx(
                        max(s.end_s, c.end_s), abs=1e-12)
    # per layer and pass: base - overlapped = min(part, a2a) for each part (no stalls on
    # two symmetric ranks: both wait for the same exchange)
    saved = 0.0
    for phase, names in (("fwd", ("dispatch", "combine")), ("bwd", ("combine", "dispatch"))):
        for i, a2a in enumerate(names):
            part = "shared_fc1" if (phase == "fwd") == (i == 0) else "shared_fc2"
            for s, c in zip(_spans(ov, 0, f"{phase}.{part}"),
                            [x for x in _spans(base, 0, f"{phase}.{a2a}")
                             if x.kind.startswith("ep_")], strict=True):
                saved += min(s.end_s - s.start_s, c.end_s - c.start_s)
    assert saved > 0
    assert base.step_time_s - ov.step_time_s == pytest.approx(saved, rel=1e-6)
    # model FLOPs unchanged: the shared experts still run, beside the exchange
    assert ov.summary["model_flops"] == pytest.approx(base.summary["model_flops"], rel=1e-12)


@pytest.mark.parametrize("base", [SHARED, SHARED[:3]], ids=["padded", "stalls"])
def test_both_engines_agree_with_shared_overlap(base):
    _, ex = _run("overlap.shared_expert=true", base=base)
    _, fa = _run("overlap.shared_expert=true", fast=True, base=base)
    assert fa.step_time_s == pytest.approx(ex.step_time_s, rel=1e-9)
    for k, v in ex.summary["breakdown_s"].items():
        assert fa.summary["breakdown_s"][k] == pytest.approx(v, rel=1e-6, abs=1e-12), k


def test_refused_with_schedules_that_pair_micro_batches():
    with pytest.raises(InputError) as ei:
        load_scenario("toy-cpu", [*SHARED, "overlap.shared_expert=true",
                                  "overlap.kind=a2a-1f1b"])
    assert ei.value.field.endswith("overlap.shared_expert")
