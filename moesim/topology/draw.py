"""Draw a topology on a matplotlib Axes: layered by node kind, grouped by host.

Spines on top, then leaves, NICs, GPUs, and the server-internal switches and CPUs
at the bottom; each server in a shaded box. Lines are links (one per node pair),
colored by link kind. No pyplot global state: the caller owns the figure.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import PathPatch, Rectangle
from matplotlib.path import Path as MplPath

from moesim.topology.graph import Topology

#: layer (y) of each node kind
LAYER = {"core": 6, "spine": 5, "leaf": 4, "nic": 3, "gpu": 2, "nvswitch": 1, "pcie_switch": 1, "cpu": 0}
NODE_COLOR = {"gpu": "#76b900", "nvswitch": "#1f77b4", "pcie_switch": "#9467bd", "cpu": "#8c564b",
              "nic": "#ff7f0e", "leaf": "#17becf", "spine": "#d62728", "core": "#e377c2"}
LINK_COLOR = {"nvlink": "#1f77b4", "pcie": "#9467bd", "ib": "#ff7f0e", "ethernet": "#2ca02c",
              "cpu": "#8c564b"}
MAX_LABELS = 90  # above this many nodes, labels would overlap


def layout(topo: Topology) -> tuple[dict[str, tuple[float, float]], list[tuple[int, float, float]]]:
    """Node positions and host boxes ``(host, x0, x1)``."""
    g = topo.graph
    per_host: dict[int, dict[int, list[str]]] = {}
    shared: dict[int, list[str]] = {}
    for n, d in g.nodes(data=True):
        y = LAYER.get(d["kind"], 1)
        if d["host"] >= 0:
            per_host.setdefault(d["host"], {}).setdefault(y, []).append(n)
        else:
            shared.setdefault(y, []).append(n)
    width = max((len(v) for layers in per_host.values() for v in layers.values()), default=1)
    block = width + 1.0
    pos: dict[str, tuple[float, float]] = {}
    boxes = []
    for h in sorted(per_host):
        x0 = h * block
        boxes.append((h, x0 - 0.5, x0 + width - 0.5))
        for y, names in per_host[h].items():
            names.sort(key=lambda n: (g.nodes[n]["local"], n))
            step = width / len(names)
            for k, n in enumerate(names):
                pos[n] = (x0 + (k + 0.5) * step - 0.5, float(y))
    total = max(len(per_host), 1) * block - 1.0
    for y, names in shared.items():
        step = total / len(names)
        for k, n in enumerate(names):
            pos[n] = ((k + 0.5) * step - 0.5, float(y))
    return pos, boxes


def draw_topology(topo: Topology, ax: Axes) -> Axes:
    """Draw ``topo`` on ``ax`` (nodes colored by kind, links by kind, legend, title)."""
    pos, boxes = layout(topo)
    g = topo.graph
    for h, x0, x1 in boxes:
        ys = [y for n, (_, y) in pos.items() if g.nodes[n]["host"] == h]
        y0, y1 = min(ys) - 0.45, max(ys) + 0.3
        ax.add_patch(Rectangle((x0 - 0.35, y0), x1 - x0 + 0.7, y1 - y0, facecolor="#f2f2f2",
                               edgecolor="#bbbbbb", zorder=0))
        ax.text((x0 + x1) / 2, y0 - 0.08, f"node {h}", ha="center", va="top", fontsize=9)
    seen: set[tuple[str, str]] = set()
    link_kinds: dict[str, set[float]] = {}
    for lid, (u, v) in enumerate(topo.links):
        if (v, u) in seen:
            continue
        seen.add((u, v))
        kind = topo.link_kinds[lid]
        link_kinds.setdefault(kind, set()).add(round(float(topo.capacity_Bps[lid]) / 1e9, 1))
        (x0, y0), (x1, y1) = pos[u], pos[v]
        color = LINK_COLOR.get(kind, "#7f7f7f")
        if abs(y1 - y0) > 1:  # skips a layer: bend it so it does not run through a node there
            ctrl = ((x0 + x1) / 2 + 0.6, (y0 + y1) / 2)
            ax.add_patch(PathPatch(MplPath([(x0, y0), ctrl, (x1, y1)],
                                           [MplPath.MOVETO, MplPath.CURVE3, MplPath.CURVE3]),
                                   facecolor="none", edgecolor=color, lw=0.8, alpha=0.6, zorder=1))
        else:
            ax.plot([x0, x1], [y0, y1], color=color, lw=0.8, alpha=0.6, zorder=1)
    kinds_present = []
    for kind in LAYER:
        names = [n for n, k in g.nodes(data="kind") if k == kind]
        if not names:
            continue
        kinds_present.append(kind)
        xs, ys = zip(*(pos[n] for n in names), strict=True)
        ax.scatter(xs, ys, s=90 if kind == "gpu" else 60, color=NODE_COLOR[kind],
                   edgecolors="black", linewidths=0.5, zorder=3, label=kind)
    if g.number_of_nodes() <= MAX_LABELS:
        for n, (x, y) in pos.items():
            short = n.split(".", 1)[1] if g.nodes[n]["host"] >= 0 and "." in n else n
            ax.annotate(short, (x, y), xytext=(0, -9), textcoords="offset points", ha="center",
                        va="top", fontsize=5.5, rotation=0 if len(short) <= 6 else 30, zorder=4)
    handles = [Line2D([], [], ls="", marker="o", ms=7, mfc=NODE_COLOR[k], mec="black", label=k)
               for k in kinds_present]
    handles += [Line2D([], [], color=LINK_COLOR.get(k, "#7f7f7f"),
                       label=f"{k} ({' / '.join(f'{b:g}' for b in sorted(bws))} GB/s/dir)")
                for k, bws in link_kinds.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    ax.set_title(f"{topo.name}: {topo.n_gpus} GPUs = {topo.n_nodes} node(s) x "
                 f"{topo.gpus_per_node}\nrouting {topo.routing}; link bandwidth in GB/s per "
                 "direction, after efficiency", fontsize=10)
    ax.set_yticks(sorted({LAYER[k] for k in kinds_present}),
                  [" / ".join(k for k in kinds_present if LAYER[k] == y)
                   for y in sorted({LAYER[k] for k in kinds_present})], fontsize=8)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.margins(x=0.03, y=0.12)
    return ax
