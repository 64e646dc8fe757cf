"""What NCCL's tuning model needs to know about a communicator: ``NcclFacts``.

NCCL's ``ncclTopoTuneModel`` reads, per algorithm, the graph its topology search found
(``ncclTopoCompute``, src/graph/search.cc): channels, bandwidth per channel inside a node
(``bwIntra``) and across nodes (``bwInter``), the intra-node link type and the network
latency (``latencyInter``); plus the node and rank counts, the GPU generation and the
CPU vendor. ``facts_from_params`` derives these from a moesim topology's parameters by
a reading of NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 (NCCL 2.30.7):

* bandwidths as NCCL's topology detection reports them: NVLink = links x per-link
  figure (src/graph/topo.h ``SM80_NVLINK_BW`` 20.0, ``SM90_NVLINK_BW`` 20.6,
  ``SM100_NVLINK_BW`` 40.1 GB/s); PCIe = width x per-lane speed / 80
  (src/graph/topo.cc ``kvDictPciGen``: Gen4 x16 24 GB/s, Gen5 x16 48 GB/s); a NIC =
  its port speed / 8 (NDR 400 Gb/s -> 50 GB/s);
* the search's speed ladders (search.cc ``sm90SpeedArrayIntra/Inter`` and the
  pre-Hopper ones): it keeps the graph with the most ``nChannels x bw`` (ties: the
  higher speed, tried first) within the per-GPU link bandwidth, lowering the speed
  while the next one is above .49 of the kept graph's, at most
  ``MAXCHANNELS / 2`` = 32 ring channels; the NVLS search has one channel per GPU and
  inflates the NVLink budget by ngpus / (ngpus - 1) as non-ring patterns do;
* ``ncclTopoDupChannels``: a graph of >= 25 GB/s channels is doubled with half the
  bandwidth each, except on Hopper+ when below 50 GB/s with more than 4 channels;
* ``comm->nChannels`` = 2 x ring channels (src/graph/connect.cc ``ncclTopoPostset``).

This is a simplified search: it counts link budgets instead of walking paths, so it
is exact only for the symmetric NVSwitch + one-NIC-per-GPU servers of moesim's presets
(dgx-h100: 12 x 30 GB/s rings on one node, 8 x 48 GB/s across nodes -- the 16 comm
channels NCCL logs on such clusters, e.g. NVIDIA/nccl issue 1453 "Channel 05/16";
dgx-h800: 8 x 20 GB/s on one node, the "16 coll channels" of NVIDIA/nccl issue 892).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import InputError

_SRC = "nccl"

SPEED_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEED_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0,
               4.0, 3.0, 2.4, 1.2, 0.24, 0.12)
SM90_SPEED_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_SPEED_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                    3.0, 2.4, 1.2, 0.24, 0.12)
SM100_SPEED_INTRA = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
SM100_SPEED_INTER = (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                     15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
#: src/include/device.h MAXCHANNELS; rings search up to MAXCHANNELS / 2 (src/init.cc)
MAXCHANNELS = 64
#: src/include/device.h NCCL_MAX_NVLS_ARITY
MAX_NVLS_ARITY = 32
#: NCCL's per-NVLink bandwidth (src/graph/topo.h SM80/SM90/SM100_NVLINK_BW), GB/s
NVLINK_BW = {"ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
#: line rate of one NVLink per direction: NVLink3/4 25 GB/s (A100: 12 links = 300 GB/s,
#: H100: 18 links = 450 GB/s per direction, NVIDIA datasheets), NVLink5 50 GB/s (B200:
#: 18 links = 900 GB/s per direction, NVIDIA Blackwell datasheet)
NVLINK_LINE_GBPS = {"ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}
#: GPU generation of moesim's device names (CUDA compute capability 8.0 A100, 9.0
#: H100/H800/H200/H20, 10.0 B200: NVIDIA CUDA C Programming Guide, compute capabilities)
COMPCAP_OF = {"A100": "ampere", "H100": "hopper", "H800": "hopper", "H200": "hopper",
              "H20": "hopper", "B200": "blackwell", "GB200": "blackwell"}


@dataclass(frozen=True)
class GraphFacts:
    """One algorithm's graph: channels, GB/s per channel, network latency (µs)."""

    n_channels: int
    bw_intra: float
    bw_inter: float
    latency_inter_us: float = 0.0
    same_channels: bool = False


@dataclass(frozen=True)
class NcclFacts:
    """Everything ``ncclTopoTuneModel`` reads about a communicator.

    ``graphs`` maps an algorithm name (``constants.ALGORITHMS``) to its graph; an
    algorithm without one is unavailable. ``intra`` is "nvlink" or "pci";
    ``ll128_paths_ok`` says the GPU-NIC and GPU-GPU paths are those NCCL enables LL128
    on (GPU-GPU over NVLink, GPU-NIC on the GPU's own PCIe switch).
    """

    nodes: int
    ranks_per_node: int
    compcap: str = "hopper"
    cpu_vendor: str = "intel"
    intra: str = "nvlink"
    graphs: dict[str, GraphFacts] = field(default_factory=dict)
    comm_channels: int = 0
    ll128_paths_ok: bool = True
    balanced_tree: bool = True
    nvls_support: bool = True
    #: a GPU's NVLink (or PCIe) bandwidth as NCCL's topology reports it, GB/s (0: unknown)
    gpu_intra_GBps: float = 0.0

    @property
    def n_ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def _best(speeds: tuple[float, ...], budget: float, max_bw: float, per_speed) -> tuple[int, float]:
    """Walk the speed ladder from the highest speed <= ``max_bw`` down, as the search's
    pass 1 does: keep the graph with the most channels x speed (ties: the first, higher
    speed) and stop once the next speed is <= .49 of the kept one's."""
    best = (0, 0.0)
    for s in speeds:
        if s > max_bw + 1e-9:
            continue
        if best[0] and s / best[1] <= 0.49:
            break
        n = per_speed(s)
        if n >= 1 and n * s > best[0] * best[1] + 1e-9:
            best = (n, s)
    if best[0] == 0:
        raise InputError(_SRC, "topology", f"a link of at least {speeds[-1]} GB/s", budget)
    return best


