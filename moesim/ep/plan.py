"""DeepEP dispatch/combine as stages of flows: :func:`plan_ep_exchange` (pure, no simpy).

Contract (what the engines consume)
-----------------------------------
``plan_ep_exchange(counts, op, kernel, dtype, hidden, top_k, sms)`` takes the exact
per-micro-batch counts of :func:`moesim.gating.tokens.dedup_counts` (EP ranks 0..S-1,
``ranks_per_node`` consecutive EP ranks per node, rail peer = same position in the
node) and returns an :class:`EpPlan`:

* ``stages``: :class:`Stage` tuples ``(name, medium, flows)``, ``flows`` a tuple of
  ``(src_ep_rank, dst_ep_rank, nbytes)`` aggregated per pair, src != dst, bytes > 0,
  ``medium`` "rdma" (crosses the NIC) or "nvl" (stays in the node). With
  ``concurrent`` True (every DeepEP kernel) the stages run at the same time, chunk
  by chunk, so the caller starts all flows of all stages together and adds
  ``fill_drain``; it must NOT run them one after the other.
* ``sms``: SMs each rank's kernel holds while it runs (0 for the low-latency kernels
  once their sends are issued: the receive completes through a hook);
* ``sm_write_bytes`` (S,): bytes each rank's SMs copy (the SM-throughput bound);
* ``fill_drain``: ``(medium, bytes of one chunk per channel)`` items: the pipeline's
  fill and drain cost one such chunk at the channel's share of that medium's rate;
* ``latency``: ``{"rdma_hops", "nvl_hops", "launches"}`` counts of one-way RDMA
  latencies, NVLink latencies and kernel launches/host syncs of the notify
  (count exchange) step that precedes a normal dispatch and its host-visible sync
  (DeepEP ``notify_dispatch``; the CPU waits for the GPU-written receive counts);
* ``rdma_bytes_per_rank``, ``nvl_bytes_per_rank`` (S,): logical bytes as DeepEP's
  tests count them (see :mod:`moesim.ep.timing` for the bandwidth definition).

Kernels: ``deepep`` (normal: intranode kernels on one node, internode kernels across
nodes), ``deepep-ll`` (low-latency), ``nccl`` (per-assignment all-to-all, one stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from moesim.ep.messages import (
    hidden_bytes,
    internode_bytes_per_token,
    intranode_bytes_per_token,
    ll_bytes_per_message,
    logical_bytes_per_token,
)
from moesim.errors import InputError
from moesim.gating.tokens import DedupCounts

KERNELS = ("deepep", "deepep-ll", "nccl")
OPS = ("ep_dispatch", "ep_combine")
#: SMs of DeepEP's normal kernels unless told (deep_ep/buffers/legacy.py: Buffer.num_sms = 20;
#: DeepSeek-V3 report §3.2.2: 20 of the H800's 132 SMs for communication)
DEFAULT_SMS = 20
#: tokens per chunk (nvl send chunk, rdma send chunk) of DeepEP's recommended configs,
#: deep_ep/buffers/legacy.py get_dispatch_config / get_combine_config (by EP size)
DISPATCH_CHUNKS = {2: (24, 6), 4: (6, 6), 8: (6, 6), 16: (36, 20), 24: (32, 8), 32: (32, 8),
                   48: (32, 8), 64: (32, 8), 96: (20, 12), 128: (20, 12), 144: (32, 12),
                   160: (28, 12)}
COMBINE_CHUNKS = {2: (10, 6), 4: (9, 6), 8: (4, 6), 16: (4, 12), 24: (1, 8), 32: (1, 8),
                  48: (1, 8), 64: (1, 8), 96: (1, 8), 128: (1, 8), 144: (2, 8), 160: (2, 8)}

#: NVLink peers DeepEP's normal (V1) kernels take: EP ranks r // 8 share NVLink buffers
#: and the rest is RDMA through the NIC (deepseek-ai/DeepEP dd758ca, csrc/legacy/buffer.hpp:
#: ``LEGACY_NUM_MAX_NVL_PEERS == 8``, ``rdma_rank = rank / LEGACY_NUM_MAX_NVL_PEERS``; the
#: internode kernels send with ``nvshmemi_ibgda_put_nbi_warp``, csrc/kernels/legacy/
#: internode.cu). A larger NVLink domain (GB200 NVL72) is not one "node" to them: "the current
#: normal kernels limits the number of GPUs per node to 8, the normal mode doesn't support
#: GB200 yet" (DeepEP issue #392); the low-latency kernels reach every peer of the domain over
#: NVLink (``nvshmemi_get_p2p_ptr``, internode_ll.cu, with ``allow_mnnvl``).
NUM_MAX_NVL_PEERS = 8

Flow = tuple[int, int, float]


@dataclass(frozen=True, eq=False)
class Stage:
    name: str
    medium: str                 # "rdma" | "nvl"
    matrix: np.ndarray          # (S, S) bytes src EP rank -> dst EP rank, zero diagonal

    @cached_property
    def flows(self) -> tuple[Flow, ...]:
        """(src EP rank, dst EP rank, bytes), aggregated per pair, in (src, dst) order."""
        src, dst = np.nonzero(self.matrix)
        return tuple(zip(src.tolist(), dst.tolist(), self.matrix[src, dst].tolist(),
                         strict=True))

    @property
    def nbytes(self) -> float:
        return float(self.matrix.sum())


@dataclass(frozen=True, eq=False)
class EpPlan:
    op: str
    kernel: str
    dtype: str
    ranks: int
    ranks_per_node: int
    stages: tuple[Stage, ...]
    concurrent: bool
    sms: int
    sm_write_bytes: np.ndarray          # (S,)
    fill_drain: tuple[tuple[str, float], ...]
    latency: dict[str, int]
    rdma_bytes_per_rank: np.ndarray     # (S,) logical, DeepEP tests' convention
    nvl_bytes_per_rank: np.ndarray      # (S,)
    bytes_per_token: float              # message bytes per token (or per LL message)

    def flows(self) -> list[tuple[int, int, float, str]]:
        """Every stage's flows as ``(src, dst, nbytes, medium)``, stage by stage."""
        return [(s, d, b, st.medium) for st in self.stages for s, d, b in st.flows]


