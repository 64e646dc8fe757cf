"""Sampling k distinct experts with exact inclusion probabilities (moesim.gating.sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.gating.sampling import (
    TICKS,
    cap_probs,
    sample_counts,
    sample_counts_fast,
    sample_tokens,
    to_ticks,
)


def test_cap_probs_hand_example():
    # weights 10:1:...:1 over 8 experts, k = 2: 2·10/17 > 1, so expert 0 is capped
    # at 1 and the other 7 share the remaining 1 equally: 1/7 each.
    pi = cap_probs(np.array([10.0, 1, 1, 1, 1, 1, 1, 1]), 2)
    assert pi[0] == 1.0
    np.testing.assert_allclose(pi[1:], 1 / 7)
    np.testing.assert_allclose(pi.sum(), 2.0)


def test_cap_probs_uncapped_is_proportional():
    pi = cap_probs(np.array([1.0, 2.0, 3.0, 4.0]), 1)
    np.testing.assert_allclose(pi, [0.1, 0.2, 0.3, 0.4])


def test_to_ticks_sums_exactly():
    rng = np.random.default_rng(5)
    pi = cap_probs(rng.random((50, 37)), 5)
    q = to_ticks(pi, 5)
    assert np.all(q.sum(axis=1) == 5 * TICKS)
    assert np.all(q <= TICKS) and np.all(q >= 0)


def test_tokens_pick_k_distinct_experts():
    rng = np.random.default_rng(0)
    pi = cap_probs(np.random.default_rng(1).dirichlet(np.full(16, 0.3)), 4)
    chosen = sample_tokens(rng, np.broadcast_to(pi, (5000, 16)), 4)
    assert chosen.shape == (5000, 4)
    s = np.sort(chosen, axis=1)
    assert np.all(np.diff(s, axis=1) > 0)  # distinct
    assert chosen.min() >= 0 and chosen.max() < 16


def test_certain_and_impossible_experts():
    # pi = 1 means every token picks it; pi = 0 means none does.
    pi = np.array([1.0, 0.0, 0.5, 0.5])
    rng = np.random.default_rng(3)
    chosen = sample_tokens(rng, np.broadcast_to(pi, (1000, 4)), 2)
    counts = np.bincount(chosen.ravel(), minlength=4)
    assert counts[0] == 1000 and counts[1] == 0 and counts[2] + counts[3] == 1000
    c = sample_counts(rng, np.array([1000, 3, 0]), pi, 2)
    assert c[:, 0].tolist() == [1000, 3, 0] and c[:, 1].tolist() == [0, 0, 0]


def test_token_inclusion_matches_pi_within_binomial_bound():
    # each expert's count over T tokens is Binomial(T, pi_e): |count - T·pi| < 5 sd
    pi = np.array([0.6] + [0.2] * 7)  # k = 2
    t = 40000
    chosen = sample_tokens(np.random.default_rng(11), np.broadcast_to(pi, (t, 8)), 2)
    counts = np.bincount(chosen.ravel(), minlength=8)
    sd = np.sqrt(t * pi * (1 - pi))
    assert np.all(np.abs(counts - t * pi) < 5 * sd)


@pytest.mark.parametrize("shared", [True, False])
def test_counts_conserve_tokens_and_respect_n(shared):
    rng = np.random.default_rng(2)
    n = rng.integers(0, 5000, size=40)
    pi_rows = cap_probs(rng.dirichlet(np.full(64, 0.2), size=40), 8)
    pi = pi_rows[0] if shared else pi_rows
    c = sample_counts(rng, n, pi, 8)
    assert c.shape == (40, 64) and c.dtype == np.int64
    assert np.all(c.sum(axis=1) == 8 * n)
    assert np.all(c >= 0) and np.all(c <= n[:, None])


def test_counts_path_has_binomial_marginals_like_token_path():
    # Both paths: count of expert e over n tokens ~ Binomial(n, pi_e).
    # Over R = 3000 groups of n = 50, the sample mean is within 5 sd/sqrt(R) of n·pi
    # and the sample variance within 15 % of n·pi·(1-pi).
    pi = np.array([0.9, 0.5, 0.3, 0.2, 0.1])  # k = 2
    r_, n = 3000, 50
    c = sample_counts(np.random.default_rng(7), np.full(r_, n), pi, 2)
    var = n * pi * (1 - pi)
    assert np.all(np.abs(c.mean(axis=0) - n * pi) < 5 * np.sqrt(var / r_))
    np.testing.assert_allclose(c.var(axis=0), var, rtol=0.15)
    tok = sample_tokens(np.random.default_rng(8), np.broadcast_to(pi, (r_ * n, 5)), 2)
    ct = np.stack([np.bincount(g.ravel(), minlength=5) for g in tok.reshape(r_, n, 2)])
    assert np.all(np.abs(ct.mean(axis=0) - n * pi) < 5 * np.sqrt(var / r_))
    np.testing.assert_allclose(ct.var(axis=0), var, rtol=0.15)


@pytest.mark.parametrize("n", [0, 3, 40, 4096])
def test_fast_counts_invariants(n):
    rng = np.random.default_rng(6)
    pi = cap_probs(rng.dirichlet(np.full(64, 0.5), size=30), 8)
    nn = np.full(30, n)
    nn[::3] = rng.integers(0, 5000, size=10)
    c = sample_counts_fast(rng, nn, pi, 8)
    assert c.dtype == np.int64 and c.shape == (30, 64)
    assert np.all(c.sum(axis=1) == 8 * nn)
    assert np.all(c >= 0) and np.all(c <= nn[:, None])


def test_fast_counts_moments_match_token_path():
    # mean n·pi and variance n·pi·(1-pi) (exact for the per-token path); covariance
    # of two equal-share experts is negative, as a k-subset requires:
    # uniform pi = k/E gives -n·d/(E-1) exactly, d = pi(1-pi) = 0.1875 for E=8, k=2.
    pi = np.full(8, 0.25)
    r_, n = 20000, 400
    c = sample_counts_fast(np.random.default_rng(12), np.full(r_, n), pi, 2)
    var = n * 0.1875
    assert np.all(np.abs(c.mean(axis=0) - n * 0.25) < 5 * np.sqrt(var / r_))
    np.testing.assert_allclose(c.var(axis=0), var, rtol=0.05)
    cov = np.cov(c[:, 0], c[:, 1])[0, 1]
    assert abs(cov - (-var / 7)) < 0.15 * var / 7


def test_fast_counts_no_equal_arc_artifact():
    # Uniform shares pi = 8/256: the systematic counts give experts with the same arc
    # equal counts, so every count value occurs a multiple of 8 times per source.
    t = np.full(64, 4096)
    pi = np.full(256, 1 / 32)
    sys_c = sample_counts(np.random.default_rng(1), t, pi, 8)
    assert all(m % 8 == 0 for m in np.unique(sys_c[0], return_counts=True)[1])
    fast = sample_counts_fast(np.random.default_rng(1), t, pi, 8)
    assert not all(m % 8 == 0 for m in np.unique(fast[0], return_counts=True)[1])
    # Load of an EP rank holding 4 experts, per source: for a uniform random 8-subset
    # Var = n·d·(4 - 12/255), d = (1/32)(31/32). 64 sources × 64 ranks = 4096 samples:
    # the sample variance is within 10 % (4.5 sd).
    rank = fast.reshape(64, 64, 4).sum(axis=2)
    want = 4096 * (1 / 32) * (31 / 32) * (4 - 12 / 255)
    assert abs(rank.var() / want - 1) < 0.10


def test_same_seed_same_draws():
    pi = cap_probs(np.arange(1.0, 33.0), 4)
    a = sample_counts(np.random.default_rng([1, 2, 3]), np.full(8, 999), pi, 4)
    b = sample_counts(np.random.default_rng([1, 2, 3]), np.full(8, 999), pi, 4)
    assert a.tobytes() == b.tobytes()


# ---- issue 23: counts against expectation in every regime of tokens per source --------
def _chi2_bound(df: int) -> float:
    """A bound the statistic passes with probability > 1 - 1e-6 (Wilson-Hilferty)."""
    z = 4.9
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def _pi(kind: str, e: int, k: int) -> np.ndarray:
    if kind == "uniform":
        return np.full(e, k / e)
    if kind == "zipf":
        return cap_probs(1.0 / np.arange(1, e + 1) ** 1.0, k)   # expert 0 capped at 1
    return cap_probs(np.random.default_rng(3).dirichlet(np.full(e, 0.3)), k)


@pytest.mark.parametrize("kind", ["uniform", "zipf", "dirichlet"])
@pytest.mark.parametrize("n", [1, 3, 16, 64, 300, 4096])
def test_fast_counts_match_expectation_chi_square(kind, n):
    # Totals over R sources of n tokens: each expert's total is a sum of independent
    # Binomial(n, pi_e), so z_e = (count - N·pi_e) / sqrt(N·pi_e(1-pi_e)) is ~N(0, 1)
    # and Σ z² is at most chi-square with E degrees of freedom (the k picks per token
    # make the z's negatively correlated, which only lowers it). n = 1..64 is the sparse
    # regime (decode), 300 mixed for the skewed shares, 4096 Gaussian.
    e, k = 256, 8
    pi = _pi(kind, e, k)
    rows = max(64, 20_000 // n)
    rng = np.random.default_rng(n)
    c = sample_counts_fast(rng, np.full(rows, n), pi, k)
    assert np.all(c.sum(axis=1) == k * n) and c.min() >= 0 and c.max() <= n
    tot, big_n = c.sum(axis=0), rows * n
    var = big_n * pi * (1 - pi)
    live = var > 0
    z = (tot - big_n * pi)[live] / np.sqrt(var[live])
    assert (z ** 2).sum() < _chi2_bound(int(live.sum())), (z ** 2).sum()
    # |z| is near-Gaussian only where an expert expects a few tokens or more: one of
    # mean 0.1 that gets 2 (a Poisson tail of ~0.5 %) has z = 6, so the bound skips those
    well = (big_n * pi)[live] >= 5
    assert np.abs(z[well]).max() < 5.5
    assert np.all(tot[~live & (pi >= 1)] == big_n)


@pytest.mark.parametrize("n", [1, 4, 64])
def test_sparse_rows_give_the_last_expert_its_share(n):
    # the bug of issue 23: rows with no Gaussian entry put their residual on the last
    # expert (DeepSeek-V3 decode, 64 tokens per source: expert 255 ~6x its neighbours)
    pi = np.full(256, 1 / 32)
    c = sample_counts_fast(np.random.default_rng(0), np.full(131072 // n, n), pi, 8)
    tot = c.sum(axis=0)         # mean 4096 per expert, sd ~63
    mean = tot.mean()
    assert tot[-1] < mean + 6 * np.sqrt(mean) and tot.max() < 1.25 * mean


def test_sparse_rows_variance_and_covariance_of_a_k_subset():
    # per source, one expert's count has Var = n·pi(1-pi) and two experts' covariance is
    # negative (a uniform k-subset: -n·d/(E-1)); a shared circle order would make
    # coincident arcs' counts equal (covariance +n·d for those pairs)
    e, k, n, rows = 16, 2, 8, 40_000
    pi = np.full(e, k / e)
    c = sample_counts_fast(np.random.default_rng(9), np.full(rows, n), pi, k)
    d = (k / e) * (1 - k / e)
    np.testing.assert_allclose(c.var(axis=0), n * d, rtol=0.05)
    cov = np.cov(c.T)
    off = cov[~np.eye(e, dtype=bool)]
    assert abs(off.mean() - (-n * d / (e - 1))) < 0.02 * n * d
    assert off.max() < 0.1 * n * d
