"""The machine a calibration was recorded on, as a topology.

The recording machine is modelled as N ranks on one host, each linked to one switch
node; each link has the calibration's bandwidth and half its latency, so a
point-to-point transfer of B bytes takes ``latency_s + B / bandwidth_Bps``: the
calibrated all-to-all cost (:class:`moesim.compute.calibrated.CommCalibration`), where
B is the busiest rank's off-rank bytes. Used by trace validation
(:mod:`moesim.validation.cpu.validate`) and by ``cluster: {topology: calibration}``.
"""

from __future__ import annotations

from typing import Protocol

from moesim.topology.bounds import MAX_LINK_GBPS
from moesim.topology.graph import Topology
from moesim.topology.loader import parse_topology


class LinkFit(Protocol):
    """What a topology needs of a calibrated all-to-all fit (a ``CommCalibration``)."""

    latency_s: float
    bandwidth_Bps: float
    backend: str
    duplex: bool


def machine_topology(world: int, comm: LinkFit) -> Topology:
    """N ranks on one host, each linked to one switch node; every transfer crosses its
    sender's and its receiver's link, each with the calibrated bandwidth and half the
    calibrated latency.

    ``comm.duplex``: a link per direction (sends and receives of a rank do not share).
    Half-duplex (gloo: a rank's core copies both ways): rank r's sends and receives
    cross one directed "copy" link ``in_r → out_r`` (rank r → in_r → out_r → switch;
    switch → in_r → out_r → rank r), so they share its bandwidth, and a transfer of B
    bytes alone still takes ``latency_s + B / bandwidth_Bps``."""
    nodes = [{"id": f"rank{r}", "kind": "gpu", "host": 0, "local": r} for r in range(world)]
    nodes.append({"id": "switch", "kind": "pcie_switch"})
    half_us = comm.latency_s / 2 * 1e6
    kind = comm.backend or "loopback"
    bw = comm.bandwidth_Bps / 1e9
    if comm.duplex:
        links = [{"src": f"rank{r}", "dst": "switch", "kind": kind,
                  "bandwidth_GBps": bw, "latency_us": half_us} for r in range(world)]
    else:
        # the hops around the copy link are free: bandwidth far above the copy rate, and
        # within what a topology accepts (a fast calibrated copy rate times 1e6 is not)
        free = {"kind": kind, "bandwidth_GBps": min(bw * 1e6, MAX_LINK_GBPS),
                "latency_us": 0.0, "bidirectional": False}
        links = []
        for r in range(world):
            a, b = f"in{r}", f"out{r}"
            nodes += [{"id": a, "kind": "pcie_switch"}, {"id": b, "kind": "pcie_switch"}]
            links += [{"src": a, "dst": b, "kind": kind, "bandwidth_GBps": bw,
                       "latency_us": half_us, "bidirectional": False},
                      {"src": f"rank{r}", "dst": a, **free}, {"src": b, "dst": "switch", **free},
                      {"src": "switch", "dst": a, **free}, {"src": b, "dst": f"rank{r}", **free}]
    return parse_topology({"name": f"recording-machine-{world}", "nodes": nodes,
                           "links": links}, "calibration (recording machine)")
