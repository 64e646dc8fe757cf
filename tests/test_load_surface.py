"""The step-cost surface refines its decode grid where interpolation is wrong (issue 23).

A decode step jumps where a micro-batch's GEMMs reach the kernel catalog's first row
(m = 64 tokens: priced by the roofline below it, by DeepGEMM's published rates from it):
on DeepSeek-V3 decode, 126 -> 128 requests per GPU. Here the engine is replaced by a
function worked by hand with that shape, so the rows the refinement adds can be listed.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from moesim.traffic import surface
from moesim.traffic.surface import EngineStepCosts


def step_ms(b: float, ctx: float) -> float:
    """Linear in the batch with a 5 ms jump from 126 to 128 requests, plus KV reads."""
    return 20.0 + 0.4 * b + (5.0 if b >= 128 else 0.0) + 1e-4 * b * ctx / 64


class HandSurface(EngineStepCosts):
    def direct_decode(self, batch, context):
        self.calls.append((batch, context))
        return step_ms(batch, context) * 1e-3

    def direct_prefill(self, prompts, prompt_len):
        return 1e-3 * prompts * prompt_len


def _surface(**kw) -> HandSurface:
    HandSurface.calls = []
    cfg = SimpleNamespace(tp=1, microbatches=2)
    return HandSurface(None, cfg, cache=False, **kw)


def test_rows_are_added_down_to_the_jump():
    s = _surface()
    # the default grid ... 64, 128, 256 is linear in each interval except [64, 128]:
    # its midpoints 96, 112, 120, 124, 126 each miss by more than 0.5 %, then [126, 128]
    # has no batch between them (multiples of tp x 2 micro-batches)
    assert s.batches.tolist() == [1, 2, 4, 8, 16, 32, 64, 96, 112, 120, 124, 126, 128, 256]
    for b in range(2, 257, 2):           # every batch the deployment runs: exact
        for c in (128, 3000, 16384):
            assert s.decode_s(b, c) == pytest.approx(step_ms(b, c) * 1e-3, rel=1e-12)


def test_probes_are_the_smallest_and_largest_context():
    s = _surface()
    probes = {(b, c) for b, c in HandSurface.calls if b not in surface.BATCHES}
    assert {c for _, c in probes} == {128.0, 16384.0, 1024.0, 4096.0}
    # midpoints that matched (e.g. 48 in [32, 64]) were simulated at the two ends only
    assert {c for b, c in probes if b == 48} == {128.0, 16384.0}
    assert 48 not in s.batches


def test_explicit_grid_is_used_as_given():
    s = _surface(batches=[2, 64, 256])
    assert s.batches.tolist() == [2, 64, 256]
    # the jump then sits inside [64, 256]: the interpolation misses 126 by over 2 %
    assert s.decode_s(126, 128) > step_ms(126, 128) * 1e-3 * 1.02


def test_no_refinement_when_linear():
    s = _surface(refine=0.5)      # a 50 % tolerance: nothing added
    assert s.batches.tolist() == [float(b) for b in surface.BATCHES]
    assert isinstance(s.decode, np.ndarray) and s.decode.shape == (9, 4)


def kinked_ms(b: float, ctx: float) -> float:
    """Linear in the batch; in the context flat up to 6,000 tokens, then 0.1 us per
    token and request (attention outlasting the overlapped exchange)."""
    return 20.0 + 0.4 * b + max(0.0, ctx - 6000) * 1e-4 * b


class KinkSurface(HandSurface):
    def direct_decode(self, batch, context):
        return kinked_ms(batch, context) * 1e-3


def test_contexts_are_refined_at_a_kink():
    # at 256 requests: 122.4 ms up to 6,000 tokens, + 0.0256 ms per token beyond.
    # [4096, 16384]: midpoint 10240 interpolates to 255.3 ms, is 230.9: a column;
    # [4096, 10240] -> 7168 (176.6 vs 152.3); [4096, 7168] -> 5632 (137.4 vs 122.4);
    # [5632, 7168] -> 6400 (137.4 vs 132.6); [5632, 6400] -> 6016 (127.5 vs 122.8);
    # the rest are linear or within 0.5 % (5824: 122.6 vs 122.4)
    cfg = SimpleNamespace(tp=1, microbatches=2)
    s = KinkSurface(None, cfg, cache=False)
    assert s.batches.tolist() == [float(b) for b in surface.BATCHES]   # linear in batch
    assert s.contexts.tolist() == [128, 1024, 4096, 5632, 6016, 6400, 7168, 10240, 16384]
    for c in (6400, 8000, 12000):
        assert s.decode_s(256, c) == pytest.approx(kinked_ms(256, c) * 1e-3, rel=1e-12)


@pytest.mark.parametrize("nb,nc", [(5, 7), (1, 4), (4, 1), (1, 1)])
def test_decode_s_many_equals_decode_s_float_for_float(nb, nc):
    # the serving loop prices a skipped run of decode steps with decode_s_many: it must
    # give decode_s's floats exactly, inside the grid, on its points and beyond it
    rng = np.random.default_rng(nb * 10 + nc)
    costs = EngineStepCosts.__new__(EngineStepCosts)
    costs.batches = np.cumsum(rng.integers(1, 64, nb)).astype(float)
    costs.contexts = np.cumsum(rng.integers(64, 4096, nc)).astype(float)
    costs.decode = rng.uniform(0.01, 0.2, (nb, nc))
    ctx = np.concatenate([rng.uniform(0, costs.contexts[-1] * 1.5, 200), costs.contexts,
                          [0.0, 1.0]])
    for b in [0, 1, *costs.batches.astype(int), int(costs.batches[-1]) + 17, 3]:
        many = costs.decode_s_many(b, ctx)
        assert many.shape == ctx.shape
        assert [float(x) for x in many] == [costs.decode_s(b, float(c)) for c in ctx]
