"""Placement of experts on EP ranks and the split of tokens between replicas."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.gating import ReplicaSpec, make_placement


def test_contiguous_placement():
    pl = make_placement(8, 4)
    assert pl.home.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert pl.experts_on(2) == (4, 5)
    assert pl.node_of_expert(2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("e,ep", [(8, 3), (256, 48), (6, 4)])
def test_experts_must_divide_by_ep(e, ep):
    with pytest.raises(InputError) as ei:
        make_placement(e, ep, source="scen.yaml")
    assert ei.value.field == "parallel.ep" and ei.value.source == "scen.yaml"
    assert str(e) in ei.value.expected


def test_plain_dispatch_matrix_by_hand():
    pl = make_placement(4, 2)  # experts 0,1 on rank 0; 2,3 on rank 1
    kept = np.array([[1, 2, 3, 4],
                     [5, 6, 7, 8]])
    d, re = pl.split_counts(kept, None)
    assert d.tolist() == [[3, 7], [11, 15]]
    assert re.tolist() == [[6, 8, 0, 0], [0, 0, 10, 12]]


def test_even_replica_split_rotates_remainder_by_source():
    # expert 0 (home rank 0) replicated on rank 3; each source sends 7 tokens to it:
    # 7 = 3 + 3 + 1; source s gives the leftover to holder (s + 0) mod 2:
    # sources 0, 2 → home (rank 0) gets 4, rank 3 gets 3; sources 1, 3 → 3 and 4.
    pl = make_placement(4, 4, [ReplicaSpec(expert=0, ranks=(3,))], "even")
    kept = np.zeros((4, 4), dtype=np.int64)
    kept[:, 0] = 7
    d, re = pl.split_counts(kept, None)
    assert d[:, 0].tolist() == [4, 3, 4, 3]
    assert d[:, 3].tolist() == [3, 4, 3, 4]
    assert re[0, 0] == 14 and re[3, 0] == 14
    assert pl.experts_on(3) == (0, 3)


def test_nearest_replica_split():
    # 8 EP ranks, 4 per node. Expert 0 lives on rank 0 (node 0), replica on rank 5
    # (node 1). Sources on node 1 send everything to rank 5; node 0 to rank 0.
    pl = make_placement(8, 8, [ReplicaSpec(expert=0, ranks=(5,))], "nearest")
    kept = np.zeros((8, 8), dtype=np.int64)
    kept[:, 0] = 10
    d, re = pl.split_counts(kept, 4)
    assert d[:, 0].tolist() == [10, 10, 10, 10, 0, 0, 0, 0]
    assert d[:, 5].tolist() == [0, 0, 0, 0, 10, 10, 10, 10]
    assert re[0, 0] == 40 and re[5, 0] == 40
    # without node information: holders keep their own, others split evenly
    d2, _ = pl.split_counts(kept, None)
    assert d2[0, 0] == 10 and d2[5, 5] == 10 and d2[5, 0] == 0
    assert d2[1, 0] + d2[1, 5] == 10 and abs(d2[1, 0] - d2[1, 5]) == 0


def test_replica_conserves_tokens_under_random_load():
    rng = np.random.default_rng(0)
    pl = make_placement(16, 8, [ReplicaSpec(expert=3, ranks=(4, 6)),
                                ReplicaSpec(expert=9, ranks=(0,))], "even")
    kept = rng.integers(0, 1000, size=(8, 16))
    d, re = pl.split_counts(kept, 4)
    assert np.array_equal(d.sum(axis=1), kept.sum(axis=1))
    assert np.array_equal(re.sum(axis=0), kept.sum(axis=0))
    assert np.array_equal(d.sum(axis=0), re.sum(axis=1))
    # expert 3's tokens split over its 3 holders within one token per source
    shares = np.array([re[1, 3], re[4, 3], re[6, 3]])
    assert shares.max() - shares.min() <= 8


@pytest.mark.parametrize("spec,field", [
    (ReplicaSpec(expert=99, ranks=(1,)), "routing.replicate.expert"),
    (ReplicaSpec(expert=0, ranks=(9,)), "routing.replicate.ranks"),
    (ReplicaSpec(expert=0, ranks=(0,)), "routing.replicate.ranks"),
])
def test_bad_replicas(spec, field):
    with pytest.raises(InputError) as ei:
        make_placement(8, 4, [spec])
    assert ei.value.field == field
