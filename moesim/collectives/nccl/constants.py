"""NCCL's tuning constants, as NVIDIA/nccl ``src/graph/tuning.cc`` defines them.

Source: NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 (NCCL 2.30.7,
``makefiles/version.mk``), ``src/graph/tuning.cc``: ``ncclTunerConstantsDefaults``
(baseLatencies, hwLatencies, llMaxBws, perChMaxRingLL128Bws, perChMaxTreeLL128Bws,
perChMaxTreeBws, perChMaxNVLSTreeBws), ``nvlsEfficiency``, ``treeCorrectionFactor``
and ``getNetOverhead``; ``src/enqueue.cc`` ``NCCL_P2P_LL_THRESHOLD``. Latencies in µs,
bandwidths in GB/s (10^9 bytes/s), as NCCL keeps them. docs/sources.md lists them.

Indices follow NCCL's: algorithms (Tree, Ring, CollNetDirect, CollNetChain, NVLS,
NVLSTree, PAT), protocols (LL, LL128, Simple), hardware (NVLink, PCI, NET), compute
capability (Volta, Ampere, Hopper, Blackwell), and the node-count column (1 node,
2 nodes, more).
"""

from __future__ import annotations

#: NCCL's algorithm order (src/include/device.h NCCL_ALGO_*); moesim's lower-case names
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
#: NCCL's protocol order (NCCL_PROTO_LL, NCCL_PROTO_LL128, NCCL_PROTO_SIMPLE)
PROTOCOLS = ("LL", "LL128", "Simple")
#: hardware rows of hwLatencies (NCCL_HW_NVLINK, NCCL_HW_PCI, NCCL_HW_NET)
HW = ("nvlink", "pci", "net")

# baseLatencies[algo][proto], µs
BASE_LAT: dict[str, tuple[float, float, float]] = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0, 0, 0), "collnet_chain": (0, 0, 0),
    "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
    "pat": (8.0, 8.0, 8.0),
}

# hwLatencies[hw][algo][proto], µs per step
HW_LAT: dict[str, dict[str, tuple[float, float, float]]] = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "collnet_direct": (0, 0, 3.7), "collnet_chain": (0, 0, 2.8),
               "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25), "pat": (0, 0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
            "collnet_direct": (0, 0, 3.7), "collnet_chain": (0, 0, 2.8),
            "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0),
            "collnet_direct": (0, 0, 31), "collnet_chain": (0, 0, 30),
            "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9), "pat": (0, 0, 14)},
}

#: compute-capability rows (NCCL_VOLTA/AMPERE/HOPPER/BLACKWELL_COMPCAP_IDX)
COMPCAPS = ("volta", "ampere", "hopper", "blackwell")

# llMaxBws[index1][index2], GB/s: index1 is the GPU generation on one node, the CPU
# vendor across nodes (0 Intel, 1 AMD); index2 the node-count column.
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0),
              (2 * 141.0, 2 * 45.0, 2 * 35.0))
PER_CH_MAX_RING_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7),
                             (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0),
                             (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0),
                       (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5),
                            (0.0, 96.0, 80.0))
#: nvlsEfficiency per compute capability
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)

#: treeCorrectionFactor[proto][log2(bytes / 64)], sizes 64 B .. 256 MB (tree all-reduce)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
     1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9,
     .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
     .9, .9, .9),
)

#: getNetOverhead: µs a network step costs at least (x86 Intel 1.0, AMD 2.0, else 1.0);
#: Simple pays it three times
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "other": 1.0}

#: LL: an 8-byte line carries 4 bytes of data and a 4-byte flag (src/include/device.h
#: union ncclLLFifoLine), so ring LL runs at half the bus bandwidth (tuning.cc "* .5");
#: tree LL divides by 3.8.
RING_LL_FACTOR = 0.5
TREE_LL_DIVISOR = 3.8
#: LL128: 120 of every 128 bytes are data (NCCL_LL128_DATAELEMS / NCCL_LL128_LINEELEMS);
#: tuning.cc uses 0.92 for rings, 120/128 for multi-node trees, 7/9 for one-node trees.
RING_LL128_FACTOR = 0.92
TREE_LL128_FACTOR_MULTI = 120.0 / 128.0
TREE_LL128_FACTOR_ONE = 7.0 / 9.0
#: tree all-reduce bus bandwidth * .92; a TREE (not balanced) pattern * .85; PAT * .75
TREE_AR_FACTOR = 0.92
TREE_PATTERN_FACTOR = 0.85
PAT_FACTOR = 0.75
#: ncclTopoGetAlgoTime: ring Simple all-reduce across nodes, once each rank's share of a
#: channel reaches 64 bytes, has its latency x1.4 (x1.9 before Ampere): "plateau effect"
RING_PLATEAU = (1.9, 1.4)
#: enqueue.cc: a send/recv uses LL while its bytes <= nChannels x 16384 (NCCL_P2P_LL_THRESHOLD)
P2P_LL_THRESHOLD = 16384
#: enqueue.cc: a send/recv takes one channel per ``minPartSize`` bytes (up to its peer's
#: channels): the p2p chunk / 8 inside a node, / 2 across nodes; init.cc chunk sizes
#: NCCL_P2P_NVL_CHUNKSIZE 512 KiB, NCCL_P2P_NET_CHUNKSIZE 128 KiB -> 64 KiB either way
P2P_MIN_PART = {"intra": (1 << 19) // 8, "net": (1 << 17) // 2}
