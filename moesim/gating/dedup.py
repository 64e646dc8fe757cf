"""Deduplicated copies of a micro-batch's tokens for DeepEP-style exchanges (pure).

DeepEP's normal kernels send one copy of a token per destination *node* over RDMA and
one per destination *GPU* over NVLink, however many of the token's top-k experts sit
there (deepseek-ai/DeepEP ``csrc/kernels/layout.cu``: ``num_tokens_per_rdma_rank``,
``is_token_in_rank``). From each token's kept expert ids:

* ``gpu_tokens[s, d]``: tokens of source EP rank s with at least one kept expert on d;
* ``node_tokens[s, n]``: tokens of s with at least one kept expert on node n.

:func:`from_choices` counts them exactly (the router's per-token path).
:func:`estimate` serves the counts path (large micro-batches, where tokens are not
sampled one by one): it draws ``PROBE_TOKENS`` tokens with the same routing law
(:func:`moesim.gating.router.assign_tokens`, node limit included) and scales each
(source, node) / (source, GPU) assignment count by the probe's copies per assignment
of that node / GPU. The estimate is exact in expectation for the probe's law; its
sampling error is measured in tests/test_ep_engine.py. The probe depends on the
routing law only (seed, step, layer), not on the micro-batch, so callers may cache
its ratios per layer (``route_microbatch(..., dedup_cache=dict)``).
"""

from __future__ import annotations

import numpy as np

from moesim.gating.router import assign_tokens

#: tokens drawn per micro-batch to estimate copies per assignment on the counts path
PROBE_TOKENS = 1024
#: random stream of the probe (route_microbatch uses 0, skew 1-3, gating.tokens 4)
STREAM_DEDUP = 5


def _distinct(ids: np.ndarray, width: int) -> np.ndarray:
    """(T, width) bool: which ids (>= 0) each row holds, each once."""
    hit = np.zeros((ids.shape[0], width + 1), dtype=bool)
    rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
    hit[rows, np.where(ids >= 0, ids, width).ravel()] = True
    return hit[:, :width]


def from_choices(choices: list[np.ndarray], home: np.ndarray, ranks_per_node: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Exact (gpu_tokens, node_tokens) from each source's (T, k) kept expert ids
    (-1: dropped slot); ``home[e]``: EP rank of expert e."""
    n = len(choices)
    n_nodes = max(1, n // ranks_per_node)
    gpu = np.zeros((n, n), dtype=np.int64)
    node = np.zeros((n, n_nodes), dtype=np.int64)
    for s, c in enumerate(choices):
        c = np.asarray(c, dtype=np.int64)
        if c.size == 0:
            continue
        dst = np.where(c >= 0, home[np.where(c >= 0, c, 0)], -1)
        gpu[s] = _distinct(dst, n).sum(axis=0)
        node[s] = _distinct(np.where(dst >= 0, dst // ranks_per_node, -1), n_nodes).sum(axis=0)
    return gpu, node


def probe_ratios(home: np.ndarray, ranks_per_node: int, pi: np.ndarray, k: int,
                 node_of_expert: np.ndarray | None, max_nodes: int | None,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Copies per assignment, per destination GPU and per node, in a probe of
    ``PROBE_TOKENS`` tokens drawn with the routing law (``pi``, top-k, node limit)."""
    s_ = int(home.max()) + 1
    n_nodes = max(1, s_ // ranks_per_node)
    probe = assign_tokens(rng, pi, PROBE_TOKENS, k, node_of_expert, max_nodes)
    dst = home[probe]
    a_gpu = np.bincount(dst.ravel(), minlength=s_).astype(float)
    c_gpu = _distinct(dst, s_).sum(axis=0).astype(float)
    nd = dst // ranks_per_node
    a_node = np.bincount(nd.ravel(), minlength=n_nodes).astype(float)
    c_node = _distinct(nd, n_nodes).sum(axis=0).astype(float)
    return (np.divide(c_gpu, a_gpu, out=np.ones(s_), where=a_gpu > 0),
            np.divide(c_node, a_node, out=np.ones(n_nodes), where=a_node > 0))


_ORDER: list = [None, None]     # (home array, its order): the last one asked for


def _home_order(home: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(experts sorted by home rank, stably; the ranks; first position of each),
    remembered for the last read-only ``home`` (a placement's, the same every call)."""
    if _ORDER[0] is home and not home.flags.writeable:
        return _ORDER[1]
    order = np.argsort(home, kind="stable")
    ranks, first = np.unique(home[order], return_index=True)
    if not home.flags.writeable:
        _ORDER[0], _ORDER[1] = home, (order, ranks, first)
    return order, ranks, first


def estimate(kept: np.ndarray, home: np.ndarray, ranks_per_node: int,
             ratios: tuple[np.ndarray, np.ndarray], by_rank: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(gpu_tokens, node_tokens) for ``kept`` (S × E assignments): each (source, GPU) and
    (source, node) assignment count times the probe's copies per assignment there
    (:func:`probe_ratios`), rounded, and kept between one copy per token holding any
    assignment there and the assignment count itself. ``by_rank``: the (S × S)
    assignments per source and home rank when the caller has them (the dispatch of a
    placement without replicas: the same integers)."""
    s_, e_ = kept.shape
    n_nodes = max(1, s_ // ranks_per_node)
    r_gpu, r_node = ratios
    # assignments src -> home rank: sum the columns of each rank's experts
    if by_rank is None:
        order, ranks, first = _home_order(home)
        by_rank = np.zeros((s_, s_), dtype=np.int64)
        by_rank[:, ranks] = np.add.reduceat(kept[:, order], first, axis=1)
    if by_rank.shape == (s_, n_nodes * ranks_per_node) and by_rank.dtype == np.int64:
        by_node = np.add.reduceat(by_rank, np.arange(0, s_, ranks_per_node), axis=1)
    else:
        by_node = by_rank.reshape(s_, n_nodes, ranks_per_node).sum(axis=2)
    k_tokens = kept.sum(axis=1)
    # np.clip(x, lo, hi) is minimum(maximum(x, lo), hi): the same integers
    gpu = np.minimum(np.maximum(np.rint(by_rank * r_gpu[None, :]).astype(np.int64),
                                (by_rank > 0).astype(np.int64)), by_rank)
    node = np.minimum(np.maximum(np.rint(by_node * r_node[None, :]).astype(np.int64),
                                 (by_node > 0).astype(np.int64)), by_node)
    return np.minimum(gpu, k_tokens[:, None]), np.minimum(node, k_tokens[:, None])
