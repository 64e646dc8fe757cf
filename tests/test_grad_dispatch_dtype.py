"""``routing.grad_dispatch_dtype``: the backward's dispatch (the combine's gradient, to the
experts) in bf16 (default) or in fp8, as DeepSeek-V3 sends it (report §3.3.3)."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.program.ep_transfers import EPTransfers
from moesim.scenario.read import apply_overrides, build_scenario
from moesim.wiring import simulate


class _Pairwise:
    """An NCCL backend as :class:`EPTransfers` reads it."""

    deepep = False

    def __init__(self, grad_dispatch: str) -> None:
        self.dtypes = {"grad": "bf16", "grad_dispatch": grad_dispatch}


class _Route:
    dispatch_tokens = np.array([[0, 3], [5, 0]])
    combine_tokens = np.array([[0, 5], [3, 0]])


@pytest.mark.parametrize(("dtype", "per_token"), [("bf16", 512), ("fp8", 256 + 8)])
def test_pairwise_backward_bytes_by_hand(dtype, per_token):
    # hidden 256: bf16 2 x 256 = 512 B a token; fp8 256 + one 4-byte scale per 128 = 264 B;
    # the dispatch's gradient (a combine back to the tokens' GPUs) stays bf16
    ep = EPTransfers(ep_backend=_Pairwise(dtype), hidden=256, gpus_per_node=8,
                     a2a_algo="direct")
    to_tokens, to_experts = ep.exchange((0, 1), _Route(), 0, 0, "bwd")
    assert np.array_equal(to_experts.matrix, _Route.dispatch_tokens * per_token)
    assert np.array_equal(to_tokens.matrix, _Route.combine_tokens * 512)


def _ep_spans(overrides):
    r = simulate("hot-expert", ["model.layers=1", "schedule.microbatches=1",
                                "parallel.ep_backend.kind=deepep", "engine.mode=fast",
                                "routing.dispatch_dtype=fp8", *overrides])
    return {s.name: s.end_s - s.start_s for s in r.spans
            if s.kind in ("ep_dispatch", "ep_combine") and s.rank == 0}, r


def test_deepep_backward_dispatch_in_fp8_is_the_forward_dispatch_plan():
    off, r_off = _ep_spans([])
    on, r_on = _ep_spans(["routing.grad_dispatch_dtype=fp8"])
    # the same routed micro-batch, both fp8 DeepEP dispatches: one plan, one time
    assert on["bwd.combine"] == pytest.approx(on["fwd.dispatch"], rel=1e-12)
    # bf16 carries 2 x 4096 B a token where fp8 carries 4096 + 128: about twice the time
    assert off["bwd.combine"] > 1.8 * on["bwd.combine"]
    # the other three directions do not move
    for k in ("fwd.dispatch", "fwd.combine", "bwd.dispatch"):
        assert on[k] == pytest.approx(off[k], rel=1e-12), k
    assert r_on.step_time_s < r_off.step_time_s


def _scenario(overrides):
    return build_scenario(apply_overrides({"name": "x", "cluster": {"topology": "dgx-h100"},
                                           "model": {"preset": "mixtral-8x7b"}}, overrides))


def test_echoed_only_when_fp8():
    assert "grad_dispatch_dtype" not in _scenario([]).to_dict()["routing"]
    on = _scenario(["routing.grad_dispatch_dtype=fp8"]).to_dict()["routing"]
    assert on["grad_dispatch_dtype"] == "fp8"


def test_bad_value_names_the_field():
    with pytest.raises(InputError, match="routing.grad_dispatch_dtype"):
        _scenario(["routing.grad_dispatch_dtype=fp4"])
