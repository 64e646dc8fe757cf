"""Pipeline orders and the unit-time executor against the bubble formulas."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.schedule import (
    PipeOp,
    gpipe_order,
    inflight_microbatches,
    interleaved_order,
    make_order,
    one_f_one_b_order,
    simulate_pipeline,
)

GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16)]


def _ops(s: str) -> list[PipeOp]:
    return [PipeOp(t[0], int(t[1:])) for t in s.split()]


def test_orders_by_hand():
    assert gpipe_order(2, 2)[1] == _ops("F0 F1 B0 B1")
    o = one_f_one_b_order(4, 6)
    assert o[0] == _ops("F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5")  # warm-up p-0-1 = 3
    assert o[2] == _ops("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5")  # warm-up 1
    assert o[3] == _ops("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5")  # last stage: no warm-up
    # Megatron interleaved, p=2, m=4, v=2: chunk of forward k is (k // p) % v, micro-batch
    # (k // (p v)) p + k % p; warm-up 2(p-s-1) + (v-1)p = 4 on stage 0, 2 on stage 1
    io = interleaved_order(2, 4, 2)
    assert " ".join(map(str, io[0])) == \
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    assert " ".join(map(str, io[1][:6])) == "F0 F1 F0.1 B0.1 F1.1 B1.1"
    # m == p: everything is warm-up (Megatron), so all forwards come first
    assert [o.kind for o in interleaved_order(2, 2, 2)[1]] == ["F"] * 4 + ["B"] * 4


def test_every_op_once():
    for order in (gpipe_order(4, 8), one_f_one_b_order(4, 8), interleaved_order(4, 8, 3)):
        v = 1 + max(o.chunk for o in order[0])
        for ops in order:
            assert len(ops) == len(set(ops)) == 2 * 8 * v
            assert {(o.mb, o.chunk) for o in ops if o.kind == "F"} == \
                {(o.mb, o.chunk) for o in ops if o.kind == "B"}


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", GRID)
def test_bubble_gpipe_and_1f1b_exact(kind, p, m):
    # t_f = 1, t_b = 2 (binary-exact): step = (m + p - 1) (t_f + t_b)
    run = simulate_pipeline(make_order(kind, p, m), 1.0, 2.0)
    assert run.step_time_s == 3.0 * (m + p - 1)
    assert Fraction(run.bubble_fraction).limit_denominator(1000) == Fraction(p - 1, m + p - 1)
    assert run.busy_s == [3.0 * m] * p


@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("p, m", [(p, m) for p, m in GRID if p > 1 and m % p == 0])
def test_interleaved_bubble_divided_by_v(p, m, v):
    t_f, t_b = 1.0, 2.0  # per full stage; one chunk takes 1/v of it
    run = simulate_pipeline(interleaved_order(p, m, v), t_f / v, t_b / v)
    ideal = m * (t_f + t_b)
    bubble = run.step_time_s - ideal
    assert bubble == pytest.approx((p - 1) * (t_f + t_b) / v, abs=1e-9)
    frac = Fraction(p - 1, v) / (m + Fraction(p - 1, v))
    assert run.bubble_fraction == pytest.approx(float(frac), abs=1e-12)


def test_p2p_latency_adds_per_hop():
    # GPipe p=2, m=1: F on s0 [0,1], hop, F on s1 [1.5,2.5], B on s1 [2.5,4.5], hop, B on s0
    run = simulate_pipeline(gpipe_order(2, 1), 1.0, 2.0, p2p_s=0.5)
    assert [(s, e) for s, e, _ in run.busy[0]] == [(0.0, 1.0), (5.0, 7.0)]
    assert [(s, e) for s, e, _ in run.busy[1]] == [(1.5, 2.5), (2.5, 4.5)]
    assert run.step_time_s == 7.0


def test_nonuniform_stages_slowest_dominates():
    # 1F1B, p=2, m=4, stage 1 twice as slow: steady state runs at stage 1's pace
    run = simulate_pipeline(one_f_one_b_order(2, 4), [1.0, 2.0], [2.0, 4.0])
    assert run.step_time_s == 1.0 + 4 * 6.0 + 2.0  # s0's first F + s1's 4 (F+B) + s0's last B


def test_inflight_counts():
    for p, m in GRID:
        if m >= p:
            assert inflight_microbatches(one_f_one_b_order(p, m)) == [p - s for s in range(p)]
        assert inflight_microbatches(gpipe_order(p, m)) == [m] * p
    # interleaved (counted in chunks): Megatron warm-up 2(p-s-1) + (v-1)p, plus one
    p, m, v = 4, 8, 2
    assert inflight_microbatches(interleaved_order(p, m, v)) == \
        [2 * (p - s - 1) + (v - 1) * p + 1 for s in range(p)]


def test_interleaved_rejects_m_not_multiple_of_p():
    with pytest.raises(ValueError, match="multiple of pipeline stages"):
        interleaved_order(4, 6, 2)
    with pytest.raises(ValueError, match="one of"):
        make_order("zigzag", 2, 2)


def test_deadlocking_order_is_rejected():
    bad = [_ops("B0 F0"), _ops("F0 B0")]
    with pytest.raises(ValueError, match="deadlock"):
        simulate_pipeline(bad, 1.0, 1.0)




@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), mult=st.integers(1, 4), v=st.integers(1, 3),
       kind=st.sampled_from(["gpipe", "1f1b", "interleaved"]),
       tf=st.lists(st.integers(1, 5), min_size=6, max_size=6),
       tb=st.lists(st.integers(1, 9), min_size=6, max_size=6), hop=st.integers(0, 2))
def test_executor_invariants(p, mult, v, kind, tf, tb, hop):
    m = p * mult
    v = v if kind == "interleaved" else 1
    order = make_order(kind, p, m, v)
    run = simulate_pipeline(order, [float(x) for x in tf[:p]], [float(x) for x in tb[:p]],
                            p2p_s=float(hop))
    start = {}
    for s, stage in enumerate(run.busy):
        # the stage runs its order, one op at a time, each for its own duration
        assert [o for _, _, o in stage] == order[s]
        for (_, a1, _), (b0, _, _) in zip(stage, stage[1:], strict=False):
            assert a1 <= b0
        for a0, a1, o in stage:
            assert a1 - a0 == (tf[s] if o.kind == "F" else tb[s])
            start[(s, o)] = (a0, a1)
    for (s, o), (a0, _) in start.items():
        if o.kind == "F" and s > 0:  # a forward starts after the previous stage's + hop
            assert a0 >= start[(s - 1, o)][1] + hop
        if o.kind == "B":
            assert a0 >= start[(s, PipeOp("F", o.mb, o.chunk))][1]
            if s < p - 1:
                assert a0 >= start[(s + 1, o)][1] + hop
    assert run.step_time_s == max(e for st_ in run.busy for _, e, _ in st_)
    assert run.step_time_s >= max(run.busy_s)
    assert inflight_microbatches(order)[0] <= (m if kind == "gpipe" else m * v)
