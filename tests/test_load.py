"""Requests over time (moesim.traffic, issue 23): times worked out by hand on tiny
deployments with LinearStepCosts, invariants, the capacity search, configuration errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.traffic.config import load_from_dict
from moesim.traffic.deploy import build_sim
from moesim.traffic.metrics import parse_slo, summarize
from moesim.traffic.request import Request
from moesim.traffic.run import find_capacity, run_load
from moesim.traffic.step_costs import LinearStepCosts

C = LinearStepCosts(prefill_base_s=0.010, prefill_per_token_s=0.001, decode_base_s=0.020,
                    decode_per_seq_s=0.002)


def _run(reqs, groups=((0,),), kv=100_000, **kw):
    sim = build_sim(C, [list(g) for g in groups], kv, **kw)
    sim.submit(reqs)
    sim.run()
    return sim


def test_vanishing_load_ttft_is_one_prefill_and_tpot_one_decode_at_batch_1():
    sim = _run([Request(0, 0.0, 100, 5)])
    lat = sim.finished[0].latency()
    assert lat["ttft_s"] == pytest.approx(0.010 + 0.100)          # prefill_s(100, 1)
    assert lat["tpot_s"] == pytest.approx(0.020 + 0.002)          # decode_s(1, .)
    assert lat["e2e_s"] == pytest.approx(0.110 + 4 * 0.022)
    assert lat["queue_s"] == 0.0


def test_two_simultaneous_requests_prefill_together_then_decode_as_a_batch():
    sim = _run([Request(0, 0.0, 100, 3), Request(1, 0.0, 50, 3)])
    pre = 0.010 + 0.150                       # one prefill step of 150 tokens
    dec = 0.020 + 2 * 0.002                   # decode steps at batch 2
    for r in sim.finished:
        assert r.first_token_s == pytest.approx(pre)
        assert r.finish_s == pytest.approx(pre + 2 * dec)


def test_a_request_arriving_during_a_step_waits_and_prefill_goes_first():
    # r0's prefill runs 0..0.11; r1 arrives at 0.05, is prefilled 0.11..0.17 (vLLM
    # schedules waiting prompts before decodes), then both decode at batch 2
    sim = _run([Request(0, 0.0, 100, 3), Request(1, 0.05, 50, 2)])
    r0, r1 = sorted(sim.finished, key=lambda r: r.id)
    assert r1.admitted_s == pytest.approx(0.11)
    assert r1.first_token_s == pytest.approx(0.11 + 0.060)
    assert r1.latency()["queue_s"] == pytest.approx(0.06)
    dec2 = 0.024
    assert r1.finish_s == pytest.approx(0.17 + dec2)
    # r0: token 2 at 0.17 + 0.024, token 3 after one decode at batch 1
    assert r0.finish_s == pytest.approx(0.17 + dec2 + 0.022)
    assert sim.tbt_quantile(1.0) == pytest.approx(0.17 + dec2 - 0.11, rel=3e-3)


def test_chunked_prefill_spends_the_token_budget_per_step():
    sim = _run([Request(0, 0.0, 300, 2)], scheduler="sarathi", token_budget=128)
    r = sim.finished[0]
    # chunks 128, 128, 44: three prefill steps, the last samples the first token
    assert r.first_token_s == pytest.approx(3 * 0.010 + 0.300)
    assert r.finish_s == pytest.approx(0.330 + 0.022)


def test_chunked_prefill_runs_decodes_beside_a_prompt_chunk():
    # r0 decodes while r1's prompt is chunked in the same steps: decode_s(1) plus the
    # chunk's tokens beyond an empty prefill step
    sim = _run([Request(0, 0.0, 10, 3), Request(1, 0.02, 200, 1)], scheduler="sarathi",
               token_budget=101)
    r0, r1 = sorted(sim.finished, key=lambda r: r.id)
    assert r0.first_token_s == pytest.approx(0.020)
    # step 2 (0.02..): r0 decodes + 100 tokens of r1: 0.022 + 0.100
    # step 3: r0 decodes (its last) + the last 100 tokens: 0.022 + 0.100 (r1 done)
    assert r0.finish_s == pytest.approx(0.020 + 2 * 0.122)
    assert r1.first_token_s == pytest.approx(0.020 + 2 * 0.122)


def test_an_ep_group_waits_for_its_slowest_member():
    # two attention-DP ranks in one lockstep group: the short prompt's member waits for
    # the long prompt's prefill (round robin puts one request on each)
    sim = _run([Request(0, 0.0, 1000, 1), Request(1, 0.0, 10, 1)], groups=((0, 1),),
               router="round_robin")
    for r in sim.finished:
        assert r.first_token_s == pytest.approx(0.010 + 1.000)
    # as two independent replicas the short one is done after its own prefill
    sim = _run([Request(0, 0.0, 1000, 1), Request(1, 0.0, 10, 1)], groups=((0,), (1,)),
               router="round_robin")
    assert sorted(r.finish_s for r in sim.finished) == pytest.approx([0.020, 1.010])


def test_kv_cache_never_over_capacity_and_preemption_recomputes():
    used = []
    sim = build_sim(C, [[0]], kv_tokens=64 * 16, block_size=16)
    sim.on_step = lambda g, t, batches, done: used.append(sim.members[0].kv.used)
    reqs = [Request(i, 0.001 * i, 200, 300) for i in range(6)]
    sim.submit(reqs)
    sim.run()
    assert max(used) <= 64
    assert sum(r.preemptions for r in reqs) > 0
    assert all(r.done and r.generated == 300 for r in reqs)
    assert sim.members[0].kv.used == 0


def test_a_request_larger_than_the_cache_is_rejected_not_stuck():
    sim = _run([Request(0, 0.0, 5000, 10), Request(1, 0.0, 10, 2)], kv=1024)
    s = summarize(sim)
    assert s["requests"] == {"arrived": 2, "finished": 1, "in_flight": 0, "rejected": 1}


def _cfg(**kw):
    d = {"arrival": {"kind": "poisson", "rate_rps": 20.0}, "requests": 600,
         "prompt_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5, "max": 2000},
         "output_tokens": {"dist": "uniform", "min": 5, "max": 60}, "seed": 4}
    d.update(kw)
    return load_from_dict(d, "t.yaml")


def _build(lc, series):
    return build_sim(C, [[0, 1], [2, 3]], 20_000, scheduler=lc.scheduler,
                     router=lc.router, token_budget=lc.token_budget, series=series)


@pytest.mark.parametrize("sched", ["vllm", "sarathi"])
def test_invariants_and_littles_law_on_a_long_run(sched):
    lc = _cfg(scheduler=sched)
    sim = _build(lc, True)
    sim.submit(lc.requests_list())
    sim.run(until=10.0)                    # stopped mid-run: some in flight
    s = summarize(sim)
    rq = s["requests"]
    assert rq["arrived"] == rq["finished"] + rq["in_flight"] and rq["in_flight"] > 0
    sim.run()
    s = summarize(sim)
    assert s["requests"]["in_flight"] == 0 and s["requests"]["finished"] == 600
    # Little over the whole run (first arrival to last finish): the time-averaged requests
    # in the system (each request's stay) against throughput x mean latency, exactly;
    # the event loop's own integral agrees
    r = s["run"]
    assert r["mean_in_system"] == pytest.approx(r["throughput_rps"] * r["e2e_mean_s"],
                                                rel=1e-9)
    assert r["mean_in_system"] == pytest.approx(sim.mean_in_system() * sim.now / r["end_s"],
                                                rel=1e-9)
    # 20 req/s is more than two lockstep groups serve: the window says the queue grows
    assert s["window"]["verdict"] == "queue grows"
    assert s["window"]["in_system_end"] > s["window"]["in_system_start"]
    assert s["kv_peak_fraction"] <= 1.0


def test_same_seed_same_bytes():
    a = json.dumps(run_load(_build, _cfg(), parse_slo("ttft_p99=1s"))[1], sort_keys=True)
    b = json.dumps(run_load(_build, _cfg(), parse_slo("ttft_p99=1s"))[1], sort_keys=True)
    assert a == b
    c = json.dumps(run_load(_build, _cfg(seed=5), None)[1], sort_keys=True)
    assert c != a


@pytest.mark.slow
def test_capacity_search_is_monotone_and_meets_its_slo():
    lc = _cfg(requests=300)
    loose = find_capacity(_build, lc, parse_slo("ttft_p99=2s,tpot_p99=60ms"))
    tight = find_capacity(_build, lc, parse_slo("ttft_p99=0.8s,tpot_p99=40ms"))
    assert 0 < tight["capacity_rps"] <= loose["capacity_rps"]
    for cap, _slo in ((loose, "ttft_p99=2s,tpot_p99=60ms"), (tight, "ttft_p99=0.8s,tpot_p99=40ms")):
        last = {r["rate_rps"]: r["met"] for r in cap["runs"]}    # a rate's final run
        met = [r for r, ok in last.items() if ok]
        missed = [r for r, ok in last.items() if not ok]
        assert max(met) == cap["capacity_rps"] and min(missed) > cap["capacity_rps"]
        assert min(missed) <= cap["capacity_rps"] * 1.03


def test_disaggregated_prefill_hands_kv_over_after_its_transfer():
    # member 0 prefills, member 1 decodes; 100 prompt tokens x 1000 B over a 1 MB/s link
    from tests.test_load_disagg import links
    sim = build_sim(C, [[0], [1]], 100_000, scheduler="disaggregated",
                    kv_bytes_per_token=1000.0, links=links(2, 1e6), gpus_of=[("g0",), ("g1",)])
    r = Request(0, 0.0, 100, 3)
    sim.submit([r])
    sim.run()
    assert r.first_token_s == pytest.approx(0.110)
    assert r.finish_s == pytest.approx(0.110 + 0.1 + 2 * 0.022)
    assert sim.transfer.bytes == 100_000 and r.member == 1


def test_goodput_counts_requests_meeting_every_bound():
    sim = _run([Request(0, 0.0, 100, 5), Request(1, 0.0, 2000, 2)])
    s = summarize(sim, {"ttft_p99": 1.0})
    assert s["goodput_rps"] * (max(r.finish_s for r in sim.finished)) == pytest.approx(1.0)


def test_lengths_and_arrivals_seeded_and_shaped():
    a = _cfg(requests=20000).requests_list()
    b = _cfg(requests=20000).requests_list()
    assert [(r.arrival_s, r.prompt, r.output) for r in a] == \
        [(r.arrival_s, r.prompt, r.output) for r in b]
    gaps = np.diff([r.arrival_s for r in a])
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.03)
    assert np.std(gaps) / gaps.mean() == pytest.approx(1.0, rel=0.05)   # Poisson
    assert np.mean([r.output for r in a]) == pytest.approx(32.5, rel=0.02)
    bursty = _cfg(requests=20000, arrival={"kind": "gamma", "rate_rps": 20, "cv": 3})
    g = np.diff([r.arrival_s for r in bursty.requests_list()])
    assert np.std(g) / g.mean() == pytest.approx(3.0, rel=0.1)


def test_azure_trace_columns(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n"
                 "2023-11-16 18:15:51.2046430,879,0\n")
    lc = load_from_dict({"arrival": {"kind": "trace", "file": p.name}}, "s.yaml",
                        base=str(tmp_path))
    rs = lc.requests_list()
    assert [r.prompt for r in rs] == [374, 396, 879] and [r.output for r in rs] == [44, 109, 1]
    assert rs[1].arrival_s == pytest.approx(4.314579, abs=1e-5)


@pytest.mark.parametrize("d,field", [
    ({"arrival": {"kind": "zipf", "rate_rps": 1}, "requests": 3}, "load.arrival.kind"),
    ({"arrival": {"rate_rps": -1}, "requests": 3}, "load.arrival.rate_rps"),
    ({"arrival": {"rate_rps": 1}}, "load.requests"),
    ({"arrival": {"rate_rps": 1}, "requests": 3, "scheduler": "fifo"}, "load.scheduler"),
    ({"arrival": {"rate_rps": 1}, "requests": 3, "prompt_tokens": {"dist": "zeta"}},
     "load.prompt_tokens.dist"),
    ({"arrival": {"rate_rps": 1}, "requests": 3, "kv_fraction": 1.5}, "load.kv_fraction"),
    ({"arrival": {"rate_rps": 1}, "requests": 3, "colour": 1}, "load.colour"),
    ({"arrival": {"rate_rps": 1}, "requests": 3, "surface": {"batches": [0, 2]}},
     "load.surface.batches"),
    ({"arrival": {"rate_rps": 1}, "requests": 3, "surface": {"widths": [1]}},
     "load.surface.widths"),
])
def test_bad_load_sections_name_the_field(d, field):
    with pytest.raises(InputError) as e:
        load_from_dict(d, "s.yaml")
    assert e.value.field == field


def test_slo_parsing():
    assert parse_slo("ttft_p99=2s,tpot_p99=50ms") == {"ttft_p99": 2.0, "tpot_p99": 0.05}
    with pytest.raises(InputError):
        parse_slo("ttft_p98=2s")


def test_surface_interpolation_is_exact_on_a_bilinear_function_and_extends_linearly():
    from moesim.traffic.surface import bilinear
    xs, ys = np.array([1.0, 4.0, 16.0]), np.array([128.0, 1024.0])

    def f(x, y):
        return 0.01 + 0.002 * x + 1e-5 * y + 3e-7 * x * y

    z = np.array([[f(x, y) for y in ys] for x in xs])
    for x, y in [(1, 128), (2.5, 500), (16, 1024), (10, 700), (20, 1024), (16, 2000)]:
        assert bilinear(xs, ys, z, x, y) == pytest.approx(f(x, y), rel=1e-12)


def test_rollout_batch_at_t0_interrupted_at_a_weight_update_and_resumed():
    # an RL rollout: 4 tagged samples at t = 0 on one member; a weight update at 0.2 s
    # interrupts (the step in flight is dropped), the samples resume by recompute
    sim = build_sim(C, [[0]], 100_000)
    reqs = [Request(i, 0.0, 100, 20, tag=("prompt", i // 2)) for i in range(4)]
    sim.submit(reqs)
    sim.run(until=0.2)
    # 0..0.41 prefill of 400 tokens: nothing sampled yet at 0.2
    left = sim.interrupt()
    assert {r.id for r in left} == {0, 1, 2, 3} and sim.members[0].kv.used == 0
    assert all(r.generated == 0 for r in left)
    sim.run(until=0.5)                      # the dropped step's end passes unapplied
    assert all(r.generated == 0 for r in reqs) and not sim.finished
    for r in left:
        r.arrival_s = sim.now
    sim.submit(left)
    sim.run()
    assert sorted(r.tag for r in sim.finished) == [("prompt", 0)] * 2 + [("prompt", 1)] * 2
    assert all(r.generated == 20 for r in sim.finished)
    # resumed at 0.5: prefill 0.41, then 19 decode steps at batch 4 (0.028 s)
    assert max(r.finish_s for r in sim.finished) == pytest.approx(0.5 + 0.41 + 19 * 0.028)


def test_empirical_lengths_are_drawn_from_the_file(tmp_path):
    (tmp_path / "lens.csv").write_text("prompt,output\n100,7\n300,9\n")
    lc = load_from_dict({"arrival": {"rate_rps": 5}, "requests": 400,
                         "prompt_tokens": {"dist": "empirical", "file": "lens.csv",
                                           "column": "prompt"},
                         "output_tokens": {"dist": "empirical", "file": "lens.csv",
                                           "column": "output"}}, "s.yaml", base=str(tmp_path))
    rs = lc.requests_list()
    assert {r.prompt for r in rs} == {100, 300} and {r.output for r in rs} == {7, 9}
    bad = load_from_dict({"arrival": {"rate_rps": 5}, "requests": 4,
                          "prompt_tokens": {"dist": "empirical", "file": "lens.csv",
                                            "column": "nope"}}, "s.yaml", base=str(tmp_path))
    with pytest.raises(InputError) as e:
        bad.requests_list()
    assert e.value.field == "load.prompt_tokens"