def _dup(n: int, bw: float, compcap: str, max_channels: int) -> tuple[int, float]:
    """ncclTopoDupChannels."""
    if bw < 25.0 or (compcap in ("hopper", "blackwell") and bw < 50.0 and n > 4):
        return n, bw
    dup = min(2 * n, max_channels)
    return dup, bw / math.ceil(dup / n)


def _pci_bw(pcie_GBps: float) -> float:
    """NCCL's figure for an x16 PCIe link: 16 x (GT/s x 7.5) / 80 (topo.cc)."""
    gts = round(pcie_GBps * 8 / 16 * 130 / 128)
    return 16 * gts * 7.5 / 80


def facts_from_params(params: dict[str, Any], device: str, nodes: int,
                      ranks_per_node: int, cpu_vendor: str = "intel") -> NcclFacts:
    """NcclFacts for ``ranks_per_node`` GPUs on each of ``nodes`` servers of a moesim
    cluster topology (``Topology.params``, ``Topology.device``)."""
    compcap = COMPCAP_OF.get(str(device))
    if compcap is None:
        raise InputError(_SRC, "device", "one of " + ", ".join(COMPCAP_OF), device)
    if nodes < 1 or ranks_per_node < 1:
        raise InputError(_SRC, "ranks", "at least one rank on at least one node",
                         (nodes, ranks_per_node))
    hopper_plus = compcap in ("hopper", "blackwell")
    intra_kind = params.get("intra", "nvswitch")
    speeds_intra = {"blackwell": SM100_SPEED_INTRA, "hopper": SM90_SPEED_INTRA}.get(
        compcap, SPEED_INTRA)
    speeds_inter = {"blackwell": SM100_SPEED_INTER, "hopper": SM90_SPEED_INTER}.get(
        compcap, SPEED_INTER)
    g = ranks_per_node
    if intra_kind == "nvswitch":
        links = round(float(params["nvlink_GBps"]) / NVLINK_LINE_GBPS[compcap])
        gpu_bw = links * NVLINK_BW[compcap]
        intra = "nvlink"
    else:
        gpu_bw = _pci_bw(float(params["pcie_GBps"]))
        intra = "pci"
    ring_max = MAXCHANNELS // 2
    graphs: dict[str, GraphFacts] = {}
    if nodes == 1:
        n, s = _best(speeds_intra, gpu_bw, gpu_bw,
                     lambda s: min(ring_max, int(gpu_bw // s + 1e-9)))
        n, s = _dup(n, s, compcap, ring_max)
        ring = GraphFacts(n, s, s)
    else:
        n_nics = int(params.get("nics_per_node") or g)
        nic_bw = min(float(params["nic_GBps"]), _pci_bw(float(params["pcie_GBps"])))
        # each channel enters a node through one NIC and leaves through another; the
        # GPUs in between forward over NVLink: (g-1)/g of the channels cross each GPU
        def channels(s: float) -> int:
            nv_cap = int(gpu_bw * g / max(g - 1, 1) // s + 1e-9)
            return min(ring_max, n_nics * int(nic_bw // s + 1e-9), nv_cap)

        n, s = _best(speeds_inter, nic_bw, nic_bw, channels)
        n, s = _dup(n, s, compcap, ring_max)
        ring = GraphFacts(n, s, s)
    graphs["ring"] = ring
    graphs["tree"] = ring  # tree maxChannels = ring channels; same ladder (init.cc)
    if ranks_per_node == 1 and nodes > 1:  # ncclPatEnable: one GPU per node
        graphs["pat"] = ring
    if intra_kind == "nvswitch" and hopper_plus and g > 1:
        nc = min(MAX_NVLS_ARITY, g)
        budget = gpu_bw * g / (g - 1)
        _, s = _best(speeds_intra, budget, gpu_bw, lambda s: nc if nc * s <= budget + 1e-9 else 0)
        graphs["nvls"] = GraphFacts(nc, s, s if nodes == 1 else ring.bw_inter)
        if nodes > 1:
            graphs["nvls_tree"] = graphs["nvls"]
    return NcclFacts(nodes=nodes, ranks_per_node=ranks_per_node, compcap=compcap,
                     cpu_vendor=cpu_vendor, intra=intra, graphs=graphs,
                     comm_channels=min(MAXCHANNELS, 2 * ring.n_channels),
                     ll128_paths_ok=intra == "nvlink",
                     nvls_support="nvls" in graphs, gpu_intra_GBps=gpu_bw)
