"""The serving scheduler and request balancer registries (moesim.traffic.schedulers,
moesim.traffic.balancer): lookup, the one-line refusal of an unknown name or of a field
the scheduler does not take, and a made-up scheduler and balancer registered here, run
end to end on a tiny deployment with times worked out by hand, then unregistered."""

from __future__ import annotations

import pytest

from moesim.errors import InputError
from moesim.traffic.balancer import BALANCERS
from moesim.traffic.config import load_from_dict
from moesim.traffic.deploy import build_sim
from moesim.traffic.registry import Registry
from moesim.traffic.request import Request
from moesim.traffic.schedulers import SCHEDULERS, per_member
from moesim.traffic.step_costs import LinearStepCosts
from moesim.traffic.vllm import ContinuousBatching

C = LinearStepCosts(prefill_base_s=0.010, prefill_per_token_s=0.001, decode_base_s=0.020,
                    decode_per_seq_s=0.002)
LOAD = {"arrival": {"rate_rps": 1}, "requests": 3}


def test_the_built_in_kinds_and_their_fields():
    assert SCHEDULERS.names() == ("vllm", "sarathi", "disaggregated")
    assert BALANCERS.names() == ("round_robin", "least_outstanding")
    assert dict(SCHEDULERS.get("vllm").fields) == {"token_budget": 2048, "max_seqs": 256}
    assert dict(SCHEDULERS.get("disaggregated").fields) == {
        "token_budget": 2048, "max_seqs": 256, "prefill_groups": 1}
    assert SCHEDULERS.all_fields() == ("token_budget", "max_seqs", "prefill_groups")
    assert dict(BALANCERS.get("round_robin").fields) == {}


@pytest.mark.parametrize("key, value, names", [
    ("scheduler", "fifo", "['vllm', 'sarathi', 'disaggregated']"),
    ("router", "random", "['round_robin', 'least_outstanding']"),
])
def test_an_unknown_name_is_one_line_naming_the_field_and_the_names(key, value, names):
    with pytest.raises(InputError) as e:
        load_from_dict({**LOAD, key: value}, "s.yaml")
    assert e.value.field == f"load.{key}"
    assert str(e.value) == f"s.yaml: load.{key}: expected one of {names}, got {value!r}"


def test_a_field_only_another_scheduler_takes_is_refused():
    with pytest.raises(InputError) as e:
        load_from_dict({**LOAD, "scheduler": "sarathi", "prefill_groups": 2}, "s.yaml")
    assert e.value.field == "load.prefill_groups"
    assert "sarathi" in str(e.value) and "['disaggregated']" in str(e.value)
    lc = load_from_dict({**LOAD, "scheduler": "disaggregated", "prefill_groups": 2}, "s.yaml")
    assert lc.scheduler_options() == {"token_budget": 2048, "max_seqs": 256,
                                      "prefill_groups": 2}


def test_a_name_registered_twice_is_refused():
    r = Registry("x.kind")
    r.register("a", object)
    with pytest.raises(ValueError):
        r.register("a", object)
    r.unregister("a")
    assert r.names() == ()


@pytest.fixture
def capped():
    """A made-up scheduler ``capped``: continuous batching of at most ``cap`` running
    requests per member (a field of its own, default 1)."""

    def build(dep):
        opts = dict(dep.options)
        dep.options = {"max_seqs": opts.pop("cap")}
        return per_member(ContinuousBatching)(dep)

    SCHEDULERS.register("capped", build, {"cap": 1}, "at most cap requests running")
    yield
    SCHEDULERS.unregister("capped")


def test_a_made_up_scheduler_runs_end_to_end(capped):
    lc = load_from_dict({**LOAD, "scheduler": "capped"}, "s.yaml")
    assert lc.scheduler_options() == {"cap": 1} and lc.options == {"cap": 1}
    with pytest.raises(InputError) as e:      # a field capped does not take
        load_from_dict({**LOAD, "scheduler": "capped", "max_seqs": 4}, "s.yaml")
    assert e.value.field == "load.max_seqs"
    sim = build_sim(C, [[0]], 100_000, scheduler="capped", options=lc.scheduler_options())
    sim.submit([Request(0, 0.0, 100, 3), Request(1, 0.0, 50, 2)])
    sim.run()
    r0, r1 = sorted(sim.finished, key=lambda r: r.id)
    # one request at a time: r0 prefills 100 tokens (0.010 + 0.100) and decodes twice at
    # batch 1 (0.022 each); then r1 prefills 50 (0.060) and decodes once
    assert r0.first_token_s == pytest.approx(0.110)
    assert r0.finish_s == pytest.approx(0.110 + 2 * 0.022)
    assert r1.admitted_s == pytest.approx(0.154)
    assert r1.finish_s == pytest.approx(0.154 + 0.060 + 0.022)
    # with cap 2 (as vllm) both prefill together: 0.010 + 0.150
    two = build_sim(C, [[0]], 100_000, scheduler="capped", options={"cap": 2})
    two.submit([Request(0, 0.0, 100, 3), Request(1, 0.0, 50, 2)])
    two.run()
    assert [r.first_token_s for r in two.finished] == [pytest.approx(0.160)] * 2
    assert "capped" in SCHEDULERS


def test_a_made_up_balancer_sends_every_request_to_member_0():
    class First:
        def __init__(self, members):
            self.members = members

        def pick(self, eligible=None):
            return 0 if eligible is None else eligible[0]

    BALANCERS.register("first", First)
    try:
        lc = load_from_dict({**LOAD, "router": "first"}, "s.yaml")
        reqs = [Request(i, 0.0, p, 2) for i, p in enumerate((100, 50, 50))]
        sim = build_sim(C, [[0], [1]], 100_000, router=lc.router)
        sim.submit(reqs)
        sim.run()
        assert [r.member for r in sim.finished] == [0, 0, 0]
        # all three prompts in one prefill step on member 0: 0.010 + 0.200
        assert [r.first_token_s for r in sim.finished] == [pytest.approx(0.210)] * 3
        # least_outstanding spreads them: member 0, 1, 0
        spread = build_sim(C, [[0], [1]], 100_000, router="least_outstanding")
        spread.submit([Request(i, 0.0, p, 2) for i, p in enumerate((100, 50, 50))])
        spread.run()
        assert [r.member for r in sorted(spread.finished, key=lambda r: r.id)] == [0, 1, 0]
    finally:
        BALANCERS.unregister("first")
    with pytest.raises(InputError):
        load_from_dict({**LOAD, "router": "first"}, "s.yaml")
