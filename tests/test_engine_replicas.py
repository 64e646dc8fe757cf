"""MirroredNetwork: the mirrors' copies of a representative's flows load shared links
exactly as the real replicas would (hand-computed max-min times)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from moesim.engine.exact.mirrored import MirroredNetwork
from moesim.network import FlowNetwork

GB = 1e9


class TwoLeaves:
    """g0, g2 on leaf A; g1, g3 on leaf B; one A->B link shared by both pairs.
    Links: 0 g0->A, 1 g2->A, 2 A->B, 3 B->g1, 4 B->g3; 100 GB/s each, no latency."""

    capacity_Bps = np.full(5, 100 * GB)
    latency_s = np.zeros(5)
    link_names = ["g0->A", "g2->A", "A->B", "B->g1", "B->g3"]
    link_kinds = ["nvlink"] * 5
    paths = {("g0", "g1"): (0, 2, 3), ("g2", "g3"): (1, 2, 4)}

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        return self.paths[(src, dst)]


def run_one(tag, full: bool) -> tuple[float, MirroredNetwork]:
    env = simpy.Environment()
    net = MirroredNetwork(FlowNetwork(env, TwoLeaves()), {"g0": ("g2",), "g1": ("g3",)})
    if full:
        net.full_keys.add(tag)
    done = []
    net.transfer("g0", "g1", 1 * GB, tag=tag).callbacks.append(lambda e: done.append(env.now))
    env.run()
    return done[0], net


def test_mirror_copy_shares_the_link_and_halves_the_rate():
    # the copy g2->g3 shares A->B: both get 50 GB/s, 1 GB takes 20 ms
    t, net = run_one(("disp", 0), full=False)
    assert t == pytest.approx(0.020, rel=1e-12)
    assert net.n_mirrored == 1
    # A->B carried both gigabytes, each edge link one
    assert net.link_bytes().tolist() == pytest.approx([GB, GB, 2 * GB, GB, GB])


def test_collective_run_in_full_is_not_copied():
    # a collective whose group holds the mirrors already has their flows: no copy, 10 ms
    t, net = run_one(("dp", "dense", 0, 0), full=True)
    assert t == pytest.approx(0.010, rel=1e-12)
    assert net.n_mirrored == 0
    assert net.link_bytes()[[1, 4]].tolist() == [0.0, 0.0]
