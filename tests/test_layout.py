"""Layout: coordinates and groups worked out by hand, Megatron-Core semantics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from moesim.errors import InputError
from moesim.layout.mesh import Layout

# world 16 = tp2 * pp2 * dp4, ep2, etp2 -> edp = 16 / (2*2*2) = 2. Default order tp, ep,
# dp, pp; the expert generator (etp=2, ep=2, edp=2, pp=2): rank = etp + 2*ep + 4*edp + 8*pp,
# the attention one (tp=2, dp=4, pp=2): rank = tp + 2*dp + 8*pp, so dp = ep + 2*edp
SMALL = dict(world=16, tp=2, pp=2, dp=4, ep=2, etp=2)


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
    lay = Layout(world=48, tp=2, pp=3, dp=8, ep=4, etp=2)
    for kind, size in (("tp", 2), ("ep", 4), ("dp", 8), ("edp", 2), ("pp", 3), ("etp", 2)):
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


@pytest.mark.parametrize("kw, field", [
    (dict(world=16, tp=2, pp=2, dp=3, ep=1), "parallel.dp"),     # 2*2*3 != 16
    (dict(world=16, tp=2, pp=2, dp=4, ep=3), "parallel.ep"),     # 3 does not divide tp*dp 8
    (dict(world=16, tp=2, pp=2, dp=4, ep=16), "parallel.ep"),    # 16 > tp*cp*dp = 8
    (dict(world=16, tp=2, pp=2, dp=4, ep=4, etp=4), "parallel.etp"),  # 16 > 8
    (dict(world=16, tp=2, pp=2, dp=4, ep=1, etp=0), "parallel.etp"),
    (dict(world=16, tp=2, pp=2, dp=2, ep=1, cp=2, order=("tp", "cp")), "parallel.order"),
    (dict(world=16, tp=2, pp=2, dp=3, ep=1, cp=2), "parallel.dp"),   # 2*2*2*3 != 16
    (dict(world=16, tp=0, pp=2, dp=4, ep=1), "parallel.tp"),
    # pp before dp: the expert pipeline groups (stride etp*ep = 4) differ from the attention ones
    (dict(world=16, tp=2, pp=2, dp=4, ep=4, order=("tp", "ep", "pp", "dp")), "parallel.order"),
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
    # etp = tp and ep, dp adjacent: the old carve-EP-out-of-DP layout, one mixed radix
    assume(abs(order.index("ep") - order.index("dp")) == 1 and order[-1] == "pp")
    dp = ep * edp
    lay = Layout(world=tp * pp * dp, tp=tp, pp=pp, dp=dp, ep=ep, etp=tp, order=tuple(order))
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


# ---- Megatron-Core parallel folding, worked by hand from order tp-cp-ep-dp-pp ----------

def test_folded_ep_spans_tp_ranks_by_hand():
    # world 8, tp2 pp1 dp4; etp1 ep4 -> edp = 8 / 4 = 2.
    # attention: rank = tp + 2*dp; experts: rank = ep + 4*edp (etp = 1 takes no stride)
    lay = Layout(world=8, tp=2, pp=1, dp=4, ep=4)
    assert lay.tp_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert lay.dp_groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert lay.ep_groups == ((0, 1, 2, 3), (4, 5, 6, 7))      # EP spans the TP pairs
    assert lay.edp_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert lay.etp_groups == tuple((r,) for r in range(8))
    c = lay.coord(5)   # 5 = tp 1 + 2*dp 2 = ep 1 + 4*edp 1
    assert (c.tp, c.dp, c.ep, c.edp, c.etp, c.cp) == (1, 2, 1, 1, 0, 0)


def test_etp_and_cp_groups_by_hand():
    # world 16 = tp2 cp2 dp2 pp2; etp2 ep2 -> edp = 16 / (2*2*2) = 2.
    # attention: rank = tp + 2*cp + 4*dp + 8*pp; experts: rank = etp + 2*ep + 4*edp + 8*pp
    lay = Layout(world=16, tp=2, pp=2, dp=2, ep=2, cp=2, etp=2)
    assert lay.megatron_order == "tp-cp-ep-dp-pp"
    assert lay.cp_groups[:3] == ((0, 2), (1, 3), (4, 6))
    assert lay.dp_groups[:3] == ((0, 4), (1, 5), (2, 6))
    assert lay.dp_cp_groups[:2] == ((0, 2, 4, 6), (1, 3, 5, 7))  # gradient reduction
    assert lay.ep_groups[:2] == ((0, 2), (1, 3))                   # EP spans the CP ranks
    assert lay.etp_groups[:2] == ((0, 1), (2, 3))
    assert lay.edp_groups[:2] == ((0, 4), (1, 5))
    assert lay.pp_groups[0] == (0, 8)
    assert lay.group_of(13, "cp") == (13, 15) and lay.group_of(13, "ep") == (13, 15)
    c = lay.coord(13)  # 13 = 1 + 2*0 + 4*1 + 8*1
    assert (c.tp, c.cp, c.dp, c.pp, c.etp, c.ep, c.edp) == (1, 0, 1, 1, 1, 0, 1)


def test_cp_placed_in_order_by_hand():
    # order tp-ep-dp-cp-pp: cp outside dp. world 8 = tp2 dp2 cp2: rank = tp + 2*dp + 4*cp
    lay = Layout(world=8, tp=2, dp=2, cp=2, ep=1, order=("tp", "ep", "dp", "cp", "pp"))
    assert lay.cp_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert lay.dp_groups == ((0, 2), (1, 3), (4, 6), (5, 7))


def test_qwen3_recipe_folds():
    # Megatron-Core recipe for Qwen3-235B-A22B: TP2 PP8 EP32 on 256 GPUs -> DP16, EDP1
    lay = Layout(world=256, tp=2, pp=8, dp=16, ep=32)
    assert lay.edp == 1
    assert lay.ep_groups[0] == tuple(range(32))      # 4 nodes, spanning the TP pairs
    assert lay.group_of(37, "tp") == (36, 37) and lay.group_of(37, "pp")[0] == 5
    lay2 = Layout(world=256, tp=2, pp=8, dp=16, ep=16, etp=2)
    assert lay2.edp == 1 and lay2.group_of(37, "etp") == (36, 37)
    assert lay2.group_of(37, "ep") == tuple(range(33, 64, 2))


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2, 4]),
       etp=st.sampled_from([1, 2]))
def test_folding_partitions_every_stage(tp, cp, pp, dp, ep, etp):
    assume((tp * cp * dp) % (ep * etp) == 0)
    lay = Layout(world=tp * cp * pp * dp, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp)
    assert lay.etp * lay.ep * lay.edp == tp * cp * dp
    for kind in ("tp", "cp", "dp", "dp_cp", "pp", "ep", "etp", "edp"):
        members = sorted(r for g in lay._groups_of(kind) for r in g)
        assert members == list(range(lay.world))
    for r in range(lay.world):
        stage = {lay.coord(x).pp for k in ("ep", "etp", "edp", "tp", "cp", "dp")
                 for x in lay.group_of(r, k)}
        assert stage == {lay.coord(r).pp}   # only pp groups cross stages
        assert set(lay.group_of(r, "ep")) & set(lay.group_of(r, "edp")) == {r}
