"""Layout: coordinates and groups worked out by hand, Megatron-Core semantics."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from moesim.errors import InputError
from moesim.layout.mesh import Layout

# world 16 = tp2 * pp2 * dp4, ep2 -> edp2. Default order tp, ep, dp(edp), pp:
# rank = tp + 2*ep + 4*edp + 8*pp
SMALL = dict(world=16, tp=2, pp=2, dp=4, ep=2)


def test_small_coordinates_by_hand():
    lay = Layout(**SMALL)
    c = lay.coord(13)  # 13 = 1 + 2*0 + 4*1 + 8*1
    assert (c.tp, c.ep, c.edp, c.pp) == (1, 0, 1, 1)
    assert c.dp == 0 + 2 * 1  # dense dp index = ep + ep_size * edp
    c = lay.coord(6)  # 6 = 0 + 2*1 + 4*1 + 0
    assert (c.tp, c.ep, c.edp, c.dp, c.pp) == (0, 1, 1, 3, 0)
    assert lay.edp == 2
    assert list(lay.stage_of_rank) == [0] * 8 + [1] * 8


def test_small_groups_by_hand():
    lay = Layout(**SMALL)
    assert lay.tp_groups == tuple((2 * i, 2 * i + 1) for i in range(8))
    assert lay.ep_groups == ((0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15))
    assert lay.edp_groups == ((0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14),
                              (11, 15))
    assert lay.dp_groups == ((0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15))
    assert lay.pp_groups == tuple((i, i + 8) for i in range(8))
    assert lay.pipeline_neighbours(5) == (None, 13)
    assert lay.pipeline_neighbours(13) == (5, None)
    assert lay.group_of(6, "ep") == (4, 6)
    assert lay.group_of(6, "dp") == (0, 2, 4, 6)


def test_dp_inner_to_ep_order():
    # order tp, dp(edp), ep, pp: rank = tp + 2*edp + 4*ep + 8*pp
    lay = Layout(**SMALL, order=("tp", "dp", "ep", "pp"))
    assert lay.ep_groups[0] == (0, 4)
    assert lay.edp_groups[0] == (0, 2)
    c = lay.coord(6)  # 6 = 0 + 2*1 + 4*1
    assert (c.edp, c.ep) == (1, 1)
    assert c.dp == 1 + 2 * 1  # edp inner: dp = edp + edp_size * ep
    assert lay.dp_groups[0] == (0, 2, 4, 6)


def test_groups_partition_the_world():
    lay = Layout(world=48, tp=2, pp=3, dp=8, ep=4)
    for kind, size in (("tp", 2), ("ep", 4), ("dp", 8), ("edp", 2), ("pp", 3)):
        groups = lay._groups_of(kind)
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(48))
    # the ep and edp groups of a rank intersect only in that rank, and both lie in its dp group
    for r in range(48):
        ep, edp, dp = (set(lay.group_of(r, k)) for k in ("ep", "edp", "dp"))
        assert ep & edp == {r}
        assert ep | edp <= dp
        # every member of a rank's groups has the same pp stage except in its pp group
        assert len({lay.coord(x).pp for x in dp}) == 1


def test_deepseek_v3_layout_sizes():
    t0 = time.perf_counter()
    lay = Layout(world=2048, tp=1, pp=16, dp=128, ep=64)  # DeepSeek-V3 report §3.2
    assert lay.edp == 2
    assert len(lay.pp_groups) == 128 and all(len(g) == 16 for g in lay.pp_groups)
    assert len(lay.ep_groups) == 32 and all(len(g) == 64 for g in lay.ep_groups)
    assert len(lay.edp_groups) == 1024 and lay.edp_groups[0] == (0, 64)
    assert len(lay.dp_groups) == 16 and lay.dp_groups[0] == tuple(range(128))
    stages = np.asarray(lay.stage_of_rank)
    assert [int((stages == s).sum()) for s in range(16)] == [128] * 16
    # EP64 spans 8 nodes of 8 GPUs
    assert len({r // 8 for r in lay.ep_groups[0]}) == 8
    assert lay.pipeline_neighbours(128) == (0, 256)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("kw, field", [
    (dict(world=16, tp=2, pp=2, dp=3, ep=1), "parallel.dp"),     # 2*2*3 != 16
    (dict(world=16, tp=2, pp=2, dp=4, ep=3), "parallel.ep"),     # 3 does not divide dp 4
    (dict(world=16, tp=0, pp=2, dp=4, ep=1), "parallel.tp"),
    (dict(world=16, tp=2, pp=2, dp=4, ep=1, order=("tp", "ep", "pp", "dp")), "parallel.order"),
    (dict(world=16, tp=2, pp=2, dp=4, ep=2, order=("tp", "ep", "dp")), "parallel.order"),
])
def test_bad_layouts_raise_input_error(kw, field):
    with pytest.raises(InputError) as err:
        Layout(**kw, source="x.yaml")
    assert err.value.field == field and err.value.source == "x.yaml"


def test_experts_must_split_over_ep():
    lay = Layout(world=16, tp=1, pp=1, dp=16, ep=16)
    lay.check_experts(256)
    with pytest.raises(InputError) as err:
        lay.check_experts(8)
    assert err.value.field == "parallel.ep" and "8 routed experts" in err.value.expected


def test_tp_crossing_node_warns():
    assert Layout(world=16, tp=8, pp=1, dp=2).warnings(gpus_per_node=8) == []
    w = Layout(world=16, tp=4, pp=1, dp=4).warnings(gpus_per_node=2)
    assert len(w) == 1 and "4 of 4 tensor-parallel groups" in w[0]
    # tp=8 order with tp outermost: every group strides over nodes
    w = Layout(world=16, tp=2, pp=1, dp=8, order=("ep", "dp", "tp", "pp")).warnings(8)
    assert "8 of 8" in w[0]




@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3]), ep=st.sampled_from([1, 2, 4]),
       edp=st.sampled_from([1, 2, 3]), order=st.permutations(["tp", "ep", "dp", "pp"]))
def test_coordinates_round_trip(tp, pp, ep, edp, order):
    assume(abs(order.index("ep") - order.index("dp")) == 1)
    dp = ep * edp
    lay = Layout(world=tp * pp * dp, tp=tp, pp=pp, dp=dp, ep=ep, order=tuple(order))
    sizes = {"tp": tp, "ep": ep, "dp": edp, "pp": pp}
    seen = set()
    for r in range(lay.world):
        c = lay.coord(r)
        vals = {"tp": c.tp, "ep": c.ep, "dp": c.edp, "pp": c.pp}
        # rank = mixed-radix number in the given order, innermost first
        rank, stride = 0, 1
        for d in order:
            rank += vals[d] * stride
            stride *= sizes[d]
        assert rank == r
        seen.add((c.tp, c.dp, c.pp))
        assert lay.group_of(r, "dp")[c.dp] == r  # dense dp index is the position in its group
        assert lay.group_of(r, "pp")[c.pp] == r
        assert lay.group_of(r, "ep")[c.ep] == r
    assert len(seen) == lay.world  # (tp, dp, pp) identifies a rank
