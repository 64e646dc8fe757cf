"""The link figure of a simulated step (``links.png``): the links of highest
utilization, grouped by kind (NVLink, PCIe, NIC, leaf/spine), as a heat-map of
utilization on the step's true time axis where the run kept per-link rate series
(:mod:`moesim.trace.link_bins`), else as bars of the mean over the step. Takes a
matplotlib Axes and returns it.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import PowerNorm
from matplotlib.patches import Patch

from moesim.trace.link_bins import binned_utilization, even_edges, peak_utilization
from moesim.trace.result import SimResult


def link_group(name: str, kind: str) -> str:
    """NVLink, PCIe, NIC (a link touching a NIC), leaf/spine (switch-to-switch), else kind."""
    low = name.lower()
    if "spine" in low:
        return "leaf/spine"
    if "nic" in low:
        return "NIC"
    if "leaf" in low:
        return "leaf/spine"
    return {"nvlink": "NVLink", "pcie": "PCIe", "ib": "NIC", "ethernet": "NIC"}.get(kind, kind)


_GROUP_STYLE = {"NVLink": "#4C72B0", "PCIe": "#8172B3", "NIC": "#DD8452", "leaf/spine": "#55A868"}
_GROUP_ORDER = {g: i for i, g in enumerate(_GROUP_STYLE)}


def busiest_links(nbytes: np.ndarray, capacity_Bps: np.ndarray, groups: list[str],
                  step_s: float, top: int) -> list[int]:
    """The ``top`` links of highest mean utilization over the step (bytes / (capacity ×
    step): the time each would need at full rate, so a 50 GB/s NIC bounding an EP
    all-to-all ranks above a 450 GB/s NVLink carrying more bytes), each link kind that
    carried bytes keeping its busiest among them; links that carried nothing left out."""
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(capacity_Bps > 0, nbytes / (capacity_Bps * max(step_s, 1e-30)), 0.0)
    ranked = [int(i) for i in np.argsort(-util, kind="stable") if nbytes[i] > 0]
    chosen = ranked[:top]
    for g in dict.fromkeys(groups[i] for i in ranked):
        if top > 0 and not any(groups[i] == g for i in chosen):
            first = next(i for i in ranked if groups[i] == g)
            # replace the lowest-ranked link of a kind shown more than once
            counts = {k: sum(groups[j] == k for j in chosen) for k in set(groups[j] for j in chosen)}
            drop = next((j for j in reversed(chosen) if counts[groups[j]] > 1), None)
            if drop is not None:
                chosen[chosen.index(drop)] = first
    return chosen


def plot_links(result: SimResult, ax: Axes, top: int = 8, bins: int = 300) -> Axes:
    """The ``top`` links of highest utilization (:func:`busiest_links`), grouped by
    NVLink / PCIe / NIC / leaf-spine. With utilization series: a heat-map on the step's
    true time axis (ms), one row per link, of the mean utilization (% of capacity) in at
    most ``bins`` bins of one round width (:func:`moesim.trace.link_bins.even_edges`),
    each row labelled with its mean and peak utilization; without: mean utilization over
    the step (bytes / capacity / step time) as horizontal bars."""
    ls = result.links
    if ls is None or len(ls.names) == 0:
        ax.text(0.5, 0.5, "no link statistics in this run", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    nbytes = np.asarray(ls.bytes, float)
    cap = np.asarray(ls.capacity_Bps, float)
    all_groups = [link_group(n, k) for n, k in zip(ls.names, ls.kinds, strict=True)]
    busiest = busiest_links(nbytes, cap, all_groups, result.step_time_s, top)
    if not busiest:  # e.g. the fast path, which does not track per-link bytes
        shortcuts = (result.summary or {}).get("shortcuts") or []
        untracked = any(isinstance(s, dict) and s.get("name") == "no_link_bytes"
                        for s in shortcuts)
        ax.text(0.5, 0.5, "per-link bytes are not tracked in this run: rerun with\n"
                "--set engine.mode=exact for link utilization" if untracked else
                "no link carried bytes in this run", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    groups = {i: all_groups[i] for i in busiest}
    mean_util = {i: nbytes[i] / (cap[i] * result.step_time_s) * 100
                 if cap[i] > 0 and result.step_time_s > 0 else 0.0 for i in busiest}

    def order_key(i: int) -> tuple:
        return (_GROUP_ORDER.get(groups[i], 9), groups[i], -mean_util[i])

    step = result.step_time_s
    if step > 0 and all(i in ls.series for i in busiest):
        order = sorted(busiest, key=order_key)
        # the step's true time axis: bins of one round width, each cell the mean
        # utilization in its bin; a burst shorter than a bin shows in the row's peak
        edges = even_edges(step, bins)
        util = np.array([binned_utilization(ls.series[i], cap[i], edges) for i in order]) * 100
        peak = {i: peak_utilization(ls.series[i], cap[i], step) * 100 for i in order}
        # square-root colour scale: a link busy a few percent of a bin is not black (the
        # colorbar's ticks give the true percentages)
        im = ax.pcolormesh(edges * 1e3, np.arange(len(order) + 1) - 0.5, util,
                           cmap="magma", norm=PowerNorm(0.5, vmin=0.0, vmax=100.0),
                           shading="flat")
        im.set_gid("links:heatmap")
        ax.set_ylim(len(order) - 0.5, -0.5)
        ax.set_xlim(0.0, step * 1e3)
        cb = ax.figure.colorbar(im, ax=ax, pad=0.01,
                                label="mean utilization in the bin (% of capacity; sqrt scale)")
        cb.set_ticks([0, 5, 10, 25, 50, 75, 100])
        ax.set_yticks(range(len(order)))
        ax.set_yticklabels([f"{groups[i]}: {ls.names[i]}  ({nbytes[i] / 1e9:.2f} GB @ "
                            f"{cap[i] / 1e9:.0f} GB/s, mean {mean_util[i]:.1f} %, "
                            f"peak {peak[i]:.0f} %)" for i in order], fontsize=7)
        for k in range(1, len(order)):
            if groups[order[k]] != groups[order[k - 1]]:
                ax.axhline(k - 0.5, color="white", lw=1.5)
        w_ms = (edges[1] - edges[0]) * 1e3
        ax.set_xlabel(f"time in step (ms); each column the mean over a {w_ms:.3g} ms bin "
                      "(peak: the highest rate at any instant)")
        ax.set_title(f"Link utilization over the step: the {len(order)} most utilized of "
                     f"{len(ls.names)} links (bytes / capacity / step)", fontsize=10)
        return ax
    order = sorted(busiest, key=order_key)
    util = [mean_util[i] for i in order]
    y = np.arange(len(order))
    ax.barh(y, util, color=[_GROUP_STYLE.get(groups[i], "grey") for i in order])
    for yi, i, u in zip(y, order, util, strict=True):
        ax.text(u, yi, f" {nbytes[i] / 1e9:.2f} GB @ {cap[i] / 1e9:.0f} GB/s", va="center",
                fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels([ls.names[i] for i in order], fontsize=7)
    ax.set_ylim(len(order) - 0.5, -0.5)
    ax.set_xlim(0, max([100.0, *util]) * 1.35)
    ax.set_xlabel("mean utilization over the step (% = bytes / capacity / step time)")
    ax.set_title(f"The {len(order)} most utilized links (of {len(ls.names)})")
    ax.legend(handles=[Patch(color=_GROUP_STYLE.get(g, "grey"), label=g)
                       for g in dict.fromkeys(groups[i] for i in order)],
              loc="lower right", fontsize=8)
    return ax
