"""The vocabulary-parallel LM head and its distributed top-k sampler.

Vocabulary sharding (Megatron-LM, Shoeybi et al. 2019 §3, the output embedding split
along the vocabulary): rank i of n holds rows ``[i·V/n, (i+1)·V/n)`` of the head and
computes those logits for every token. Sampling then needs, per token:

1. the global maximum (softmax's stabiliser): an all-reduce (max) of one fp32 value;
2. the sum of ``exp(x - max)``: an all-reduce (sum) of one fp32 value;
3. the top k: each rank's local top k with *global* ids, all-gathered (k values and k
   ids per rank), then the top k of the ``n·k`` candidates. Exact: an entry of the global
   top k is larger than all but at most k-1 entries anywhere, so in particular in its own
   shard, so it is in its shard's top k. Each rank receives ``k·(n-1)`` candidates.

Against it, hidden-dimension sharding: rank i holds columns ``[i·h/n, (i+1)·h/n)`` of the
head, computes partial logits for the whole vocabulary and all-reduces the
vocabulary-sized vector per token (``V`` fp32 values).

Bytes follow nccl-tests' conventions (NVIDIA nccl-tests doc/PERFORMANCE.md): S is the
per-rank buffer of an all-reduce and the total gathered size of an all-gather; a ring
sends ``2(n-1)/n · S`` per rank for an all-reduce and ``(n-1)/n · S`` for an all-gather.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moesim.errors import InputError

FP32_BYTES = 4     # softmax statistics and logits in fp32
ID_BYTES = 4       # int32 token ids (vocabularies below 2^31)


def local_topk(logits: np.ndarray, k: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, global ids) of the ``k`` largest entries of each row of ``logits`` (a
    shard starting at vocabulary id ``offset``); ties go to the smaller id."""
    b, v = logits.shape
    kk = min(k, v)
    ids = np.broadcast_to(np.arange(v), (b, v))
    order = np.lexsort((ids, -logits), axis=1)[:, :kk]
    return np.take_along_axis(logits, order, axis=1), order + offset


def global_topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference: the top k of the whole vocabulary (ties to the smaller id)."""
    return local_topk(logits, k, 0)


def dist_topk(shards: Sequence[np.ndarray], k: int) -> dict:
    """Distributed top-k over vocabulary shards (each ``(batch, V_i)``, in vocabulary
    order). Returns ``values``/``ids`` (batch, k), the softmax probabilities of those
    ids (``probs``, from the all-reduced max and sum of exponentials), and
    ``gathered_per_rank``: candidates each rank receives per token (k·(n-1))."""
    if not shards or k < 1:
        raise ValueError("need at least one shard and k >= 1")
    offsets = np.cumsum([0] + [s.shape[1] for s in shards[:-1]])
    cand_v, cand_i = zip(*(local_topk(s, k, int(o)) for s, o in zip(shards, offsets,
                                                                     strict=True)),
                         strict=True)
    gmax = np.max([s.max(axis=1) for s in shards], axis=0)           # all-reduce (max)
    sumexp = np.sum([np.exp(s - gmax[:, None]).sum(axis=1) for s in shards], axis=0)
    allv, alli = np.concatenate(cand_v, axis=1), np.concatenate(cand_i, axis=1)
    kk = min(k, sum(s.shape[1] for s in shards))
    order = np.lexsort((alli, -allv), axis=1)[:, :kk]                # top k of candidates
    values = np.take_along_axis(allv, order, axis=1)
    ids = np.take_along_axis(alli, order, axis=1)
    n = len(shards)
    per_rank = [c.shape[1] for c in cand_v]
    return {"values": values, "ids": ids, "probs": np.exp(values - gmax[:, None]) /
            sumexp[:, None], "gathered_per_rank": [sum(per_rank) - p for p in per_rank],
            "ranks": n}


def head_bytes(vocab: int, hidden: int, batch: int, k: int, n: int) -> dict:
    """Communication of the two head shardings for ``batch`` tokens on ``n`` ranks:
    each collective's nccl-tests size S and the bytes a ring sends per rank."""
    for name, v, lo in (("--vocab", vocab, 1), ("--batch", batch, 1), ("--k", k, 1),
                        ("ranks", n, 1), ("hidden", hidden, 1)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
            raise InputError("command line", name, f"an integer >= {lo}", v)
    if k > -(-vocab // n):
        raise InputError("command line", "--k", f"at most the vocabulary slice per rank "
                         f"({-(-vocab // n)})", k)
    stat = batch * FP32_BYTES                       # one fp32 per token
    gather = n * batch * k * (FP32_BYTES + ID_BYTES)  # total gathered (nccl-tests S)
    ring_ar = 2 * (n - 1) / n
    ring_ag = (n - 1) / n
    full = batch * vocab * FP32_BYTES
    return {
        "vocab_sharded": {
            "all_reduce_max_bytes": stat, "all_reduce_sumexp_bytes": stat,
            "all_gather_bytes": gather,
            "sent_per_rank_bytes": 2 * ring_ar * stat + ring_ag * gather,
            "gathered_elements_per_rank": k * (n - 1) * batch,
        },
        "hidden_sharded": {
            "all_reduce_logits_bytes": full,
            "sent_per_rank_bytes": ring_ar * full,
        },
    }


def head_costs(topo, vocab: int, hidden: int, batch: int, k: int,
               ranks: Sequence[int] | None = None, model: str = "flow") -> dict:
    """Both shardings' collectives timed on ``topo`` (one collective at a time, every
    member arriving together) with their bytes (:func:`head_bytes`)."""
    from moesim.collectives.simulate import simulate_collective

    group = list(range(len(topo.gpus))) if ranks is None else list(ranks)
    n = len(group)
    b = head_bytes(vocab, hidden, batch, k, n)
    vs, hs = b["vocab_sharded"], b["hidden_sharded"]

    def t(op: str, nbytes: float) -> float:
        if n == 1:
            return 0.0
        return simulate_collective(topo, op, nbytes, ranks=group, model=model)["time_s"]

    vs["all_reduce_max_s"] = t("all_reduce", vs["all_reduce_max_bytes"])
    vs["all_reduce_sumexp_s"] = vs["all_reduce_max_s"]   # same size, same collective
    vs["all_gather_s"] = t("all_gather", vs["all_gather_bytes"])
    vs["time_s"] = vs["all_reduce_max_s"] + vs["all_reduce_sumexp_s"] + vs["all_gather_s"]
    hs["all_reduce_logits_s"] = t("all_reduce", hs["all_reduce_logits_bytes"])
    hs["time_s"] = hs["all_reduce_logits_s"]
    return {"op": "dist_topk", "vocab": vocab, "hidden": hidden, "batch": batch, "k": k,
            "ranks": n, "model": model, **b,
            "speedup": hs["time_s"] / vs["time_s"] if vs["time_s"] > 0 else None}
