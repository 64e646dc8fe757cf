"""Collective algorithms as phases of point-to-point transfers (pure, no simpy).

A collective on a process group expands into a list of *phases*; a phase is a
list of ``(src_rank, dst_rank, nbytes)`` transfers that run together, and a phase
starts when the previous one has fully finished (ASTRA-sim's system layer does
the same). Ranks are *global* ranks, so one call serves TP, EP, DP and PP groups.
Transfers within a phase are aggregated per (src, dst) pair and listed in a
deterministic order; zero-byte transfers and empty phases are dropped.

Sizes follow NVIDIA nccl-tests (doc/PERFORMANCE.md): ``nbytes`` is the per-rank
buffer for all_reduce, broadcast and all_to_all, and the *total* size
(per-rank count × n) for all_gather and reduce_scatter.

Node awareness comes from ``rank_host``: ``rank_host[r]`` is the node index of
global rank ``r``; hierarchical algorithms use it, so this module stays pure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from moesim.errors import InputError

Transfer = tuple[int, int, float]
Phase = list[Transfer]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv",
       "all_to_all", "all_to_all_v")
#: algorithms each op accepts; the first is the default
ALGOS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "broadcast": ("ring", "tree"),
    "send_recv": ("direct",),
    "all_to_all": ("direct", "hierarchical"),
    "all_to_all_v": ("direct", "hierarchical"),
}
#: chunks a pipelined algorithm (tree all-reduce, broadcast) splits its buffer into.
#: A modeling choice, not NCCL's chunk size: enough chunks for the pipeline to fill.
PIPELINE_CHUNKS = 8

_SRC = "collective"


def default_algo(op: str) -> str:
    check_op_algo(op, None)
    return ALGOS[op][0]


def check_op_algo(op: str, algo: str | None) -> str:
    """Return the algorithm to use for ``op``; InputError on an unknown op or algo."""
    if op not in ALGOS:
        raise InputError(_SRC, "op", "one of " + ", ".join(OPS), op)
    if algo is None:
        return ALGOS[op][0]
    if algo not in ALGOS[op]:
        raise InputError(_SRC, "algo", f"for {op} one of " + ", ".join(ALGOS[op]), algo)
    return algo


def _merge(transfers: list[Transfer]) -> Phase:
    """Sum transfers per (src, dst), drop self and zero transfers, sort."""
    acc: dict[tuple[int, int], float] = defaultdict(float)
    for s, d, b in transfers:
        if s != d and b > 0:
            acc[(s, d)] += float(b)
    return [(s, d, b) for (s, d), b in sorted(acc.items())]


def _clean(phases: list[list[Transfer]]) -> list[Phase]:
    out = [_merge(p) for p in phases]
    return [p for p in out if p]


# ---------------------------------------------------------------- rings
def ring_steps(group: Sequence[int], steps: int, chunk: float) -> list[Phase]:
    """``steps`` phases in which every member sends ``chunk`` bytes to its ring successor."""
    n = len(group)
    if n < 2:
        return []
    one = [(group[i], group[(i + 1) % n], chunk) for i in range(n)]
    return _clean([list(one) for _ in range(steps)])


def ring_orders(group: Sequence[int], rank_host: Sequence[int] | None = None) -> list[list[int]]:
    """The rings (channels) a ring collective runs on.

    One ring in group order, unless ``rank_host`` shows the group spanning several
    nodes with L > 1 members on each: then L rings, ring c visiting every node's members
    rotated by c, so each ring leaves a node from a different GPU and the L inter-node
    hops ride L different NICs. NCCL does the same with its channels; one ring would
    push all of the collective's inter-node bytes through one NIC (nccl-tests issue
    267: a GPU's inter-node traffic rides its own NIC).
    """
    if rank_host is not None:
        nodes = list(_members_by_node(group, rank_host).values())
        L = len(nodes[0])
        if len(nodes) > 1 and L > 1 and all(len(m) == L for m in nodes):
            return [[r for m in nodes for r in m[c:] + m[:c]] for c in range(L)]
    return [list(group)]


def _multi_ring(group: Sequence[int], steps: int, nbytes: float,
                rank_host: Sequence[int] | None) -> list[Phase]:
    """``steps`` steps of every ring, each ring carrying 1/len(rings) of the data;
    per step each member sends nbytes / (n · rings) to its successor in every ring."""
    if len(group) < 2:
        return []
    one = _ring_step(group, nbytes, rank_host)
    return [list(one) for _ in range(steps)] if one else []


def _ring_step(group: Sequence[int], nbytes: float,
               rank_host: Sequence[int] | None) -> Phase:
    """One step of :func:`_multi_ring`: every member to its successor in every ring."""
    n = len(group)
    rings = ring_orders(group, rank_host)
    chunk = nbytes / n / len(rings)
    return _merge([(ring[i], ring[(i + 1) % n], chunk) for ring in rings for i in range(n)])


def ring_repeats(op: str, group: Sequence[int], nbytes: float, algo: str | None = None,
                 rank_host: Sequence[int] | None = None) -> tuple[Phase, int] | None:
    """``(phase, steps)`` when ``expand(op, group, nbytes, ...)`` is ``steps`` copies of
    one phase (ring all-reduce, all-gather, reduce-scatter of >= 2 ranks), else None;
    lets a caller work on the phase once."""
    algo = check_op_algo(op, algo)
    n = len(group)
    if n < 2 or not (op in ("all_gather", "reduce_scatter")
                     or (op == "all_reduce" and algo == "ring")):
        return None
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    return _ring_step(tuple(int(r) for r in group), nbytes, rank_host), steps


def ring_all_reduce(group: Sequence[int], nbytes: float,
                    rank_host: Sequence[int] | None = None) -> list[Phase]:
    """Reduce-scatter then all-gather: 2(n-1) steps of S/n to the ring successor
    (split over the rings of :func:`ring_orders`)."""
    return _multi_ring(group, 2 * (len(group) - 1), nbytes, rank_host)


def ring_all_gather(group: Sequence[int], nbytes: float,
                    rank_host: Sequence[int] | None = None) -> list[Phase]:
    """n-1 steps of S/n (S = total gathered size, nccl-tests convention)."""
    return _multi_ring(group, len(group) - 1, nbytes, rank_host)


ring_reduce_scatter = ring_all_gather  # same traffic pattern, data flows the same way


# ---------------------------------------------------------------- trees
def _heap_tree(order: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Binary heap tree over ``order`` (order[0] is the root): parent and depth per rank."""
    parent: dict[int, int] = {}
    depth: dict[int, int] = {order[0]: 0}
    for i in range(1, len(order)):
        p = order[(i - 1) // 2]
        parent[order[i]] = p
        depth[order[i]] = depth[p] + 1
    return parent, depth


def _tree_schedule(order: Sequence[int], nbytes: float, chunks: int,
                   reduce: bool) -> dict[int, list[Transfer]]:
    """Step -> transfers of a pipelined tree reduce (up) + broadcast (down), or broadcast only.

    Reduce: a node at depth d sends chunk c to its parent at step c + (D - d), after all
    its children (depth d+1) sent chunk c at step c + D - d - 1. Broadcast: the root sends
    chunk c at step c + off, a node at depth d forwards it at step c + off + d, where
    off = D when it follows a reduce (the root holds reduced chunk c after step c + D - 1).
    """
    parent, depth = _heap_tree(order)
    D = max(depth.values())
    piece = nbytes / chunks
    steps: dict[int, list[Transfer]] = defaultdict(list)
    off = 0
    if reduce:
        for child, par in parent.items():
            for c in range(chunks):
                steps[c + D - depth[child]].append((child, par, piece))
        off = D
    for child, par in parent.items():
        for c in range(chunks):
            steps[c + off + depth[par]].append((par, child, piece))
    return steps


def _steps_to_phases(*schedules: dict[int, list[Transfer]]) -> list[Phase]:
    last = max((max(s) for s in schedules if s), default=-1)
    phases: list[list[Transfer]] = [[] for _ in range(last + 1)]
    for sched in schedules:
        for t, xs in sched.items():
            phases[t].extend(xs)
    return _clean(phases)


def tree_all_reduce(group: Sequence[int], nbytes: float,
                    chunks: int = PIPELINE_CHUNKS) -> list[Phase]:
    """Double binary tree (NCCL's tree algorithm), pipelined in ``chunks`` chunks.

    Two binary (heap-ordered) trees each reduce then broadcast half of the buffer.
    Tree 2 mirrors tree 1 (position p -> n-1-p), so for even n every inner node of one
    tree is a leaf of the other: no rank sends or receives more than 2S, where one
    tree over the whole buffer makes each inner node send 3S (S up, 2S down) while
    leaves idle. That balance is why NCCL uses two trees, and why we model it.
    """
    n = len(group)
    if n < 2:
        return []
    half = nbytes / 2
    t1 = _tree_schedule(list(group), half, chunks, reduce=True)
    t2 = _tree_schedule(list(reversed(group)), half, chunks, reduce=True)
    return _steps_to_phases(t1, t2)


def _rotate(group: Sequence[int], root: int) -> list[int]:
    if root not in group:
        raise InputError(_SRC, "root", f"a member of the group {tuple(group)}", root)
    i = list(group).index(root)
    return list(group[i:]) + list(group[:i])


def tree_broadcast(group: Sequence[int], nbytes: float, root: int,
                   chunks: int = PIPELINE_CHUNKS) -> list[Phase]:
    """Pipelined binary-tree broadcast from ``root`` (S split into ``chunks``)."""
    order = _rotate(group, root)
    if len(order) < 2:
        return []
    return _steps_to_phases(_tree_schedule(order, nbytes, chunks, reduce=False))


def ring_broadcast(group: Sequence[int], nbytes: float, root: int,
                   chunks: int = PIPELINE_CHUNKS) -> list[Phase]:
    """Pipelined chain from ``root`` along the ring: the member at distance p forwards
    chunk c at step c + p; n-2+chunks steps of S/chunks."""
    order = _rotate(group, root)
    n = len(order)
    steps: dict[int, list[Transfer]] = defaultdict(list)
    for p in range(n - 1):
        for c in range(chunks):
            steps[c + p].append((order[p], order[p + 1], nbytes / chunks))
    return _steps_to_phases(steps) if n > 1 else []


# ---------------------------------------------------------------- hierarchy
def _members_by_node(group: Sequence[int], rank_host: Sequence[int]) -> dict[int, list[int]]:
    """Node -> group members on it, nodes in order of first appearance, group order kept."""
    by_node: dict[int, list[int]] = {}
    for r in group:
        if not 0 <= r < len(rank_host):
            raise InputError(_SRC, "ranks", f"ranks in 0..{len(rank_host) - 1}", r)
        by_node.setdefault(int(rank_host[r]), []).append(r)
    return by_node


def node_layout(group: Sequence[int], rank_host: Sequence[int]) -> list[list[int]]:
    """Group members per node, in node order of first appearance; members keep group order.

    Hierarchical algorithms need the same number of members on every node (the i-th
    member of each node forms the inter-node group of local index i)."""
    by_node = _members_by_node(group, rank_host)
    nodes = list(by_node.values())
    sizes = {len(m) for m in nodes}
    if len(sizes) != 1:
        raise InputError(_SRC, "ranks", "the same number of group members on every node "
                         "for a hierarchical algorithm",
                         {h: len(m) for h, m in by_node.items()})
    return nodes


def hierarchical_all_reduce(group: Sequence[int], nbytes: float,
                            rank_host: Sequence[int]) -> list[Phase]:
    """Intra-node ring reduce-scatter (L-1 steps of S/L), inter-node ring all-reduce of
    S/L among same-local-index GPUs (2(N-1) steps of S/(L·N)), intra-node ring all-gather
    (L-1 steps of S/L); all nodes (resp. all local indices) run each step together."""
    nodes = node_layout(group, rank_host)
    L, N = len(nodes[0]), len(nodes)
    intra = [ring_steps(m, L - 1, nbytes / L) for m in nodes]
    rails = [[m[i] for m in nodes] for i in range(L)]
    inter = [ring_steps(r, 2 * (N - 1), nbytes / L / N) for r in rails]
    out: list[Phase] = []
    for parts in (intra, inter, intra):
        for step in range(max((len(p) for p in parts), default=0)):
            out.append([t for p in parts if step < len(p) for t in p[step]])
    return _clean(out)


# ---------------------------------------------------------------- all-to-all
def uniform_matrix(n: int, nbytes: float) -> np.ndarray:
    """n×n matrix of an all_to_all with per-rank buffer S: S/n to every rank (self included)."""
    return np.full((n, n), nbytes / n, dtype=float)


def check_matrix(matrix: np.ndarray | Sequence[Sequence[float]], n: int,
                 source: str = _SRC) -> np.ndarray:
    """Validate a source × destination byte matrix for a group of n ranks."""
    try:
        m = np.asarray(matrix, dtype=float)
    except (TypeError, ValueError) as err:
        raise InputError(source, "matrix", "a square list of lists of byte counts",
                         str(err)) from None
    if m.ndim != 2 or m.shape != (n, n):
        raise InputError(source, "matrix", f"a {n}×{n} matrix (one row and column per rank)",
                         "x".join(map(str, m.shape)))
    if not np.all(np.isfinite(m)) or (m < 0).any():
        raise InputError(source, "matrix", "finite byte counts >= 0",
                         float(m[~np.isfinite(m) | (m < 0)][0]))
    return m


def direct_all_to_all_v(group: Sequence[int], matrix: np.ndarray) -> list[Phase]:
    """All pairs in one phase: group[i] sends matrix[i, j] to group[j]."""
    m = check_matrix(matrix, len(group))
    return _clean([[(group[i], group[j], m[i, j]) for i in range(len(group))
                    for j in range(len(group))]])


Route = tuple[int, int, float, tuple[int, ...]]


def hierarchical_routes(group: Sequence[int], matrix: np.ndarray,
                        rank_host: Sequence[int]) -> list[Route]:
    """Where every byte of an all_to_all_v goes, node-aware (DeepSeek-V3 §3.2.2 style).

    Returns ``(src, dst, nbytes, hops)`` per nonzero off-diagonal matrix entry, ``hops``
    the ranks it visits, src first, dst last. Bytes for another node first cross the
    network to the member of the destination node with the sender's local index (the
    *relay*), then move over NVLink to ``dst``; if the relay is ``dst`` itself, or the
    destination is on the sender's node, they go directly.
    """
    m = check_matrix(matrix, len(group))
    nodes = node_layout(group, rank_host)
    local = {r: i for members in nodes for i, r in enumerate(members)}
    node_of = {r: k for k, members in enumerate(nodes) for r in members}
    pos = {r: i for i, r in enumerate(group)}
    routes: list[Route] = []
    for s in group:
        for d in group:
            b = float(m[pos[s], pos[d]])
            if s == d or b <= 0:
                continue
            if node_of[s] == node_of[d]:
                routes.append((s, d, b, (s, d)))
                continue
            relay = nodes[node_of[d]][local[s]]
            routes.append((s, d, b, (s, d) if relay == d else (s, relay, d)))
    return routes


def hierarchical_legs(group: Sequence[int], matrix: np.ndarray,
                      rank_host: Sequence[int]) -> tuple[list[Transfer], list[Transfer]]:
    """The two legs of :func:`hierarchical_routes`, aggregated per (src, dst) with numpy
    (the same transfers as summing the routes' hops, without a loop over pairs)."""
    m = check_matrix(matrix, len(group)).copy()
    nodes = node_layout(group, rank_host)
    n_nodes, L = len(nodes), len(nodes[0])
    pos = {r: i for i, r in enumerate(group)}
    nd = np.empty(len(group), dtype=np.int64)
    lc = np.empty(len(group), dtype=np.int64)
    member = np.empty((n_nodes, L), dtype=np.int64)   # (node, local) -> global rank
    for k, members in enumerate(nodes):
        for i, r in enumerate(members):
            nd[pos[r]], lc[pos[r]], member[k, i] = k, i, r
    np.fill_diagonal(m, 0.0)
    g = np.asarray(group, dtype=np.int64)
    cross = nd[:, None] != nd[None, :]
    leg1: list[Transfer] = []
    si, di = np.nonzero(~cross & (m > 0))               # own node: straight over NVLink
    leg1 += zip(g[si].tolist(), g[di].tolist(), m[si, di].tolist(), strict=True)
    per_node = np.zeros((len(group), n_nodes))          # bytes of src for each other node
    np.add.at(per_node.T, nd, (m * cross).T)
    si, bi = np.nonzero(per_node > 0)                   # network to the rail peer
    leg1 += zip(g[si].tolist(), member[bi, lc[si]].tolist(), per_node[si, bi].tolist(),
                strict=True)
    by_local = np.zeros((L, len(group)))               # bytes per (sender's local, dst)
    np.add.at(by_local, lc, m * cross)
    li, di = np.nonzero(by_local > 0)
    relay = member[nd[di], li]
    fwd = relay != g[di]                                # the relay forwards over NVLink
    leg2 = list(zip(relay[fwd].tolist(), g[di[fwd]].tolist(), by_local[li[fwd], di[fwd]].tolist(),
                    strict=True))
    return leg1, leg2


def hierarchical_all_to_all_v(group: Sequence[int], matrix: np.ndarray,
                              rank_host: Sequence[int],
                              chunks: int = PIPELINE_CHUNKS) -> list[Phase]:
    """The two legs of :func:`hierarchical_routes`, pipelined in ``chunks`` chunks.

    Leg 1: every route's first hop (network to the relay, aggregated per destination
    node, plus intra-node bytes over NVLink); leg 2: relays forward over NVLink to the
    final GPU. Phase c carries chunk c of leg 1 and chunk c-1 of leg 2, so the two legs
    overlap as DeepEP's kernels overlap RDMA and NVLink forwarding chunk by chunk
    (deepseek-ai/DeepEP csrc/kernels/legacy/internode.cu) instead of the network leg
    finishing before forwarding starts: chunks + 1 phases, each of 1/chunks of the
    bytes. With nothing to relay it is the one phase of leg 1.
    """
    legs = hierarchical_legs(group, matrix, rank_host)
    if not legs[1]:
        return _clean([legs[0]])
    one = [[(s, d, b / chunks) for s, d, b in leg] for leg in legs]
    first, mid, last = _merge(one[0]), _merge(one[0] + one[1]), _merge(one[1])
    # the chunks - 1 middle phases are equal: merged once, copied
    return [first] + [list(mid) for _ in range(chunks - 1)] + [last]


# ---------------------------------------------------------------- entry point
def expand(op: str, group: Sequence[int], nbytes: float = 0.0, *, algo: str | None = None,
           root: int | None = None, matrix: np.ndarray | None = None,
           rank_host: Sequence[int] | None = None) -> list[Phase]:
    """Expand one collective into phases. ``group`` holds global ranks (send_recv:
    ``(src, dst)``); ``matrix`` is indexed by position in ``group``."""
    algo = check_op_algo(op, algo)
    group = tuple(int(r) for r in group)
    if len(set(group)) != len(group) or not group:
        raise InputError(_SRC, "ranks", "a non-empty group of distinct ranks", group)
    if not np.isfinite(nbytes) or nbytes < 0:
        raise InputError(_SRC, "bytes", "a finite size >= 0", nbytes)
    n = len(group)
    if algo == "hierarchical" and rank_host is None:
        raise InputError(_SRC, "algo", "rank_host (node of each rank) for hierarchical", None)
    if op == "send_recv":
        if n != 2:
            raise InputError(_SRC, "ranks", "exactly two ranks (src, dst) for send_recv", group)
        return _clean([[(group[0], group[1], nbytes)]])
    if op == "all_reduce":
        if algo == "ring":
            return ring_all_reduce(group, nbytes, rank_host)
        if algo == "tree":
            return tree_all_reduce(group, nbytes)
        return hierarchical_all_reduce(group, nbytes, rank_host)  # type: ignore[arg-type]
    if op in ("all_gather", "reduce_scatter"):
        return ring_all_gather(group, nbytes, rank_host)
    if op == "broadcast":
        r = group[0] if root is None else int(root)
        return ring_broadcast(group, nbytes, r) if algo == "ring" else tree_broadcast(group, nbytes, r)
    m = uniform_matrix(n, nbytes) if op == "all_to_all" else check_matrix(matrix, n)
    if algo == "direct":
        return direct_all_to_all_v(group, m)
    return hierarchical_all_to_all_v(group, m, rank_host)  # type: ignore[arg-type]
