"""The rule benchmarks/a2a_overlap_rate.py tests, worked out by hand: an all-to-all needing
``work`` seconds progresses at rate r while the compute stream is busy and at its own rate
while it waits; and r from the PR 5094 card's profile split."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import a2a_overlap_rate as bench  # noqa: E402


class _Base:
    def __init__(self, ch, s):
        pass


def _end(r, busy, start, work):
    pair = bench.rated_pair(_Base, r)(None, 0)
    pair.busy = [(np.array([a]), np.array([e])) for a, e in busy]
    return float(pair._end(bench.Pending(np.array([start]), np.array([work])))[0])


@pytest.mark.parametrize("r,busy,start,work,end", [
    # no compute: its own time
    (0.5, [], 0.0, 2.0, 2.0),
    # 1 s alone (1 s of work), then busy 1..3 at 0.5 (the other 1 s): ends at 3
    (0.5, [(1.0, 3.0)], 0.0, 2.0, 3.0),
    # at 0.25 the busy 2 s do 0.5 s; the last 0.5 s alone after 3: 3.5
    (0.25, [(1.0, 3.0)], 0.0, 2.0, 3.5),
    # started inside a busy interval: 1..3 at 0.5 is 1 s, 3..4 idle 1 s: ends at 4
    (0.5, [(0.0, 3.0), (5.0, 6.0)], 1.0, 2.0, 4.0),
    # two busy intervals with a gap: 0..1 at 0.5 (0.5), 1..2 alone (1), 2..3 at 0.5 (0.5)
    (0.5, [(0.0, 1.0), (2.0, 4.0)], 0.0, 2.0, 3.0),
    # busy intervals over before it starts do not count
    (0.5, [(0.0, 1.0)], 2.0, 1.0, 3.0),
])
def test_progress_at_r_under_compute(r, busy, start, work, end):
    assert _end(r, busy, start, work) == pytest.approx(end)


def test_rate_from_the_card_split():
    # without the overlap 9.079 ms of the kernels ran beside compute, 0.11 % of them: 8.25 s;
    # with it 3.959 s, 36.55 % of them: 10.83 s, the other 6.87 s alone
    alone = 9.079e-3 / 0.0011
    exposed = 3.958997 / 0.3655 - 3.958997
    assert bench.ALONE_S == pytest.approx(alone)
    assert bench.EXPOSED_S == pytest.approx(exposed)
    assert bench.R == pytest.approx((alone - exposed) / 3.958997)
    assert 0.34 < bench.R < 0.36
    # the work that ran alone without the overlap is done, with it, alone or at r beside
    assert bench.EXPOSED_S + bench.R * bench.BESIDE_S == pytest.approx(bench.ALONE_S)


TOY = """\
name: a2a-rate-toy
seed: 0
cluster:
  topology: pcie-8gpu
  params: {gpus_per_node: 2, pcie_switches_per_cpu: 1, cpus: 1, pcie_GBps: 2.0,
           pcie_latency_us: 0.0}
  device: H100
  network: analytical
model: {preset: toy, layers: 2, first_dense_layers: 0, vocab: 8}
routing: {kind: uniform}
parallel: {tp: 1, pp: 1, ep: 2}
schedule: {kind: 1f1b, microbatches: 4, micro_batch_size: 1, seq_len: 256}
compute: {kind: roofline, launch_overhead_us: 0}
overlap: {dp_overlap: true, kind: a2a-1f1b}
engine: {mode: fast}
"""


def _toy_step(tmp_path, pair_cls) -> dict:
    from moesim.engine.fast import pairs
    from moesim.wiring import simulate
    path = tmp_path / "toy.yaml"
    path.write_text(TOY)
    keep = pairs._Pair
    pairs._Pair = pair_cls(keep)
    try:
        s = simulate(path, [], record_series=False).summary
    finally:
        pairs._Pair = keep
    b = s["breakdown_s"]
    return {"step": s["step_time_s"], "a2a": b["ep_dispatch"] + b["ep_combine"]}


def _unslowed(base):
    class Unslowed(base):       # the SM share off, nothing else changed
        def __init__(self, ch, s):
            super().__init__(ch, s)
            self.f = 0.0
    return Unslowed


def test_rate_one_is_the_engine_with_compute_unslowed(tmp_path):
    # at r = 1 an all-to-all ends start + its own time whatever runs beside it, so the
    # lazily settled ends give the step of the unchanged pair with the SM share off
    one = _toy_step(tmp_path, lambda b: bench.rated_pair(b, 1.0))
    ref = _toy_step(tmp_path, _unslowed)
    assert one["step"] == pytest.approx(ref["step"], rel=1e-12)
    assert one["a2a"] == pytest.approx(ref["a2a"], rel=1e-9, abs=1e-15)


def test_a_slower_rate_never_shortens_the_step(tmp_path):
    steps = [_toy_step(tmp_path, lambda b, r=r: bench.rated_pair(b, r))["step"]
             for r in (1.0, 0.5, 0.1)]
    assert steps[0] <= steps[1] <= steps[2]
    assert steps[2] > steps[0]          # the toy's all-to-alls are not negligible
