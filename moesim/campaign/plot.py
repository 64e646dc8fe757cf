"""The campaign's plots; each takes an Axes and returns it.

- :func:`plot_progress`: training progress (days of uninterrupted training) over wall
  days, the ideal line beside it, interruptions as marks coloured by cause and durable
  checkpoints as ticks along the bottom;
- :func:`plot_causes`: interruptions by cause, simulated beside expected.
"""

from __future__ import annotations

from typing import Any

from moesim.campaign.simulate import Timeline
from moesim.campaign.spec import DAY


def plot_progress(ax: Any, tl: Timeline, summary: dict) -> Any:
    xs = [w / DAY for w, _ in tl.points]
    ys = [k / DAY for _, k in tl.points]
    end = tl.wall_s / DAY
    ax.plot([0, end], [0, end], color="0.75", lw=1, ls="--", label="no interruption")
    ax.plot(xs, ys, color="tab:blue", lw=1.2, label=f"training (ETTR "
            f"{100 * summary['ettr']:.1f} %)")
    names = sorted({n for _, n, _, _ in tl.failures})
    cmap = _colors(len(names))
    at = {n: i for i, n in enumerate(names)}
    work_at = _work_lookup(tl)
    for n in names:
        pts = [(t / DAY, work_at(t) / DAY) for t, c, _, _ in tl.failures if c == n]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, color=cmap[at[n]],
                   label=n.replace("_", " "), zorder=3)
    if tl.checkpoints:
        ax.plot([t / DAY for t in tl.checkpoints], [0.0] * len(tl.checkpoints), "|",
                color="tab:green", ms=6, alpha=0.5, label="durable checkpoint")
    ax.set_xlabel("wall-clock time (days)")
    ax.set_ylabel("training done (days of uninterrupted training)")
    ax.set_title(f"{summary['campaign']}: {summary['gpus']:,} GPUs, "
                 f"{summary['interruptions']} interruptions")
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    ax.set_xlim(0, max(end, 1e-9))
    ax.set_ylim(bottom=-0.02 * max(end, 1e-9))
    return ax


def plot_causes(ax: Any, summary: dict) -> Any:
    rows = sorted(summary["by_cause"], key=lambda r: r["expected"])
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["simulated"] for r in rows], height=0.4,
            color="tab:red", label="simulated")
    ax.barh([i - 0.2 for i in y], [r["expected"] for r in rows], height=0.4,
            color="0.6", label="expected")
    ax.set_yticks(list(y))
    ax.set_yticklabels([r["cause"].replace("_", " ") for r in rows], fontsize=6)
    ax.set_xlabel("interruptions (count)")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cm = colormaps["tab20"]
    return [cm(i % 20) for i in range(n)]


def _work_lookup(tl: Timeline):
    import bisect

    ts = [w for w, _ in tl.points]
    ks = [k for _, k in tl.points]

    def at(t: float) -> float:
        i = bisect.bisect_right(ts, t) - 1
        return ks[max(i, 0)]
    return at
