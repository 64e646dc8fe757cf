"""Sampled replicas: a few data-parallel replicas simulated, each standing for a share of
the rest (``engine.replicas: sampled``, ``engine.sampled_replicas: N``; pure).

With ``independent`` replicas every expert-data-parallel replica (one ``edp`` index:
the chains of its tp coordinates) draws its own token routing, so the fast path runs
every chain. ``sampled`` runs ``N`` of them, chosen from the scenario's seed, each
drawing exactly the routing ``independent`` gives it; every other replica is a mirror
of one simulated replica (round-robin in edp order, so each stands for ``edp / N`` or
one more) and copies its timeline, breakdown, token counts and link bytes, as identical
replicas' mirrors do (:mod:`moesim.program.replicas`). The collectives that span
replicas (dense and expert-data-parallel gradient buckets, ZeRO gathers) still run over
every rank on the real topology. With ``N = edp`` nothing is copied and the step is the
independent one, bit for bit.

What it costs: the step waits at the gradient collectives for the slowest replica, and
the slowest of ``N`` draws is a little faster than the slowest of all. The summary's
``sampled_replicas`` shortcut gives the spread of the simulated replicas' pipeline ends
and the gap a normal spread would put between the expected slowest of ``N`` and of
``edp`` draws (:func:`gap_estimate`), as a fraction of the step; the measured error
against simulating every replica is in ``docs/results/scale-any.md``.
"""

from __future__ import annotations

import math

import numpy as np

from moesim.errors import InputError
from moesim.program.replicas import ReplicaMap

#: replicas simulated when ``engine.sampled_replicas`` is not given (the automatic rule:
#: min(edp, AUTO_REPLICAS)); docs/results/scale-any.md measures the step's error
AUTO_REPLICAS = 4
#: the seed stream of the choice of replicas (apart from the routing draws' streams)
STREAM_SAMPLED = 40


def sampled_count(scn, edp: int) -> int:
    """Replicas to simulate: ``engine.sampled_replicas`` (1..edp) or the automatic rule;
    a count over ``edp`` is an InputError naming the field."""
    n = scn.engine.sampled_replicas
    if n is None:
        return min(edp, AUTO_REPLICAS)
    if not 1 <= n <= edp:
        raise InputError(scn.source, "engine.sampled_replicas",
                         f"an integer from 1 to {edp} (the expert-data-parallel replicas "
                         "of this layout)", n)
    return int(n)


def chosen_replicas(seed: int, edp: int, n: int) -> list[int]:
    """The ``n`` edp indices simulated, sorted: all of them for ``n = edp``, else drawn
    without replacement from ``(seed, STREAM_SAMPLED)``."""
    if n >= edp:
        return list(range(edp))
    rng = np.random.default_rng([int(seed), STREAM_SAMPLED, edp, n])
    return sorted(int(x) for x in rng.choice(edp, size=n, replace=False))


def sampled_map(layout, chosen: list[int]) -> ReplicaMap:
    """Representatives of sampled replicas: per expert-data-parallel group (the ranks
    differing only in their edp index), the members with a chosen edp index stand for
    themselves; the others are mirrors of the chosen ones in turn, in edp order."""
    world = layout.world
    rep = np.arange(world, dtype=np.int64)
    mirrors: dict[int, tuple[int, ...]] = {}
    edp = layout.coords["edp"]
    chosen_set = set(chosen)
    for g in layout.edp_groups:
        members = sorted(g, key=lambda r: int(edp[r]))
        heads = [m for m in members if int(edp[m]) in chosen_set]
        rest = [m for m in members if int(edp[m]) not in chosen_set]
        share: dict[int, list[int]] = {int(h): [] for h in heads}
        for i, m in enumerate(rest):
            h = int(heads[i % len(heads)])
            share[h].append(int(m))
            rep[m] = h
        for h, ms in share.items():
            if ms:
                mirrors[h] = tuple(ms)
    return ReplicaMap(rep=rep, mirrors=mirrors)


def expected_max(n: int) -> float:
    """E[max of n standard normal draws] (numerical integral; 0 for n = 1)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-8.0, 8.0, 4001)
    cdf = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1), x))


def gap_estimate(ends: list[float], edp: int) -> float | None:
    """Seconds by which the slowest of ``edp`` replicas would pass the slowest of the
    simulated ones, were replica ends normal with the spread of ``ends`` (one per
    simulated replica): std × (E[max of edp] − E[max of N]). None with fewer than two."""
    if len(ends) < 2:
        return None
    sd = float(np.std(np.asarray(ends, dtype=float), ddof=1))
    return sd * (expected_max(edp) - expected_max(len(ends)))


def shortcut(n: int, edp: int, chosen: list[int], ends: list[float], step: float) -> dict:
    """The summary's ``sampled_replicas`` shortcut."""
    gap = gap_estimate(ends, edp)
    spread = (max(ends) - min(ends)) / step if ends and step > 0 else 0.0
    return {"name": "sampled_replicas", "simulated_replicas": n, "replicas": edp,
            "chosen_edp": chosen,
            "detail": f"engine.replicas=sampled: {n} of {edp} expert-data-parallel replicas "
                      "draw their own routing and run; each other replica copies one of them "
                      "(round-robin) and joins the DP collectives on the real topology; "
                      f"their pipeline ends spread {100 * spread:.3f} % of the step",
            "bound": ("exact (every replica simulated)" if n >= edp else
                      "the slowest replica may be missed: a normal spread puts the slowest "
                      f"of {edp} {100 * gap / step:.3f} % of the step after the slowest of "
                      f"{n}" if gap is not None and step > 0 else
                      "unmeasured with one replica (measured: docs/results/scale-any.md)")}