def _stage(name: str, medium: str, m: np.ndarray) -> Stage:
    """A stage from a (src, dst) byte matrix; a rank's bytes to itself do not move."""
    return Stage(name, medium, _moving(np.array(m, dtype=float)))


def _moving(m: np.ndarray) -> np.ndarray:
    """``m`` in place without the bytes that do not move: the diagonal (a rank's bytes to
    itself) and negative entries set to 0."""
    if m.ndim == 2 and m.shape[0] == m.shape[1]:
        m.flat[::m.shape[1] + 1] = 0.0      # np.fill_diagonal of a square matrix
    else:
        np.fill_diagonal(m, 0.0)
    neg = m < 0
    if neg.any():
        m[neg] = 0.0
    return m


def _chunks(table: dict[int, tuple[int, int]], n: int) -> tuple[int, int]:
    """The config of the nearest EP size DeepEP lists (ties: the smaller)."""
    return table[min(table, key=lambda k: (abs(k - n), k))]


@lru_cache(maxsize=64)
def _chunks_of(combine: bool, n: int) -> tuple[int, int]:
    return _chunks(COMBINE_CHUNKS if combine else DISPATCH_CHUNKS, n)


@lru_cache(maxsize=64)
def _rail_index(n: int, L: int, nodes: int) -> tuple[np.ndarray, ...]:
    """Index arrays of the internode plan for n ranks, L per node (read-only):
    (source rows (n, 1), rail peer of source s on node b (n, nodes), flat
    (forwarder, destination) of every (s, d), forwarder of every (s, d) flat)."""
    loc = np.arange(n) % L
    nd = np.arange(n) // L
    fwd = nd[None, :] * L + loc[:, None]                     # (n, n)
    out = (np.arange(n)[:, None], np.arange(nodes)[None, :] * L + loc[:, None],
           (fwd * n + np.arange(n)[None, :]).ravel(), fwd.ravel())
    for x in out:
        x.setflags(write=False)
    return out


def check_kernel(op: str, kernel: str, sms: int, source: str = "command line",
                 prefix: str = "--") -> None:
    """InputError naming ``prefix + field`` (``--kernel`` on the command line; a
    scenario passes e.g. ``parallel.ep_backend.``) on an unknown op or kernel or a bad
    SM count."""
    if op not in OPS:
        raise InputError(source, prefix + "op", "one of " + ", ".join(OPS), op)
    if kernel not in KERNELS:
        raise InputError(source, prefix + "kernel", "one of " + ", ".join(KERNELS), kernel)
    if isinstance(sms, bool) or not isinstance(sms, int) or sms < 2 or sms % 2:
        # internode.cu: num_channels = num_sms / 2; legacy.py set_num_sms: "must be even"
        raise InputError(source, prefix + "sms", "an even number of SMs >= 2 (2 SMs per channel)",
                         sms)


