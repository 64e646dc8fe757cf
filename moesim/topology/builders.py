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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

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
    spines: int = 0                  # 0: automatic, ceil(leaves / 2)
    oversubscription: float = 1.0    # leaf downlink bw / uplink bw
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
    def n_spines(self) -> int:
        if self.n_leaves <= 1:
            return 0
        return self.spines if self.spines > 0 else -(-self.n_leaves // 2)

    @property
    def uplink_GBps(self) -> float:
        """Line rate of one leaf->spine link (GB/s per direction)."""
        ports = self.nodes_per_leaf * (1 if self.rail_optimized else self.n_nics)
        assert self.nic_GBps is not None
        return ports * self.nic_GBps / self.oversubscription / max(self.n_spines, 1)


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
               spec.nodes if spec.nodes > 1 else spec.gpus_per_node)


@dataclass(frozen=True)
class ClusterIndex:
    """Node names of a built cluster, by position, for structural routing."""

    spec: ClusterSpec
    gpu: list[list[str]]        # [host][local]
    nvswitch: list[str]         # [host] ("" when intra != nvswitch)
    nic: list[list[str]]        # [host][nic]
    leaf: list[str]             # [leaf index]
    spine: list[str]

    def leaf_of(self, host: int, nic: int) -> int:
        group = host // self.spec.nodes_per_leaf
        return group * self.spec.n_nics + nic if self.spec.rail_optimized else group


def _link(g: nx.DiGraph, u: str, v: str, kind: str, gbps: float, eff: float, lat_us: float) -> None:
    for a, b in ((u, v), (v, u)):
        g.add_edge(a, b, kind=kind, line_rate_Bps=gbps_to_Bps(gbps), efficiency=float(eff),
                   bandwidth_Bps=gbps_to_Bps(gbps) * eff, latency_s=us_to_s(lat_us))


def build_cluster(spec: ClusterSpec) -> tuple[nx.DiGraph, ClusterIndex]:
    """Build the directed graph (links in both directions) of a validated spec."""
    s = spec
    g = nx.DiGraph()
    gpus: list[list[str]] = []
    nvsw: list[str] = []
    nics: list[list[str]] = []
    for h in range(s.nodes):
        row = [f"n{h}.gpu{i}" for i in range(s.gpus_per_node)]
        for i, name in enumerate(row):
            g.add_node(name, kind="gpu", host=h, local=i)
        gpus.append(row)
        nvsw.append("")
        attach = row  # what each NIC hangs off
        if s.intra == "nvswitch":
            nvsw[h] = f"n{h}.nvswitch"
            g.add_node(nvsw[h], kind="nvswitch", host=h, local=-1)
            for name in row:
                _link(g, name, nvsw[h], "nvlink", s.nvlink_GBps, s.nvlink_efficiency, s.nvlink_latency_us)
        elif s.intra == "pcie":
            cpus = [f"n{h}.cpu{c}" for c in range(s.cpus)]
            for c in cpus:
                g.add_node(c, kind="cpu", host=h, local=-1)
            for c in range(1, s.cpus):  # sockets in a chain (2 sockets: one link)
                _link(g, cpus[c - 1], cpus[c], "cpu", s.cpu_link_GBps, s.cpu_link_efficiency,
                      s.cpu_link_latency_us)
            switches = [f"n{h}.pcie{k}" for k in range(s.n_switches)]
            per_switch = s.gpus_per_node // s.n_switches
            for k, sw in enumerate(switches):
                g.add_node(sw, kind="pcie_switch", host=h, local=-1)
                _link(g, sw, cpus[k // s.pcie_switches_per_cpu], "pcie", s.pcie_GBps,
                      s.pcie_efficiency, s.pcie_latency_us)
                for name in row[k * per_switch:(k + 1) * per_switch]:
                    _link(g, name, sw, "pcie", s.pcie_GBps, s.pcie_efficiency, s.pcie_latency_us)
            if s.nic_attach == "pcie_switch":
                attach = switches
        nic_row: list[str] = []
        if s.has_fabric:
            for k in range(s.n_nics):
                nic = f"n{h}.nic{k}"
                g.add_node(nic, kind="nic", host=h, local=-1)
                nic_row.append(nic)
            for a, name in enumerate(attach):
                _link(g, name, nic_row[s.nic_of(a)], "pcie", s.pcie_GBps, s.pcie_efficiency,
                      s.pcie_latency_us)
        nics.append(nic_row)

    leaves: list[str] = []
    for grp in range(s.leaf_groups if s.has_fabric else 0):
        if s.rail_optimized:
            leaves += [f"leaf{grp}.rail{r}" for r in range(s.n_nics)]
        else:
            leaves.append(f"leaf{grp}")
    for name in leaves:
        g.add_node(name, kind="leaf", host=-1, local=-1)
    spines = [f"spine{k}" for k in range(s.n_spines)]
    for name in spines:
        g.add_node(name, kind="spine", host=-1, local=-1)
    index = ClusterIndex(s, gpus, nvsw, nics, leaves, spines)
    for h in range(s.nodes if s.has_fabric else 0):
        for k, nic in enumerate(nics[h]):
            _link(g, nic, leaves[index.leaf_of(h, k)], s.fabric_kind, s.nic_GBps,
                  s.nic_efficiency, s.nic_latency_us)
    for leaf in leaves:  # leaf->spine links added in spine order (ECMP candidate order)
        for sp in spines:
            _link(g, leaf, sp, s.fabric_kind, s.uplink_GBps, s.nic_efficiency, s.spine_latency_us)
    return g, index
