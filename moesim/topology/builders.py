"""Structured cluster builders: servers of GPUs on a leaf/spine fabric.

Pure graph construction (no simpy). Every hardware number comes from the preset
YAML (``topologies/*.yaml``), where it is cited; the dataclass below has no
hardware defaults, so a missing number is an error, never a silent guess.

One builder, :func:`build_cluster`, covers every preset:

* ``intra: nvswitch`` -- GPUs of a server on one NVSwitch node (DGX/HGX). The 4
  physical NVSwitch chips are one node: each GPU has one link per direction to it
  carrying its whole NVLink bandwidth.
* ``intra: pcie`` -- a PCIe tree: GPUs under PCIe switches under CPU root
  complexes, CPUs joined by a socket link (UPI/xGMI).
* ``intra: none`` -- no server-internal links (fat-tree hosts).

NICs: ``nic_attach: gpu`` gives one NIC per GPU on a PCIe link to it (DGX: one
ConnectX-7 per GPU); ``nic_attach: pcie_switch`` one NIC per PCIe switch.
``nics_per_node: k`` (a divisor of the GPUs, or of the PCIe switches) gives k NICs
per server instead, each shared by consecutive GPUs (switches), every GPU on its own
PCIe link to its NIC: ``nics_per_node: 1`` with NVSwitch is a server whose GPUs
all send through one NIC.
Fabric (only when ``nodes > 1``): ``nodes_per_leaf`` servers per leaf group.
Rail-optimized: NIC r of every server in a group goes to the rail-r leaf of that
group; otherwise all NICs of a server go to the group's one leaf. Every leaf links
to every spine; spines exist when there is more than one leaf. A leaf's uplinks
carry ``nodes_per_leaf * nics_per_leaf_port * nic bw / oversubscription`` in all,
split evenly over the spines (parallel cables between one leaf and one spine are
one link in the graph). Leaf<->spine links share ``fabric_kind``, ``nic_efficiency``
and have ``spine_latency_us``.

Three tiers (``nodes_per_pod > 0`` and more servers than one pod holds): the leaf groups
are split into pods of ``nodes_per_pod`` servers; each pod has its own ``spines``
(0: half its leaves), linked to every leaf of the pod; the core (super-spine) tier has
``cores`` switches (0: automatic), split into one plane per spine index: spine k of
every pod links to every core of plane k (a k-ary fat-tree's wiring; Meta's Llama 3
cluster, arXiv 2407.21783 §3.3.1; the DGX SuperPOD RA's core tier). A spine's uplinks
carry ``leaves per pod * leaf->spine link / spine_oversubscription`` in all, split
evenly over the cores of its plane; spine<->core links have ``core_latency_us``.
Without pods the graph is the two-tier one, node names and link order unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import networkx as nx

from moesim.errors import InputError
from moesim.topology.bounds import check_bandwidth, check_efficiency, check_gpus, check_latency
from moesim.units import gbps_to_Bps, us_to_s

INTRA_KINDS = ("nvswitch", "pcie", "none")
NIC_ATTACH = ("gpu", "pcie_switch")


@dataclass(frozen=True)
class ClusterSpec:
    """Parameters of :func:`build_cluster`. Bandwidths in GB/s per direction (line
    rate), latencies in µs per link, efficiencies = achievable / line rate."""

    nodes: int = 1
    gpus_per_node: int = 8
    intra: str = "nvswitch"
    rail_optimized: bool = True
    nic_attach: str = "gpu"
    nics_per_node: int = 0           # 0: one per GPU (nic_attach gpu) or per PCIe switch
    fabric_kind: str = "ib"          # link kind of NIC<->leaf and leaf<->spine links
    nodes_per_leaf: int = 32
    spines: int = 0                  # per pod; 0: automatic, ceil(leaves per pod / 2)
    oversubscription: float = 1.0    # leaf downlink bw / uplink bw
    nodes_per_pod: int = 0           # servers per pod (three tiers); 0: one pod, two tiers
    cores: int = 0                   # core switches, a multiple of spines per pod; 0: automatic
    spine_oversubscription: float = 1.0  # spine downlink bw / uplink bw (to the cores)
    # NVLink (intra: nvswitch)
    nvlink_GBps: float | None = None
    nvlink_efficiency: float | None = None
    nvlink_latency_us: float | None = None
    # PCIe (GPU<->NIC, PCIe tree)
    pcie_GBps: float | None = None
    pcie_efficiency: float | None = None
    pcie_latency_us: float | None = None
    # PCIe tree (intra: pcie)
    cpus: int = 2
    pcie_switches_per_cpu: int = 2
    cpu_link_GBps: float | None = None
    cpu_link_efficiency: float | None = None
    cpu_link_latency_us: float | None = None
    # network fabric (nodes > 1)
    nic_GBps: float | None = None
    nic_efficiency: float | None = None
    nic_latency_us: float | None = None     # NIC <-> leaf
    spine_latency_us: float | None = None   # leaf <-> spine
    core_latency_us: float | None = None    # spine <-> core (three tiers)

    @property
    def n_switches(self) -> int:
        return self.cpus * self.pcie_switches_per_cpu

    @property
    def n_nics(self) -> int:
        """NICs per server: ``nics_per_node``, else one per GPU or per PCIe switch."""
        if self.nics_per_node > 0:
            return self.nics_per_node
        return self.gpus_per_node if self.nic_attach == "gpu" else self.n_switches

    def nic_of(self, local: int) -> int:
        """The NIC (index in its server) that GPU ``local`` (or PCIe switch) sends on:
        consecutive GPUs share one when there are fewer NICs than GPUs."""
        per = (self.gpus_per_node if self.nic_attach == "gpu" else self.n_switches) // self.n_nics
        return local // per

    @property
    def has_fabric(self) -> bool:
        return self.nodes > 1

    @property
    def leaf_groups(self) -> int:
        return -(-self.nodes // self.nodes_per_leaf)

    @property
    def n_leaves(self) -> int:
        if not self.has_fabric:
            return 0
        return self.leaf_groups * (self.n_nics if self.rail_optimized else 1)

    @property
    def groups_per_pod(self) -> int:
        """Leaf groups per pod (all of them without pods)."""
        if self.nodes_per_pod <= 0:
            return self.leaf_groups
        return min(self.nodes_per_pod // self.nodes_per_leaf, self.leaf_groups)

    @property
    def n_pods(self) -> int:
        if not self.has_fabric:
            return 0
        return -(-self.leaf_groups // self.groups_per_pod)

    @property
    def leaves_per_pod(self) -> int:
        """Leaves of a full pod."""
        return self.groups_per_pod * (self.n_nics if self.rail_optimized else 1)

    @property
    def spines_per_pod(self) -> int:
        if self.n_leaves <= 1:
            return 0
        return self.spines if self.spines > 0 else -(-self.leaves_per_pod // 2)

    @property
    def n_spines(self) -> int:
        return self.n_pods * self.spines_per_pod

    @property
    def cores_per_plane(self) -> int:
        """Cores each spine links to (0 with one pod); automatic: half the pods."""
        if self.n_pods <= 1:
            return 0
        return self.cores // self.spines_per_pod if self.cores > 0 else -(-self.n_pods // 2)

    @property
    def n_cores(self) -> int:
        return self.spines_per_pod * self.cores_per_plane

    @property
    def uplink_GBps(self) -> float:
        """Line rate of one leaf->spine link (GB/s per direction)."""
        ports = self.nodes_per_leaf * (1 if self.rail_optimized else self.n_nics)
        assert self.nic_GBps is not None
        return ports * self.nic_GBps / self.oversubscription / max(self.spines_per_pod, 1)

    @property
    def core_uplink_GBps(self) -> float:
        """Line rate of one spine->core link: a full pod's leaves times one leaf->spine
        link, over ``spine_oversubscription``, split over the cores of the plane."""
        return (self.leaves_per_pod * self.uplink_GBps / self.spine_oversubscription
                / max(self.cores_per_plane, 1))

    @property
    def structural(self) -> bool:
        """Routed from the structure (link_routing.ClusterRouter), not by graph search."""
        return self.intra in ("nvswitch", "none") and self.nic_attach == "gpu"

    @property
    def connected(self) -> bool:
        """Every GPU reaches every other by construction (no search needed): a fabric
        joins the servers, NVSwitch or a PCIe tree the GPUs of one server."""
        return self.has_fabric or self.intra != "none" or self.gpus_per_node == 1


def spec_field_types() -> dict[str, type]:
    """Field name -> the Python type a YAML value must have."""
    out: dict[str, type] = {}
    for f in fields(ClusterSpec):
        t = str(f.type)
        out[f.name] = int if t == "int" else bool if t == "bool" else str if t == "str" else float
    return out


def _required(spec: ClusterSpec) -> list[str]:
    need: list[str] = []
    if spec.intra == "nvswitch":
        need += ["nvlink_GBps", "nvlink_efficiency", "nvlink_latency_us"]
    if spec.intra == "pcie":
        need += ["cpu_link_GBps", "cpu_link_efficiency", "cpu_link_latency_us"]
    if spec.intra == "pcie" or spec.has_fabric:
        need += ["pcie_GBps", "pcie_efficiency", "pcie_latency_us"]
    if spec.has_fabric:
        need += ["nic_GBps", "nic_efficiency", "nic_latency_us"]
        if spec.n_spines:
            need += ["spine_latency_us"]
        if spec.n_cores:
            need += ["core_latency_us"]
    return need


def validate_spec(spec: ClusterSpec, source: str) -> None:
    """Raise InputError naming ``params.<field>`` for the first bad value."""
    def bad(name: str, expected: str) -> InputError:
        return InputError(source, f"params.{name}", expected, getattr(spec, name))

    if spec.intra not in INTRA_KINDS:
        raise bad("intra", f"one of {', '.join(INTRA_KINDS)}")
    if spec.nic_attach not in NIC_ATTACH:
        raise bad("nic_attach", f"one of {', '.join(NIC_ATTACH)}")
    if spec.nic_attach == "pcie_switch" and spec.intra != "pcie":
        raise bad("nic_attach", "'gpu' unless intra is 'pcie'")
    for name in ("nodes", "gpus_per_node", "nodes_per_leaf", "cpus", "pcie_switches_per_cpu"):
        if getattr(spec, name) < 1:
            raise bad(name, "an integer >= 1")
    if spec.nics_per_node < 0:
        raise bad("nics_per_node", "an integer >= 0 (0: one NIC per GPU or PCIe switch)")
    if spec.nics_per_node > 0:
        attach = spec.gpus_per_node if spec.nic_attach == "gpu" else spec.n_switches
        if attach % spec.nics_per_node:
            raise bad("nics_per_node", f"a divisor of the {attach} "
                      + ("GPUs" if spec.nic_attach == "gpu" else "PCIe switches")
                      + " per node it is shared by")
    if spec.spines < 0:
        raise bad("spines", "an integer >= 0 (0: automatic)")
    if not 0 < spec.oversubscription < math.inf:
        raise bad("oversubscription", "a finite number > 0 (leaf downlink bw / uplink bw)")
    if not 0 < spec.spine_oversubscription < math.inf:
        raise bad("spine_oversubscription", "a finite number > 0 (spine downlink bw / uplink bw)")
    if spec.nodes_per_pod < 0 or spec.nodes_per_pod % spec.nodes_per_leaf:
        raise bad("nodes_per_pod", f"0 (two tiers) or a multiple of nodes_per_leaf = "
                  f"{spec.nodes_per_leaf} (servers per pod)")
    if spec.cores < 0 or (spec.cores and spec.spines_per_pod and spec.cores % spec.spines_per_pod):
        raise bad("cores", f"0 (automatic) or a multiple of the {spec.spines_per_pod} spines "
                  "per pod (one plane of cores per spine index)")
    if spec.intra == "pcie" and spec.gpus_per_node % spec.n_switches:
        raise bad("gpus_per_node", f"a multiple of cpus * pcie_switches_per_cpu = {spec.n_switches}")
    for name in _required(spec):
        if getattr(spec, name) is None:
            raise InputError(source, f"params.{name}", "a number (required by this builder)", None)
    for f in fields(spec):  # every value given, used by this builder or not
        value, where = getattr(spec, f.name), f"params.{f.name}"
        if value is None:
            continue
        if f.name.endswith("_GBps"):
            check_bandwidth(value, source, where)
        elif f.name.endswith("_efficiency"):
            check_efficiency(value, source, where)
        elif f.name.endswith("_latency_us"):
            check_latency(value, source, where)
    check_gpus(spec.nodes * spec.gpus_per_node, source,
               "params.nodes" if spec.nodes > 1 else "params.gpus_per_node",
               spec.nodes if spec.nodes > 1 else spec.gpus_per_node, not spec.structural)


@dataclass(frozen=True)
class ClusterIndex:
    """Node names of a built cluster, by position, for structural routing."""

    spec: ClusterSpec
    gpu: list[list[str]]        # [host][local]
    nvswitch: list[str]         # [host] ("" when intra != nvswitch)
    nic: list[list[str]]        # [host][nic]
    leaf: list[str]             # [leaf index]
    spine: list[str]            # [pod * spines_per_pod + k]
    core: list[str] = field(default_factory=list)  # [plane k * cores_per_plane + m]

    def leaf_of(self, host: int, nic: int) -> int:
        group = host // self.spec.nodes_per_leaf
        return group * self.spec.n_nics + nic if self.spec.rail_optimized else group

    def pod_of_leaf(self, leaf: int) -> int:
        s = self.spec
        return (leaf // s.n_nics if s.rail_optimized else leaf) // s.groups_per_pod


class _Links:
    """Directed links in the order they are added (that order gives the link ids: a
    node's successors in insertion order, the ECMP candidate order); one attribute
    mapping per link class, copied into each edge by networkx."""

    def __init__(self) -> None:
        self.edges: list[tuple[str, str, dict[str, Any]]] = []

    @staticmethod
    def attrs(kind: str, gbps: float, eff: float, lat_us: float) -> dict[str, Any]:
        return {"kind": kind, "line_rate_Bps": gbps_to_Bps(gbps), "efficiency": float(eff),
                "bandwidth_Bps": gbps_to_Bps(gbps) * eff, "latency_s": us_to_s(lat_us)}

    def both(self, u: str, v: str, attrs: dict[str, Any]) -> None:
        self.edges.append((u, v, attrs))
        self.edges.append((v, u, attrs))


def _server(s: ClusterSpec, h: int, nodes: list, links: _Links, cls: dict[str, dict[str, Any]]
            ) -> tuple[list[str], str, list[str]]:
    """Server ``h``'s nodes and links (in place); returns its GPUs, NVSwitch, NICs."""
    row = [f"n{h}.gpu{i}" for i in range(s.gpus_per_node)]
    nodes += [(name, {"kind": "gpu", "host": h, "local": i}) for i, name in enumerate(row)]
    nvsw = ""
    attach = row  # what each NIC hangs off
    if s.intra == "nvswitch":
        nvsw = f"n{h}.nvswitch"
        nodes.append((nvsw, {"kind": "nvswitch", "host": h, "local": -1}))
        for name in row:
            links.both(name, nvsw, cls["nvlink"])
    elif s.intra == "pcie":
        cpus = [f"n{h}.cpu{c}" for c in range(s.cpus)]
        nodes += [(c, {"kind": "cpu", "host": h, "local": -1}) for c in cpus]
        for c in range(1, s.cpus):  # sockets in a chain (2 sockets: one link)
            links.both(cpus[c - 1], cpus[c], cls["cpu"])
        switches = [f"n{h}.pcie{k}" for k in range(s.n_switches)]
        per_switch = s.gpus_per_node // s.n_switches
        for k, sw in enumerate(switches):
            nodes.append((sw, {"kind": "pcie_switch", "host": h, "local": -1}))
            links.both(sw, cpus[k // s.pcie_switches_per_cpu], cls["pcie"])
            for name in row[k * per_switch:(k + 1) * per_switch]:
                links.both(name, sw, cls["pcie"])
        if s.nic_attach == "pcie_switch":
            attach = switches
    nic_row: list[str] = []
    if s.has_fabric:
        nic_row = [f"n{h}.nic{k}" for k in range(s.n_nics)]
        nodes += [(nic, {"kind": "nic", "host": h, "local": -1}) for nic in nic_row]
        for a, name in enumerate(attach):
            links.both(name, nic_row[s.nic_of(a)], cls["pcie"])
    return row, nvsw, nic_row


def build_cluster(spec: ClusterSpec) -> tuple[nx.DiGraph, ClusterIndex]:
    """Build the directed graph (links in both directions) of a validated spec."""
    s = spec
    cls = {"nvlink": (s.nvlink_GBps, s.nvlink_efficiency, s.nvlink_latency_us, "nvlink"),
           "cpu": (s.cpu_link_GBps, s.cpu_link_efficiency, s.cpu_link_latency_us, "cpu"),
           "pcie": (s.pcie_GBps, s.pcie_efficiency, s.pcie_latency_us, "pcie")}
    attrs = {name: _Links.attrs(kind, gbps, eff, lat) for name, (gbps, eff, lat, kind)
             in cls.items() if gbps is not None}
    nodes: list[tuple[str, dict[str, Any]]] = []
    links = _Links()
    gpus, nvsw, nics = [], [], []
    for h in range(s.nodes):
        row, sw, nic_row = _server(s, h, nodes, links, attrs)
        gpus.append(row)
        nvsw.append(sw)
        nics.append(nic_row)

    leaves: list[str] = []
    for grp in range(s.leaf_groups if s.has_fabric else 0):
        if s.rail_optimized:
            leaves += [f"leaf{grp}.rail{r}" for r in range(s.n_nics)]
        else:
            leaves.append(f"leaf{grp}")
    spp, cpp = s.spines_per_pod, s.cores_per_plane
    spines = ([f"pod{p}.spine{k}" for p in range(s.n_pods) for k in range(spp)] if s.n_pods > 1
              else [f"spine{k}" for k in range(s.n_spines)])
    cores = [f"core{c}" for c in range(s.n_cores)]
    nodes += [(name, {"kind": "leaf", "host": -1, "local": -1}) for name in leaves]
    nodes += [(name, {"kind": "spine", "host": -1, "local": -1}) for name in spines]
    nodes += [(name, {"kind": "core", "host": -1, "local": -1}) for name in cores]
    index = ClusterIndex(s, gpus, nvsw, nics, leaves, spines, cores)
    if s.has_fabric:
        nic = _Links.attrs(s.fabric_kind, s.nic_GBps, s.nic_efficiency, s.nic_latency_us)
        for h in range(s.nodes):
            for k, name in enumerate(nics[h]):
                links.both(name, leaves[index.leaf_of(h, k)], nic)
    if spines:
        up = _Links.attrs(s.fabric_kind, s.uplink_GBps, s.nic_efficiency, s.spine_latency_us)
        for i, leaf in enumerate(leaves):  # in spine order (ECMP candidate order)
            p = index.pod_of_leaf(i)
            for sp in spines[p * spp:(p + 1) * spp]:
                links.both(leaf, sp, up)
    if cores:
        top = _Links.attrs(s.fabric_kind, s.core_uplink_GBps, s.nic_efficiency,
                           s.core_latency_us)
        for j, sp in enumerate(spines):  # spine k of every pod: every core of plane k
            k = j % spp
            for core in cores[k * cpp:(k + 1) * cpp]:
                links.both(sp, core, top)
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(links.edges)
    return g, index