def check_nvl_peers(kernel: str, ranks_per_node: int, source: str = "command line",
                    field: str = "--kernel") -> None:
    """InputError when DeepEP's normal kernels would need more than
    :data:`NUM_MAX_NVL_PEERS` EP ranks in one NVLink domain (an NVL72 rack)."""
    if kernel == "deepep" and ranks_per_node > NUM_MAX_NVL_PEERS:
        raise InputError(source, field, "deepep-ll or nccl for an EP group with more than "
                         f"{NUM_MAX_NVL_PEERS} GPUs in one NVLink domain (DeepEP's normal kernels "
                         f"take at most {NUM_MAX_NVL_PEERS} NVLink peers, NUM_MAX_NVL_PEERS)",
                         f"deepep with {ranks_per_node} EP ranks in one NVLink domain")


def plan_ep_exchange(counts: DedupCounts, op: str, kernel: str, dtype: str, hidden: int,
                     top_k: int, sms: int = DEFAULT_SMS) -> EpPlan:
    """Stages of one dispatch or combine (see the module docstring)."""
    check_kernel(op, kernel, sms)
    combine = op == "ep_combine"
    n = counts.pair_tokens.shape[0]
    L = counts.ranks_per_node
    if kernel == "deepep-ll":
        return _plan_ll(counts, op, dtype, hidden, combine)
    if kernel == "nccl":
        return _plan_nccl(counts, op, dtype, hidden, combine)
    logical = logical_bytes_per_token("deepep", dtype, hidden)
    gpu, node, gpu_in, node_out = _count_sums(counts)
    nvl_logical = (gpu_in * logical)       # dispatch: received (token, GPU) copies
    if n <= L:  # one NVLink domain: intranode kernels (csrc/kernels/legacy/intranode.cu)
        msg = intranode_bytes_per_token(dtype, hidden, top_k, combine=combine)
        acc = gpu * msg
        if combine:
            acc = acc.T
        nvl_chunk, _ = _chunks_of(combine, n)
        # SMs write every received token once into the peer's channel buffer and copy
        # it out once more on the receiving side
        writes = (gpu.sum(axis=0) + gpu.sum(axis=1)) * msg
        return EpPlan(op, "deepep", dtype, n, L, (_stage("nvl", "nvl", acc),), True,
                      sms, writes, (("nvl", nvl_chunk * msg),),
                      {"rdma_hops": 0, "nvl_hops": 0 if combine else 2,
                       "launches": 0 if combine else 2},
                      np.zeros(n), nvl_logical, float(msg))
    # internode kernels (csrc/kernels/legacy/internode.cu)
    msg = internode_bytes_per_token(dtype, hidden, top_k, combine=combine)
    rows, peer, fwd_pair, fwd_flat = _rail_index(n, L, node.shape[1])
    # rail peer of source s on node b: the same local index there
    rdma = np.zeros((n, n))
    rdma[rows, peer] = node * msg
    # forwarder of (s, d): the GPU of d's node with s's local index (s itself at home)
    fwd = _forwarded(counts, gpu, fwd_pair, fwd_flat, n, msg)
    if fwd is not None:      # whole bytes: the token sums times msg are the same floats
        nvl, fwd_writes = fwd[0] * msg, fwd[1] * msg
    else:
        sent = gpu * msg
        nvl = np.bincount(fwd_pair, weights=sent.ravel(), minlength=n * n).reshape(n, n)
        fwd_writes = np.bincount(fwd_flat, weights=sent.ravel(), minlength=n)
    if combine:  # reverse every flow: GPUs -> forwarder over NVLink, one RDMA send back
        rdma, nvl = rdma.T, nvl.T
    send_writes = node_out * msg       # tokens into the RDMA send buffer
    recv_writes = gpu_in * hidden_bytes(dtype, hidden)  # copy-out to recv_x
    nvl_chunk, rdma_chunk = _chunks_of(combine, n)
    stages = (_stage("rdma", "rdma", rdma), _stage("nvl", "nvl", nvl))
    if combine:
        stages = stages[::-1]
    return EpPlan(op, "deepep", dtype, n, L, stages, True, sms,
                  send_writes + fwd_writes + recv_writes,
                  (("rdma", rdma_chunk * msg), ("nvl", nvl_chunk * msg)),
                  {"rdma_hops": 0 if combine else 1, "nvl_hops": 0 if combine else 2,
                   "launches": 0 if combine else 2},
                  node_out * logical, nvl_logical, float(msg))


