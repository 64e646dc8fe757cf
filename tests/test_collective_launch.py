"""The cost of one NCCL call beyond its kernel (``overlap.collective_launch``,
moesim.collectives.nccl.launch): eagerly max(L, h - t_est), from a CUDA graph the floor.

Hand-worked: h = 14.57 µs (the median of sglang's seven all-gather eager figures: 14.03,
14.37, 14.42, 14.57, 14.58, 15.94, 18.14), L = 2.43 µs, F = 65,536 / 52e9 s = 1.2603 µs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.collectives.nccl import facts_from_params
from moesim.collectives.nccl import launch as L
from moesim.collectives.nccl.choice import WHOLE_STEP_GRAPH, choose, engine_tuning
from moesim.collectives.simulate import rank_hosts
from moesim.errors import InputError
from moesim.scenario import schema
from moesim.topology import load_topology
from moesim.wiring import resolve_path, simulate
from tests._util import TOY_TP4 as TOY_TP4_PLAIN

US = 1e-6
NIC_BPS = 50e9 * 0.95
FLOOR = 65536 / 52e9
ROOT = Path(__file__).resolve().parents[1]


def test_host_time_is_the_median_of_the_all_gather_eager_figures():
    assert L.CALL_HOST_S == pytest.approx(14.57 * US, rel=1e-12)
    assert L.CALIBRATED_ON == "all_gather"
    assert set(L.HELD_OUT) == {"reduce_scatter", "all_to_all"}


def test_extra_by_hand():
    # a 10.90 µs kernel: the host sets the pace, 14.57 - 10.90 = 3.67 µs more
    assert L.extra_s(10.90 * US, None) == pytest.approx(3.67 * US, rel=1e-9)
    # a 20 µs kernel: the host keeps ahead, only the stream launch
    assert L.extra_s(20 * US, None) == pytest.approx(2.43 * US, rel=1e-12)
    assert L.extra_s(3 * US, FLOOR) == FLOOR
    assert L.eager_call_s(17.31 * US) == pytest.approx(19.74 * US, rel=1e-12)
    assert L.graph_call_s(7.21 * US, 1.26 * US) == pytest.approx(8.47 * US, rel=1e-12)


def test_the_choice_carries_the_call_in_its_latency():
    """128 B all-reduce on 2 x 8 H100: NCCL's tree/LL, latency 25.2 µs, estimate 25.2066 µs
    (> h - L), so eagerly + 2.43 µs; from a graph + F."""
    topo = load_topology("dgx-h100", nodes=2)
    facts = facts_from_params(topo.params, topo.device, nodes=2, ranks_per_node=8)
    plain = choose("all_reduce", 128, facts)
    eager = choose("all_reduce", 128, facts, call_cost=lambda t: L.extra_s(t, None))
    graph = choose("all_reduce", 128, facts, call_cost=lambda t: L.extra_s(t, FLOOR))
    assert (plain.algo, plain.protocol) == (eager.algo, eager.protocol) == ("tree", "LL")
    assert plain.latency_s == pytest.approx(25.2 * US, rel=1e-12)
    assert eager.latency_s == pytest.approx(27.63 * US, rel=1e-12)
    assert graph.latency_s == pytest.approx(25.2 * US + FLOOR, rel=1e-12)


def test_only_on_the_devices_it_was_measured_on():
    topo = load_topology("dgx-h100", nodes=2, gpus_per_node=2)
    hosts = rank_hosts(topo)
    on = engine_tuning(topo, launch="eager").for_group("all_reduce", (0, 1, 2, 3), 4096, hosts)
    off = engine_tuning(topo).for_group("all_reduce", (0, 1, 2, 3), 4096, hosts)
    assert on.latency_s - off.latency_s == pytest.approx(2.43 * US, rel=1e-9)
    a100 = engine_tuning(topo, device="A100", launch="eager")
    assert a100.call_cost is None


TOY_TP4 = TOY_TP4_PLAIN + "overlap: {collective_launch: true}\n"


def test_a_training_step_pays_the_eager_call_in_both_engines(tmp_path):
    """The toy TP4 step over 2 nodes x 2 GPUs (tests/test_nccl_engine.py): a TP
    all-reduce of 128 KiB is NCCL's ring/LL, 16.0 µs + its bytes = 20.1391 µs; NCCL
    estimates it at 16.0 + 131072 / 26.0e3 = 21.04 µs > h - L, so eagerly + 2.43 µs."""
    path = tmp_path / "toy-tp4.yaml"
    path.write_text(TOY_TP4)
    res = resolve_path(path)
    want = 16.0 * US + 6 * (2 * 128 * 512 * 2 / 8) / NIC_BPS + 2.43 * US
    for mode in ("exact", "fast"):
        r = simulate(res, engine=mode)
        tp = [s.end_s - s.start_s for s in r.spans
              if s.rank == 0 and s.kind == "tp" and s.name.startswith("fwd.")]
        assert tp == pytest.approx([want] * 4, rel=1e-9)


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_a_graphed_decode_step_pays_the_floor(mode):
    """Mixtral decode, TP2 EP4 on one DGX H100, replayed from a CUDA graph: every TP
    all-reduce grows by exactly F; the knob is off by default."""
    from moesim.serve.run import resolve_serve, simulate_serve
    scn = ROOT / "scenarios" / "mixtral-8x7b-serve.yaml"
    base = ["serve.tp=2", "serve.ep=4", "serve.cuda_graphs=true", f"engine.mode={mode}"]
    got = []
    for extra in ([], ["overlap.collective_launch=true"]):
        res, cfg = resolve_serve(scn, base + extra)
        assert res.scenario.overlap.collective_launch == bool(extra)
        assert WHOLE_STEP_GRAPH in res.scenario.overlap.cuda_graphs
        r = simulate_serve(res, cfg, spans=True)
        got.append(sorted(sp.end_s - sp.start_s for sp in r.spans
                          if sp.rank == 0 and sp.name == "fwd.tp_attn"))
    assert len(got[0]) == len(got[1]) > 0
    assert [b - a for a, b in zip(*got, strict=True)] == pytest.approx(
        [FLOOR] * len(got[0]), rel=1e-6)


def test_the_knob_is_checked_and_off_by_default(tmp_path):
    assert schema.OverlapConfig().collective_launch is False
    assert schema.WHOLE_STEP_GRAPH == WHOLE_STEP_GRAPH
    path = tmp_path / "bad.yaml"
    path.write_text(TOY_TP4.replace("collective_launch: true", "collective_launch: 3"))
    with pytest.raises(InputError, match="overlap.collective_launch"):
        resolve_path(path)
