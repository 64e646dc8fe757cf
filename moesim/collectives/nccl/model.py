"""NCCL's cost model and selection rule: ``tune`` (ncclTopoTuneModel), ``algo_time``
(ncclTopoGetAlgoTime) and ``estimate`` (topoGetAlgoInfo: the fastest enabled algorithm
x protocol by that model).

A reading of NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 (NCCL
2.30.7): src/graph/tuning.cc ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``,
src/enqueue.cc ``updateCollCostTable`` and ``topoGetAlgoInfo``. Latencies in µs and
bandwidths in GB/s inside, as NCCL keeps them; ``estimate`` returns seconds.

Sizes are nccl-tests' S, which is what NCCL prices (enqueue.cc
``ncclFuncMaxSendRecvCount``): the per-rank buffer for all_reduce, broadcast and
reduce, the total gathered size (count x nRanks) for all_gather and reduce_scatter.

NCCL has no cost model for send/recv (tuning.cc prices collectives only). For
``send_recv`` and ``all_to_all`` (grouped send/recv) moesim uses the protocol NCCL's
enqueue.cc picks for point-to-point (LL while a peer's bytes <= its channels x 16 KiB,
else Simple) and prices it with the ring's constants (see ``_p2p``) -- a moesim
construction, marked ``"nccl_model": false`` in the breakdown.
"""

from __future__ import annotations

import dataclasses
import math

from moesim.collectives.nccl import constants as C
from moesim.collectives.nccl.graphs import NcclFacts
from moesim.errors import InputError

_SRC = "nccl"
#: the collectives NCCL's model prices
COLL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
#: point-to-point ops moesim prices with NCCL's ring constants (see the module doc)
P2P_OPS = ("all_to_all", "send_recv")
NCCL_OPS = COLL_OPS + P2P_OPS


def _idx2(nodes: int) -> int:
    return nodes - 1 if nodes <= 2 else 2


def _log2i(n: int) -> int:
    return n.bit_length() - 1  # -1 for 0, as NCCL's log2i


def _nsteps(op: str, n: int) -> int:
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in ("reduce_scatter", "all_gather"):
        return n - 1
    return n


def _eligible(op: str, algo: str, proto: str, facts: NcclFacts) -> bool:
    """The tuning.cc loop's skips, the enable rules after it and enqueue.cc's."""
    if algo not in facts.graphs:
        return False
    if op in ("broadcast", "reduce") and algo != "ring":
        return False
    if op in ("reduce_scatter", "all_gather") and algo not in ("pat", "ring", "nvls",
                                                               "collnet_direct"):
        return False
    if op == "all_reduce" and algo == "pat":
        return False
    if algo in ("nvls", "nvls_tree", "pat") and proto != "Simple":
        return False
    if algo == "nvls_tree" and facts.nodes == 1:
        return False
    if algo == "nvls" and facts.nodes > 1:  # NVLS across nodes needs CollNet (SHARP)
        return False
    if algo in ("nvls", "nvls_tree") and not facts.nvls_support:
        return False
    if proto == "LL128" and not facts.ll128_paths_ok:
        return False
    return True


def tune(op: str, facts: NcclFacts) -> dict[tuple[str, str], tuple[float, float]]:
    """(algo, proto) -> (latency µs, algorithm bandwidth GB/s), as ncclTopoTuneModel
    fills comm->latencies / comm->bandwidths for ``op``; only enabled pairs."""
    nodes, n = facts.nodes, facts.n_ranks
    cc = C.COMPCAPS.index(facts.compcap)
    i2 = _idx2(nodes)
    vendor_row = 1 if facts.cpu_vendor == "amd" else 0
    ll_max = C.LL_MAX_BWS[cc if nodes == 1 else vendor_row][i2]
    ppn = n / nodes
    nsteps = _nsteps(op, n)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for algo, graph in facts.graphs.items():
        for p, proto in enumerate(C.PROTOCOLS):
            if not _eligible(op, algo, proto, facts):
                continue
            nch = graph.n_channels
            bw = graph.bw_intra if nodes <= 2 else graph.bw_inter
            if algo in ("nvls", "nvls_tree"):
                intra_bw = graph.bw_intra * C.NVLS_EFFICIENCY[cc] * (nch - 1) / nch
                intra_bw *= 2.0 if op == "all_reduce" else (ppn - 1) / ppn
                inter_bw = graph.bw_inter * (2 if nodes <= 2 and algo == "nvls_tree" else 1)
                cap = C.PER_CH_MAX_NVLS_TREE_BWS[cc][i2] if algo == "nvls_tree" else math.inf
                bw = min(intra_bw, inter_bw, cap)
            bus = nch * bw
            if algo == "ring" and proto == "LL":
                bus = min(ll_max, bus * C.RING_LL_FACTOR)
            if algo == "ring" and proto == "LL128":
                bus = min(bus * C.RING_LL128_FACTOR, nch * C.PER_CH_MAX_RING_LL128_BWS[cc][i2])
            if algo == "tree" and op == "all_reduce":
                bus = min(bus * C.TREE_AR_FACTOR, nch * C.PER_CH_MAX_TREE_BWS[cc][i2])
            if algo == "tree" and proto == "LL":
                bus = min(bus / C.TREE_LL_DIVISOR, ll_max)
            if algo == "tree" and proto == "LL128":
                f = C.TREE_LL128_FACTOR_ONE if nodes == 1 else C.TREE_LL128_FACTOR_MULTI
                bus = min(bus * f, nch * C.PER_CH_MAX_TREE_LL128_BWS[cc][i2])
            if algo == "tree" and not facts.balanced_tree:
                bus *= C.TREE_PATTERN_FACTOR
            if algo == "pat":
                bus *= C.PAT_FACTOR
            if algo == "nvls" and op in ("all_gather", "reduce_scatter") and nodes > 1:
                bus = 0.0
            if not (algo != "ring" and op in ("all_gather", "reduce_scatter")):
                bus *= n / nsteps if algo in ("ring", "nvls", "nvls_tree") else 0.5
            if bus <= 0:
                continue
            out[(algo, proto)] = (_latency(op, algo, p, facts, nsteps, graph), bus)
    return out


