"""Vocabulary-parallel LM head: distributed top-k against numpy's global top-k, the
candidates each rank receives, both shardings' bytes by hand, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.cli import main
from moesim.serve.head import dist_topk, head_bytes


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 8), batch=st.integers(1, 4),
       k=st.integers(1, 6), extra=st.integers(0, 20), ties=st.booleans())
def test_dist_topk_equals_numpy_global_topk(seed, n, batch, k, extra, ties):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(k, k + extra + 1, size=n)        # every shard holds >= k entries
    vocab = int(sizes.sum())
    logits = (rng.integers(0, 5, size=(batch, vocab)).astype(float) if ties
              else rng.standard_normal((batch, vocab)))
    shards = np.split(logits, np.cumsum(sizes)[:-1], axis=1)
    out = dist_topk(shards, k)
    # numpy's global top-k: largest values first, ties to the smaller id
    ref_ids = np.array([sorted(range(vocab), key=lambda j: (-row[j], j))[:k] for row in logits])
    assert np.array_equal(out["ids"], ref_ids)
    assert np.array_equal(out["values"], np.take_along_axis(logits, ref_ids, axis=1))
    # softmax from the all-reduced max and sum of exponentials
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert np.allclose(out["probs"], np.take_along_axis(p, ref_ids, axis=1), rtol=1e-12)
    # each rank receives the other n - 1 ranks' k candidates
    assert out["gathered_per_rank"] == [k * (n - 1)] * n


def test_head_bytes_by_hand():
    V, h, B, k, n = 129280, 7168, 128, 50, 8
    b = head_bytes(V, h, B, k, n)
    vs, hs = b["vocab_sharded"], b["hidden_sharded"]
    assert vs["all_reduce_max_bytes"] == vs["all_reduce_sumexp_bytes"] == 128 * 4
    # all-gather size (nccl-tests S): 8 ranks · 128 tokens · 50 · (fp32 value + int32 id)
    assert vs["all_gather_bytes"] == 8 * 128 * 50 * 8 == 409600
    # ring: all-reduce sends 2·7/8·S, all-gather 7/8·S per rank
    assert vs["sent_per_rank_bytes"] == 2 * (2 * 7 / 8 * 512) + 7 / 8 * 409600
    assert vs["gathered_elements_per_rank"] == 50 * 7 * 128
    assert hs["all_reduce_logits_bytes"] == 128 * 129280 * 4
    assert hs["sent_per_rank_bytes"] == 2 * 7 / 8 * 128 * 129280 * 4


def test_collective_dist_topk_cli(capsys):
    assert main(["collective", "--topology", "dgx-h100", "--op", "dist_topk", "--vocab",
                 "129280", "--k", "50", "--batch", "128", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    vs, hs = r["vocab_sharded"], r["hidden_sharded"]
    assert r["ranks"] == 8 and vs["gathered_elements_per_rank"] == 50 * 7 * 128
    assert vs["time_s"] == pytest.approx(vs["all_reduce_max_s"] + vs["all_reduce_sumexp_s"]
                                         + vs["all_gather_s"])
    assert 0 < vs["time_s"] < hs["time_s"]        # 1 KB + 400 KB against 66 MB
    assert main(["collective", "--topology", "dgx-h100", "--op", "dist_topk", "--vocab",
                 "129280", "--k", "50", "--batch", "128"]) == 0
    assert "hidden-sharded" in capsys.readouterr().out


@pytest.mark.parametrize("args, field", [
    (["--k", "50", "--batch", "8"], "--vocab"),
    (["--vocab", "100", "--k", "0", "--batch", "8"], "--k"),
    (["--vocab", "100", "--k", "20", "--batch", "8"], "--k"),     # > 100 / 8 per rank
    (["--vocab", "100", "--k", "5", "--batch", "-1"], "--batch"),
])
def test_dist_topk_bad_input_one_line(capsys, args, field):
    assert main(["collective", "--topology", "dgx-h100", "--op", "dist_topk", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"command line: {field}:" in err
