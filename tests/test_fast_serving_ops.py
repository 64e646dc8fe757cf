"""Both engines price each compute op of a serving decode step alike (issue 37).

A serving step on the fast engine (:func:`moesim.engine.fast.forward.simulate_forward`,
two micro-batches interleaved) must run the exact serving builder's ops
(:class:`moesim.serve.program.ServeBuilder` on :meth:`moesim.program.build.Builder.moe_ops`)
with the same kernels: the router with the scenario's CUDA-graph modules, the unpermute
without the shared experts where they run beside the all-to-alls, and the shared parts
themselves. Each op's seconds on rank 0 (the sum of its kernels' prices over the step)
are compared between the exact engine's op programs and the fast engine's spans, and
worked out from the recipe (:mod:`moesim.program.recipe`) by hand.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import yaml

from moesim.engine.fast.forward import simulate_forward
from moesim.program import recipe
from moesim.serve.config import serving_scenario
from moesim.serve.program import ServeBuilder, build_serve_step
from moesim.serve.run import resolve_serve, simulate_serve
from moesim.wiring import resolve

M = 2          # micro-batches (two_microbatch: the fast engine's interleaved path)
MOE = 1        # MoE layers (2 layers, the first dense)


def _serve(tmp_path):
    """16 GPUs of two DGX H100 nodes, EP16 over NCCL (its all-to-alls cross the NICs and
    hold no SMs, so a span lasts its kernels' seconds), 16 experts top-2 and one shared
    expert, decode replayed from CUDA graphs."""
    data = {"name": "ops", "seed": 1,
            "cluster": {"topology": "dgx-h100", "nodes": 2},
            "model": {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": 128,
                      "vocab": 4096, "attention": "mha", "dense_ffn": 4096, "n_experts": 16,
                      "top_k": 2, "expert_ffn": 1024, "first_dense_layers": 1,
                      "n_shared_experts": 1, "shared_ffn": 2048},
            "compute": {"model": "roofline"},
            "serve": {"phase": "decode", "batch_per_gpu": 8, "context": 1024, "ep": 16,
                      "two_microbatch": True, "cuda_graphs": True, "ep_backend": "nccl"},
            "engine": {"mode": "fast"}}
    p = tmp_path / "ops.yaml"
    p.write_text(yaml.safe_dump(data))
    return resolve_serve(str(p))


def _with(res, **overlap):
    """``res`` with its serving step's overlap fields replaced, resolved again."""
    scn = res.scenario
    return resolve(dataclasses.replace(scn, overlap=dataclasses.replace(scn.overlap,
                                                                          **overlap)))


def _exact_ops(res, cfg) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for op in build_serve_step(res, cfg).programs[0]:
        if op.kind == "compute":
            out[op.name] += op.duration_s
    return dict(out)


def _fast_ops(res, cfg) -> dict[str, float]:
    result, _ = simulate_forward(res, ServeBuilder(res, cfg), span_ranks=1)
    out: dict[str, float] = defaultdict(float)
    for sp in result.spans:
        if sp.rank == 0 and sp.kind == "compute":
            out[sp.name] += sp.end_s - sp.start_s
    return dict(out)


def _price(res, kernels) -> float:
    return sum(res.compute.time_s(k) for k in kernels)


def _by_hand(res, cfg) -> dict[str, float]:
    """Seconds of the MoE block's compute ops on rank 0 over the step, from the recipe:
    M micro-batches x MOE layers x the op's kernels priced one by one."""
    b = ServeBuilder(res, cfg).builder
    spec, ov = b.spec, res.scenario.overlap
    sent = b.ep_tokens * spec.top_k
    side = ov.shared_expert
    ops = {"fwd.router": recipe.router(spec, b.ep_tokens, sent, "fwd", ov.cuda_graphs),
           "fwd.unpermute": recipe.expert_post(spec, sent, b.tokens, b.tp, "fwd", side)}
    if side:
        for part, name in enumerate(("fwd.shared_fc1", "fwd.shared_fc2")):
            ops[name] = recipe.shared_part(spec, b.tokens, b.tp, "fwd", part)
    return {name: M * MOE * _price(res, ks) for name, ks in ops.items()}


def _check(res, cfg) -> dict[str, float]:
    exact, fast = _exact_ops(res, cfg), _fast_ops(res, cfg)
    assert set(exact) == set(fast)
    for name in exact:
        assert fast[name] == pytest.approx(exact[name], rel=1e-12), name
    for name, want in _by_hand(res, cfg).items():
        assert exact[name] == pytest.approx(want, rel=1e-12), name
    return exact


def test_decode_step_ops_equal_on_both_engines(tmp_path):
    """The shipped serving path: the whole step replayed from a CUDA graph (launches at
    the graph floor), no module graphs, shared experts inside the unpermute."""
    res, cfg = _serve(tmp_path)
    assert res.scenario.overlap.cuda_graphs == ("step",)
    assert not res.scenario.overlap.shared_expert
    ops = _check(res, cfg)
    assert "fwd.shared_fc1" not in ops
    assert ops["fwd.router"] > 0 and ops["fwd.unpermute"] > 0


def test_module_graphs_and_shared_experts_beside_the_all_to_alls(tmp_path):
    """A forward step whose overlap graphs the router and permutation and runs the shared
    experts beside the all-to-alls: the fast engine's interleaved micro-batches price the
    router graphed, the unpermute without the shared experts, and the shared parts, as
    the exact builder does (it priced the router eagerly and kept the shared experts in
    the unpermute before)."""
    res, cfg = _serve(tmp_path)
    eager = _check(res, cfg)
    res2 = _with(res, cuda_graphs=("step", "moe_router", "moe_preprocess"),
                 shared_expert=True)
    ops = _check(res2, cfg)
    assert ops["fwd.router"] != pytest.approx(eager["fwd.router"])   # one graph launch
    assert ops["fwd.unpermute"] < eager["fwd.unpermute"]             # no shared experts
    assert ops["fwd.shared_fc1"] > 0 and ops["fwd.shared_fc2"] > 0
    # the shared experts moved out of the unpermute, not lost
    assert (ops["fwd.unpermute"] + ops["fwd.shared_fc1"] + ops["fwd.shared_fc2"]
            == pytest.approx(eager["fwd.unpermute"], rel=1e-12))


def _step(res, cfg, mode: str) -> tuple[float, dict]:
    scn = res.scenario
    r = resolve(dataclasses.replace(scn, engine=dataclasses.replace(scn.engine, mode=mode)))
    s = simulate_serve(r, cfg, spans=False).summary
    return s["step_time_s"], s["breakdown_s"]


def test_step_and_categories_equal_on_both_engines(tmp_path):
    """The whole step, shared experts in the unpermute, beside the all-to-alls, and with
    the router and permutation graphed too: the same step and categories on both engines.
    Beside, the shared parts hide the exposed all-to-alls of the inline step."""
    res, cfg = _serve(tmp_path)
    cases = {"inline": res, "beside": _with(res, shared_expert=True),
             "graphs": _with(res, shared_expert=True,
                             cuda_graphs=("step", "moe_router", "moe_preprocess"))}
    steps = {}
    for name, r in cases.items():
        exact, fast = _step(r, cfg, "exact"), _step(r, cfg, "fast")
        assert fast[0] == pytest.approx(exact[0], rel=1e-9), name
        for k in ("compute", "ep_dispatch", "ep_combine", "stall"):
            assert fast[1][k] == pytest.approx(exact[1][k], rel=1e-9, abs=1e-12), (name, k)
        steps[name] = exact
    inline, beside = steps["inline"], steps["beside"]
    assert inline[1]["ep_dispatch"] + inline[1]["ep_combine"] > 0     # exposed inline
    assert beside[1]["ep_dispatch"] + beside[1]["ep_combine"] == 0    # hidden beside
    assert beside[0] < inline[0]
    assert beside[1]["compute"] == pytest.approx(inline[1]["compute"], rel=1e-12)


@pytest.mark.parametrize("backend", ["nccl", "deepep"])
def test_one_microbatch_shared_experts_beside(tmp_path, backend):
    """One micro-batch: the shared parts still run beside the all-to-alls on both engines
    (the exact serving builder moves the exchanges to their own stream for them, as the
    training builder does), hiding part of the exchanges. Under DeepEP's normal kernels
    (holding SMs) the steps agree but not the split: the exact engine counts the shared
    part's slowdown as compute, the fast chain's ``_a2a_beside`` as exposed exchange."""
    res, cfg = _serve(tmp_path)
    cfg = dataclasses.replace(cfg, two_microbatch=False, ep_backend=backend)
    one = resolve(serving_scenario(res.scenario, cfg))
    assert not one.scenario.overlap.ep_comm_overlap
    got = {}
    for side in (False, True):
        r = _with(one, shared_expert=side)
        exact, fast = _step(r, cfg, "exact"), _step(r, cfg, "fast")
        assert fast[0] == pytest.approx(exact[0], rel=1e-9), side
        for k in ("compute", "ep_dispatch", "ep_combine", "stall"):
            if backend == "nccl" or not side:
                assert fast[1][k] == pytest.approx(exact[1][k], rel=1e-9, abs=1e-12), (side, k)
        got[side] = exact
    assert got[True][0] < got[False][0]
    if backend == "nccl":
        assert got[True][1]["compute"] == pytest.approx(got[False][1]["compute"], rel=1e-12)