def _latency(op: str, algo: str, p: int, facts: NcclFacts, nsteps: int, graph) -> float:
    nodes, n = facts.nodes, facts.n_ranks
    ppn = n / nodes
    lat = C.BASE_LAT[algo][p]
    intra_lat = C.HW_LAT[facts.intra][algo][p]
    inter_lat = C.HW_LAT["net"]["tree" if ppn == 1 else algo][p] + graph.latency_inter_us
    if p == 2:  # Simple also waits for the flush
        inter_lat += graph.latency_inter_us
    local = n // nodes
    if algo == "ring":
        hw = C.HW_LAT[facts.intra if nodes == 1 else "net"]
        step = hw[algo][p]
        if op in ("reduce", "broadcast"):
            if graph.same_channels:
                return lat + step
            if p == 2:
                step = hw["tree"][p]
            return lat + nsteps * step
        overhead = 0.0
        if nodes > 1:
            overhead = C.NET_OVERHEAD_US.get(facts.cpu_vendor, 1.0) * (3 if p == 2 else 1)
        intra_lat = max(intra_lat, overhead)
        inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if op == "all_reduce" else nodes - 1)
        return lat + (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
    if algo == "tree":
        if op == "all_reduce":
            lat += 2 * ((local - 1) * intra_lat + _log2i(nodes) * inter_lat)
        return lat
    if algo == "nvls":
        return intra_lat + (inter_lat if nodes > 1 else 0.0)
    if algo == "nvls_tree":
        return lat + intra_lat + 2 * _log2i(nodes) * inter_lat
    if algo == "pat":
        if op in ("all_gather", "reduce_scatter"):
            lat += _log2i(nodes) * (inter_lat / 3.5) + n * 2.8
        return lat
    return lat


def algo_time(op: str, algo: str, proto: str, nbytes: float, facts: NcclFacts,
              table: dict[tuple[str, str], tuple[float, float]]) -> tuple[float, float, float]:
    """ncclTopoGetAlgoTime for one pipelined op: (time µs, latency µs, bandwidth GB/s)."""
    lat, bw = table[(algo, proto)]
    p = C.PROTOCOLS.index(proto)
    log_size = _log2i(int(nbytes) >> 6)
    if algo == "tree" and op == "all_reduce" and 0 <= log_size < 23:
        bw *= C.TREE_CORRECTION[p][log_size]
    if (algo == "nvls_tree" and op == "all_reduce" and 0 <= log_size < 24
            and facts.compcap == "blackwell"):
        bw *= C.TREE_CORRECTION[p][log_size]
    if (algo == "ring" and proto == "Simple" and facts.nodes > 1 and op == "all_reduce"
            and nbytes / (facts.comm_channels * facts.n_ranks) >= 64):
        lat *= C.RING_PLATEAU[0] if facts.compcap == "volta" else C.RING_PLATEAU[1]
    return lat + nbytes / (1000 * bw), lat, bw


def _p2p(op: str, nbytes: float, facts: NcclFacts, protocol: str | None) -> dict:
    """moesim's pricing of send/recv with NCCL's constants (NCCL itself has none): every
    peer runs at once on its own channels (enqueue.cc maps each peer round to other
    channels), so the latency is one ring step, base + hwLat of the link type; the bytes
    for peers on the node cross the GPU's NVLink/PCI bandwidth, those for other nodes the
    rank's share of the ring's network channels, whichever ends last; LL halves both."""
    n, local, nodes = facts.n_ranks, facts.ranks_per_node, facts.nodes
    ring = facts.graphs["ring"]
    per_peer = nbytes / n if op == "all_to_all" else nbytes
    key = "net" if nodes > 1 else "intra"
    chans = max(1, min(facts.comm_channels, math.ceil(per_peer / C.P2P_MIN_PART[key])))
    proto = "LL" if per_peer <= chans * C.P2P_LL_THRESHOLD else "Simple"
    if protocol is not None:
        if protocol == "LL128":
            raise InputError(_SRC, "protocol", f"LL or Simple for {op} (NCCL's send/recv "
                             "uses no LL128)", protocol)
        proto = protocol
    p = C.PROTOCOLS.index(proto)
    lat = C.BASE_LAT["ring"][p] + C.HW_LAT["net" if nodes > 1 else facts.intra]["ring"][p]
    factor = C.RING_LL_FACTOR if proto == "LL" else 1.0
    if op == "all_to_all":
        intra_bytes, inter_bytes = per_peer * (local - 1), per_peer * (n - local)
    else:  # send_recv: between two nodes when the pair spans them
        intra_bytes, inter_bytes = (0.0, nbytes) if nodes > 1 else (nbytes, 0.0)
    intra_bw = (facts.gpu_intra_GBps or ring.n_channels * ring.bw_intra) * factor
    inter_bw = ring.n_channels * ring.bw_inter / local * factor if nodes > 1 else math.inf
    t_bytes = max(intra_bytes / (1000 * intra_bw), inter_bytes / (1000 * inter_bw))
    moved = intra_bytes + inter_bytes
    bw = moved / (1000 * t_bytes) if t_bytes > 0 else intra_bw
    return {"algo": "p2p", "protocol": proto, "time_us": lat + t_bytes,
            "latency_us": lat, "bandwidth_GBps": bw, "nccl_model": False, "candidates": {}}


def estimate(op: str, nbytes: float, ranks_per_node: int, nodes: int, facts: NcclFacts,
             algo: str | None = None, protocol: str | None = None
             ) -> tuple[float, str, str, dict]:
    """NCCL's estimate for one ``op`` of ``nbytes`` (nccl-tests S) on ``nodes`` x
    ``ranks_per_node`` ranks: (time s, algorithm, protocol, breakdown). ``algo`` /
    ``protocol`` force NCCL's choice as NCCL_ALGO / NCCL_PROTO do. The breakdown holds
    latency_us, bandwidth_GBps (after NCCL's size corrections), nccl_model and every
    enabled candidate's time in µs ("algo/protocol")."""
    if op not in NCCL_OPS:
        raise InputError(_SRC, "op", "one of " + ", ".join(NCCL_OPS), op)
    if protocol is not None and protocol not in C.PROTOCOLS:
        raise InputError(_SRC, "protocol", "one of " + ", ".join(C.PROTOCOLS), protocol)
    if algo is not None and algo not in C.ALGORITHMS:
        raise InputError(_SRC, "algo", "one of " + ", ".join(C.ALGORITHMS), algo)
    if not (math.isfinite(nbytes) and nbytes >= 0):
        raise InputError(_SRC, "bytes", "a finite size >= 0", nbytes)
    facts = dataclasses.replace(facts, nodes=nodes, ranks_per_node=ranks_per_node)
    if facts.n_ranks == 1:
        return 0.0, "ring", "Simple", {"latency_us": 0.0, "bandwidth_GBps": math.inf,
                                       "nccl_model": True, "candidates": {}}
    if op in P2P_OPS:
        if algo is not None:
            raise InputError(_SRC, "algo", f"no NCCL algorithm for {op} (send/recv)", algo)
        b = _p2p(op, nbytes, facts, protocol)
        return b["time_us"] * 1e-6, b["algo"], b["protocol"], b
    table = tune(op, facts)
    cands = {k: algo_time(op, k[0], k[1], nbytes, facts, table) for k in table}
    pick = {k: v for k, v in cands.items()
            if (algo is None or k[0] == algo) and (protocol is None or k[1] == protocol)}
    if not pick:
        avail = ", ".join(f"{a}/{p}" for a, p in cands) or "none"
        field = "algo" if algo is not None else "protocol"
        raise InputError(_SRC, field, f"an algorithm/protocol NCCL enables for {op} on "
                         f"{nodes} x {ranks_per_node} ranks ({avail})",
                         "/".join(x for x in (algo, protocol) if x))
    best = min(pick, key=lambda k: (pick[k][0], C.ALGORITHMS.index(k[0]),
                                    C.PROTOCOLS.index(k[1])))
    t, lat, bw = pick[best]
    return t * 1e-6, best[0], best[1], {
        "latency_us": lat, "bandwidth_GBps": bw, "nccl_model": True,
        "candidates": {f"{a}/{p}": v[0] for (a, p), v in sorted(cands.items())}}
