"""The serving loop's skipping between events (moesim.traffic.skip) against stepping one
by one: every request's times, the KV cache, the series and the statistics are equal,
float for float, not within a tolerance (the sums are done in the stepwise order)."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.traffic.config import load_from_dict
from moesim.traffic.deploy import build_sim
from moesim.traffic.metrics import summarize
from moesim.traffic.request import Request
from moesim.traffic.skip import delay_to
from moesim.traffic.step_costs import LinearStepCosts
from tests.test_load_disagg import links

# a decode step's cost grows with the context, so every skipped step has its own time
C = LinearStepCosts(prefill_base_s=0.010, prefill_per_token_s=0.001, decode_base_s=0.020,
                    decode_per_seq_s=0.002, decode_per_ctx_token_s=3.1e-6)


def _reqs(n=120, rate=30.0, seed=3, prompt=200, output=60):
    lc = load_from_dict({"arrival": {"kind": "poisson", "rate_rps": rate}, "requests": n,
                         "prompt_tokens": {"dist": "lognormal", "mean": prompt,
                                           "sigma": 0.6, "max": 1500},
                         "output_tokens": {"dist": "lognormal", "mean": output,
                                           "sigma": 0.8, "max": 400}, "seed": seed},
                        "t.yaml")
    return lc.requests_list()


class ScalarCosts:
    """C without its vectorised decode (the loop then prices skipped steps one by one)."""

    def prefill_s(self, tokens, prompts):
        return C.prefill_s(tokens, prompts)

    def decode_s(self, batch, context):
        return C.decode_s(batch, context)


def _pair(reqs_fn, groups, kv, costs=C, **kw):
    out = []
    for skip in (False, True):
        sim = build_sim(costs, groups, kv, **kw)
        sim.skip = skip
        reqs = reqs_fn()
        sim.submit(reqs)
        sim.run()
        out.append((sim, reqs))
    return out


def _same(a, b):
    (sa, ra), (sb, rb) = a, b
    assert len(ra) == len(rb)
    for x, y in zip(ra, rb, strict=True):
        for k in ("arrival_s", "admitted_s", "first_token_s", "last_token_s", "finish_s"):
            vx, vy = getattr(x, k), getattr(y, k)
            assert (vx is None) == (vy is None)
            if vx is not None:
                assert vy == vx
        assert (x.generated, x.preemptions, x.member, x.rejected) == \
            (y.generated, y.preemptions, y.member, y.rejected)
        if x.done and not x.rejected:
            lx, ly = x.latency(), y.latency()
            for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
                assert ly[k] == pytest.approx(lx[k], rel=1e-9, abs=1e-15)
    assert sb.kv_peak == sa.kv_peak
    assert sb.steps == sa.steps
    assert sb.tbt_n == sa.tbt_n and sb.tbt_sum == sa.tbt_sum
    assert np.array_equal(sb.tbt_hist, sa.tbt_hist)
    assert [len(s) for s in sb.series] == [len(s) for s in sa.series]
    for s1, s2 in zip(sa.series, sb.series, strict=True):
        a1, a2 = np.array(s1, dtype=float), np.array(s2, dtype=float)
        assert np.array_equal(a1, a2)
    assert sb.skipped > 0 and sa.skipped == 0
    sx, sy = summarize(sa), summarize(sb)
    for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        for q in ("p50", "p90", "p99"):
            assert sy[k][q] == sx[k][q]


@pytest.mark.parametrize("sched,costs", [("vllm", C), ("sarathi", C),
                                         ("vllm", ScalarCosts())])
def test_skipping_equals_stepping_with_room(sched, costs):
    a, b = _pair(_reqs, [[0, 1], [2, 3]], 60_000, costs=costs, scheduler=sched,
                 token_budget=512)
    assert sum(r.preemptions for r in a[1]) == 0
    _same(a, b)


@pytest.mark.parametrize("sched", ["vllm", "sarathi"])
def test_skipping_equals_stepping_under_preemption(sched):
    # 2,000 tokens (125 blocks) per member: the cache fills, requests are preempted
    a, b = _pair(lambda: _reqs(n=80, rate=40.0, seed=7), [[0], [1, 2]], 2_000,
                 scheduler=sched, token_budget=256, block_size=16)
    assert sum(r.preemptions for r in a[1]) > 5
    _same(a, b)


def test_skipping_equals_stepping_with_one_block_tokens_and_max_seqs():
    a, b = _pair(lambda: _reqs(n=60, rate=100.0, seed=11), [[0, 1]], 3_000,
                 block_size=1, max_seqs=7)
    _same(a, b)


def test_skipping_equals_stepping_disaggregated():
    a, b = _pair(lambda: _reqs(n=60, rate=20.0, seed=5), [[0], [1], [2]], 50_000,
                 scheduler="disaggregated", kv_bytes_per_token=1000.0,
                 links=links(3, 1e6), gpus_of=[("g0",), ("g1",), ("g2",)])
    _same(a, b)


def test_rollout_batch_at_t0_with_a_weight_update_in_a_skipped_run():
    # RL: 64 samples at t = 0, stopped mid-decode, interrupted, resubmitted
    def go(skip):
        sim = build_sim(C, [[0], [1]], 4_000, router="round_robin")
        sim.skip = skip
        rng = np.random.default_rng(2)
        reqs = [Request(i, 0.0, int(p), int(o)) for i, (p, o) in enumerate(
            zip(rng.integers(20, 120, 64), rng.integers(5, 300, 64), strict=True))]
        sim.submit(reqs)
        sim.run(until=1.3)
        mid = (sim.steps, summarize(sim)["requests"], sim.kv_peak,
               [len(s) for s in sim.series], [(r.generated, r.kv_tokens) for r in reqs])
        left = sim.interrupt()
        sim.run(until=1.9)
        for r in left:
            r.arrival_s = sim.now
        sim.submit(left)
        sim.run()
        return sim, reqs, mid

    sa, ra, ma = go(False)
    sb, rb, mb = go(True)
    assert ma == mb
    _same((sa, ra), (sb, rb))


def test_delay_lands_on_the_clock():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        now = float(rng.random() * 10.0 ** int(rng.integers(-3, 6)))
        t = now + float(rng.random() * 10.0 ** int(rng.integers(-6, 4)))
        assert now + delay_to(now, t) == t


def test_vectorised_decode_costs_are_the_scalar_floats():
    ctx = np.arange(1, 5000, 7) / 3
    for b in (1, 3, 64, 255):
        many = C.decode_s_many(b, ctx)
        assert [float(x) for x in many] == [C.decode_s(b, c) for c in ctx.tolist()]


@pytest.mark.parametrize("c_at,admitted", [(0.0, 1.25), (1.0, 1.75)])
def test_an_arrival_exactly_at_a_step_boundary(c_at, admitted):
    # steps of exactly 0.25 s (prefill) and 0.5 s (decode): A's decode steps end at 0.75,
    # 1.25, 1.75, ...; B arrives at 1.25 exactly. Stepwise, simpy runs same-time events
    # in the order they were created: with C arriving at 0 (at the other replica), B's
    # arrival event is created at 0, before the step end at 1.25 (created at 0.75), so the
    # plan at 1.25 admits B. With C arriving at 1.0, B's event is created at 1.0, after
    # the step's: the plan at 1.25 runs first and B waits for 1.75. Skipping cuts its run
    # the same way.
    costs = LinearStepCosts(prefill_base_s=0.25, decode_base_s=0.5)
    for skip in (False, True):
        sim = build_sim(costs, [[0], [1]], 10_000, router="round_robin")
        sim.skip = skip
        reqs = [Request(0, 0.0, 10, 20), Request(1, 1.25, 10, 3), Request(2, c_at, 10, 3)]
        sim.submit(reqs)
        sim.run()
        b = reqs[1]
        assert b.member == 0 and b.admitted_s == admitted
        assert reqs[0].finish_s == 0.25 + 19 * 0.5 + 0.25   # its decode waits one prefill
        assert (sim.skipped > 0) == skip


def test_a_skipped_run_ends_in_the_stepwise_order_of_same_time_events():
    # prefill 0.25 s, decode 0.5 s. Member 0 (group 0) runs A (6 tokens) and E; member 1
    # runs D. Y arrives at 1.0 and goes to member 1 (fewer outstanding), finishing there
    # at 1.5. A finishes at 0.25 + 5 x 0.5 = 2.75, the very time X arrives. Stepwise,
    # X's arrival event (created at 1.0, when Y arrived) comes before A's last step end
    # (created at 2.25): X sees member 0 with 2 outstanding, member 1 with 1, and joins
    # member 1. A skipped run ends on an event created when its last step starts, as the
    # stepwise loop's, so X still comes first.
    costs = LinearStepCosts(prefill_base_s=0.25, decode_base_s=0.5)
    for skip in (False, True):
        sim = build_sim(costs, [[0], [1]], 10_000, router="least_outstanding")
        sim.skip = skip
        a, d, e = Request(0, 0.0, 10, 6), Request(1, 0.0, 10, 40), Request(2, 0.0, 10, 30)
        y, x = Request(3, 1.0, 10, 1), Request(4, 2.75, 10, 3)
        sim.submit([a, e, d, y, x])
        sim.run()
        assert (a.member, e.member, d.member, y.member) == (0, 0, 1, 1)
        assert a.finish_s == 2.75 and y.finish_s == 1.5
        assert x.member == 1
        assert (sim.skipped > 0) == skip
