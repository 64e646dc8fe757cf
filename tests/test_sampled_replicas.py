"""Replicas on the fast path: identical replicas (one chain per replica class) against
the full simulation of every chain, sampled replicas (``engine.replicas: sampled``)
with every replica simulated against independent replicas, the choice of sampled
replicas worked out by hand, and bad counts refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.cli import main
from moesim.engine.fast.links import LinkBytes
from moesim.engine.fast.sampled import chosen_replicas, expected_max, gap_estimate, sampled_map
from moesim.errors import InputError
from moesim.layout.mesh import Layout
from moesim.trace.report import jsonable
from moesim.wiring import resolve_path, simulate

# hot-expert on 4 DGX H100 nodes: 32 GPUs, EP8 inside each node, dp 32 -> edp 4 replicas;
# skewed routing drawn per replica (zipf), 4 micro-batches, the fast path
SKEW = ["cluster.nodes=4", "engine.mode=fast", "routing.kind=zipf", "routing.zipf_s=1.0",
        "schedule.microbatches=4"]


def _same(a, b, skip=("sim_wall_s", "replicas", "shortcuts")) -> None:
    """Two summaries equal byte for byte but for the keys that name the mode."""
    strip = lambda s: json.dumps(jsonable({k: v for k, v in s.items()  # noqa: E731
                                           if k not in skip}), sort_keys=True)
    assert strip(a.summary) == strip(b.summary)


def test_sampled_with_every_replica_is_the_independent_step_bit_for_bit():
    ind = simulate("hot-expert", SKEW)
    allr = simulate("hot-expert", SKEW + ["engine.replicas=sampled",
                                          "engine.sampled_replicas=4"])
    assert allr.step_time_s == ind.step_time_s
    _same(ind, allr)
    sc = [s for s in allr.summary["shortcuts"] if s["name"] == "sampled_replicas"]
    assert sc[0]["simulated_replicas"] == 4 and sc[0]["replicas"] == 4
    assert sc[0]["bound"] == "exact (every replica simulated)"


def test_identical_replicas_equal_every_chain_run_on_the_shared_samples():
    over = SKEW + ["engine.replicas=identical"]
    one = simulate("hot-expert", over)                 # one chain per replica class
    full = simulate("hot-expert", over, dedup=False)   # all 4 chains, the same samples
    assert one.step_time_s == full.step_time_s
    rows1, rowsf = one.summary["per_rank"], full.summary["per_rank"]
    assert [r["breakdown_s"] for r in rows1] == [r["breakdown_s"] for r in rowsf]
    assert one.summary["breakdown_s"] == full.summary["breakdown_s"]
    e1, ef = dict(one.summary["experts"]), dict(full.summary["experts"])
    # the load-balancing loss is a float sum taken in another order (mirrors with their
    # representative, or chain by chain): equal to the last digits
    np.testing.assert_allclose(e1.pop("lb_loss"), ef.pop("lb_loss"), rtol=1e-14)
    assert e1 == ef
    # replicas differ only in their edp index: 4096 tokens x top-2 x 32 ranks x 4 micro-batches
    tok = np.array(one.summary["experts"]["tokens_per_expert"])
    assert (tok.sum(axis=1) == 4096 * 2 * 32 * 4).all()
    assert [s["name"] for s in one.summary["shortcuts"]][-1] == "identical_replicas"


def test_sampled_replicas_stand_for_the_rest_and_count_every_replica():
    r = simulate("hot-expert", SKEW + ["engine.replicas=sampled",
                                       "engine.sampled_replicas=2"])
    chosen = chosen_replicas(1, 4, 2)          # hot-expert's seed is 1
    sc = [s for s in r.summary["shortcuts"] if s["name"] == "sampled_replicas"][0]
    assert sc["simulated_replicas"] == 2 and sc["chosen_edp"] == chosen
    rows = r.summary["per_rank"]
    m = sampled_map(Layout(world=32, pp=1, dp=32, ep=8), chosen)
    assert len(m.mirrors) == 16            # 2 replicas x 8 EP ranks stand for the others
    for rep, mirrors in m.mirrors.items():
        for q in mirrors:
            assert rows[q]["breakdown_s"] == rows[rep]["breakdown_s"]
    tok = np.array(r.summary["experts"]["tokens_per_expert"])
    assert (tok.sum(axis=1) == 4096 * 2 * 32 * 4).all()


def test_sampled_replicas_in_two_chain_processes_equal_the_serial_run():
    over = SKEW + ["engine.replicas=sampled", "engine.sampled_replicas=2"]
    one = simulate("hot-expert", over + ["engine.workers=1"])
    two = simulate("hot-expert", over + ["engine.workers=2"])
    _same(one, two, skip=("sim_wall_s",))
    assert one.links.bytes.tobytes() == two.links.bytes.tobytes()


def test_sampled_map_by_hand():
    # world 8, dp 8, ep 2 -> edp 4; edp index of rank r is r // 2 (ep inner)
    lay = Layout(world=8, pp=1, dp=8, ep=2)
    assert lay.coords["edp"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    m = sampled_map(lay, [0, 2])
    # replicas 1 and 3 (not chosen), in edp order, go to 0 and 2 in turn
    assert m.rep.tolist() == [0, 1, 0, 1, 4, 5, 4, 5]
    assert m.mirrors == {0: (2,), 1: (3,), 4: (6,), 5: (7,)}
    m1 = sampled_map(lay, [3])
    assert m1.rep.tolist() == [6, 7, 6, 7, 6, 7, 6, 7]
    assert m1.mirrors == {6: (0, 2, 4), 7: (1, 3, 5)}
    assert chosen_replicas(0, 4, 4) == [0, 1, 2, 3]
    assert chosen_replicas(5, 16, 3) == chosen_replicas(5, 16, 3)   # from the seed alone
    assert len(set(chosen_replicas(5, 16, 3))) == 3


def test_gap_estimate_by_hand():
    # E[max of 2 standard normals] = 1/sqrt(pi)
    assert expected_max(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-6)
    assert expected_max(1) == 0.0
    # ends 1 and 3: sample std sqrt(2); gap to the slowest of 2 = 0 (all simulated)
    assert gap_estimate([1.0, 3.0], 2) == pytest.approx(0.0, abs=1e-12)
    assert gap_estimate([1.0, 3.0], 4) == pytest.approx(
        np.sqrt(2) * (expected_max(4) - 1 / np.sqrt(np.pi)), rel=1e-9)
    assert gap_estimate([2.0], 8) is None


@pytest.mark.parametrize("sets,field", [
    (["engine.sampled_replicas=5"], "engine.sampled_replicas"),      # edp is 4
    (["engine.sampled_replicas=0"], "engine.sampled_replicas"),
    (["engine.mode=exact"], "engine.replicas"),                     # fast path only
])
def test_bad_sampled_replicas_is_one_line_exit_2(sets, field, capsys, tmp_path):
    over = SKEW + ["engine.replicas=sampled"] + sets
    args = ["run", "hot-expert", "-o", str(tmp_path / "o")]
    for s in over:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and "Traceback" not in err
    with pytest.raises(InputError):
        simulate("hot-expert", over)


def test_sampled_asked_of_the_exact_engine_is_refused():
    with pytest.raises(InputError) as e:
        simulate("toy-cpu", engine="exact", replicas="sampled")
    assert "engine.replicas" in str(e.value)


def _topo():
    res = resolve_path("hot-expert", ["cluster.nodes=2"])      # 16 H100, 2 nodes
    topo = res.topology
    gpus = list(topo.gpus)
    return topo, gpus, [topo.host_of(g) for g in gpus]


def test_link_bytes_past_2_53_bytes_hold_sums_in_runs():
    # whole bytes past 2**53 in all: held sums go onto the links in runs; every link's
    # count is the exact integer sum to float64 rounding (one rounding per run)
    topo, gpus, hosts = _topo()
    group = tuple(range(16))
    lb = LinkBytes(topo, gpus, hosts, mirrors={r: (r,) for r in range(16)})   # 2 copies
    m = np.full((16, 16), 2.0 ** 40)
    np.fill_diagonal(m, 0.0)
    exact = [0] * len(topo.link_names)
    for _ in range(40):            # 40 x 2 x 240 x 2**40 = 2.1e16 bytes > 2**53
        lb.a2a(group, m)
        for _ in range(2):
            for i in range(16):
                for j in range(16):
                    if i != j:
                        for lk in topo.route(gpus[i], gpus[j]):
                            exact[lk] += 2 ** 40
    assert lb._runs > 0 and not lb._fractional
    np.testing.assert_allclose(lb.bytes, np.array(exact, dtype=float), rtol=1e-15)


def test_link_bytes_sends_added_at_once_equal_one_by_one():
    topo, gpus, hosts = _topo()
    a = LinkBytes(topo, gpus, hosts, mirrors={0: (8,), 1: (9,)})
    b = LinkBytes(topo, gpus, hosts, mirrors={0: (8,), 1: (9,)})
    for nbytes in (1.5, 3.0e6, 0.25):      # fractional bytes: added at once, in order
        a.sends([0, 1], [2, 3], nbytes)
        for x, y in ((0, 2), (1, 3)):
            b.p2p(x, y, nbytes)
    assert a.bytes.tobytes() == b.bytes.tobytes()
    assert a.bytes.sum() > 0