#: the counts last planned and what every plan of them shares (a routed micro-batch's
#: directions are planned one after the other from one DedupCounts)
_LAST: list = [None, None, None]


def _count_sums(counts: DedupCounts) -> tuple[np.ndarray, ...]:
    """(gpu, node) copies as floats, (token, GPU) copies each rank receives and (token,
    node) copies each rank sends: the same arrays for every plan of ``counts``."""
    if _LAST[0] is not counts:
        gpu, node = counts.gpu_tokens.astype(float), counts.node_tokens.astype(float)
        _LAST[:] = [counts, (gpu, node, gpu.sum(axis=0), node.sum(axis=1)), None]
    return _LAST[1]


def _forwarded(counts: DedupCounts, gpu: np.ndarray, fwd_pair: np.ndarray,
               fwd_flat: np.ndarray, n: int, msg: float) -> tuple[np.ndarray, ...] | None:
    """(token copies per (forwarder, destination), per forwarder) of ``counts``, or None
    when their products with ``msg`` bytes might not be exact: with whole bytes per
    token and every sum below 2^53, Σ copies · msg == (Σ copies) · msg in floats, so
    each plan multiplies the shared sums instead of summing its own products."""
    if not float(msg).is_integer() or float(gpu.sum()) * msg >= 2.0 ** 53:
        return None
    if _LAST[0] is not counts:
        _count_sums(counts)
    if _LAST[2] is None:
        w = gpu.ravel()
        _LAST[2] = (np.bincount(fwd_pair, weights=w, minlength=n * n).reshape(n, n),
                    np.bincount(fwd_flat, weights=w, minlength=n))
    return _LAST[2]


def _plan_ll(counts: DedupCounts, op: str, dtype: str, hidden: int, combine: bool) -> EpPlan:
    """One message per (token, expert), straight to the expert's GPU
    (csrc/kernels/legacy/internode_ll.cu): RDMA (IBGDA) across nodes; a peer in the
    same NVLink domain is written directly (``nvshmemi_get_p2p_ptr`` non-null)."""
    n, L = counts.pair_tokens.shape[0], counts.ranks_per_node
    msg = ll_bytes_per_message(dtype, hidden, combine=combine)
    logical = logical_bytes_per_token("deepep-ll", dtype, hidden)
    pair = counts.pair_tokens.astype(float)
    same = (np.arange(n)[:, None] // L) == (np.arange(n)[None, :] // L)
    rdma = pair * msg * ~same
    nvl = pair * msg * same
    if combine:
        rdma, nvl = rdma.T, nvl.T
    sel = pair.sum(axis=1)   # the test counts each rank's own selections
    return EpPlan(op, "deepep-ll", dtype, n, L,
                  (_stage("rdma", "rdma", rdma), _stage("nvl", "nvl", nvl)),
                  True, 0, np.zeros(n), (), {"rdma_hops": 0, "nvl_hops": 0, "launches": 0},
                  sel * logical, (pair * same).sum(axis=1) * logical, float(msg))


def ll_matrix(pair_tokens: np.ndarray, dtype: str, hidden: int, combine: bool) -> np.ndarray:
    """Bytes between EP ranks of :func:`_plan_ll`'s stages summed (what an exchange's
    ``byte_matrix`` carries), without the plan: every (token, expert) message to its
    GPU, the diagonal zero, the combine's the transpose (a view, as the plan's stages
    are laid out). The same floats: the plan's RDMA and NVLink stages never share a
    pair, so each entry is one product plus zeros (tests/test_ep_plan_ll_matrix.py)."""
    m = _moving(pair_tokens.astype(float) * ll_bytes_per_message(dtype, hidden,
                                                                 combine=combine))
    return m.T if combine else m


def _plan_nccl(counts: DedupCounts, op: str, dtype: str, hidden: int, combine: bool) -> EpPlan:
    """Today's pairwise all-to-all: one copy per (token, expert) of the hidden vector."""
    n, L = counts.pair_tokens.shape[0], counts.ranks_per_node
    bpt = float(hidden_bytes(dtype, hidden))
    m = counts.pair_tokens.astype(float) * bpt
    if combine:
        m = m.T
    same = (np.arange(n)[:, None] // L) == (np.arange(n)[None, :] // L)
    return EpPlan(op, "nccl", dtype, n, L, (_stage("a2a", "mixed", m),), False, 0,
                  np.zeros(n), (), {"rdma_hops": 0, "nvl_hops": 0, "launches": 0},
                  (m * ~same).sum(axis=1), (m * same).sum(axis=1), bpt)
