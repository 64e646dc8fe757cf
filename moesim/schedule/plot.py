"""Draw a stage-time timeline (:func:`moesim.schedule.evaluate.evaluate`) per rank,
coloured as the DualPipe README's figures (deepseek-ai/DualPipe images/dualpipe.png):
forward orange, full backward green, input-gradient backward light green, weight
gradient blue, an overlapped forward-and-backward pair half orange, half green.
Takes a matplotlib Axes and returns it; touches no global pyplot state.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.patches import Patch, Rectangle

from moesim.schedule.evaluate import Timeline

COLORS = {"F": "#F4B63F", "BW": "#3FAF3A", "B": "#8CD97A", "W": "#6EB5F0"}
LABELS = {"F": "forward", "BW": "backward", "B": "backward for input",
          "W": "backward for weights", "F&B": "overlapped forward & backward"}


def plot_schedule(ax: Axes, tl: Timeline, unit: str = "stage-time units",
                  label_mb: bool = True) -> Axes:
    """One row per rank (rank 0 on top); each item a box from its start to its end,
    labelled with its micro-batch (F&B: the forward's, then the backward's)."""
    n = len(tl.busy)
    for r, row in enumerate(tl.busy):
        y = n - 1 - r
        for start, end, it in row:
            w = end - start
            if it.kind == "F&B":
                ax.add_patch(Rectangle((start, y - 0.4), w / 2, 0.8, fc=COLORS["F"],
                                       ec="black", lw=0.4))
                ax.add_patch(Rectangle((start + w / 2, y - 0.4), w / 2, 0.8,
                                       fc=COLORS["BW"], ec="black", lw=0.4))
                text = f"{it.mb}|{it.bmb}"
            else:
                ax.add_patch(Rectangle((start, y - 0.4), w, 0.8, fc=COLORS[it.kind],
                                       ec="black", lw=0.4))
                text = str(it.mb)
            if label_mb and w > 0:
                ax.text(start + w / 2, y, text, ha="center", va="center", fontsize=6)
    ax.set_xlim(0, max(tl.step, 1e-12))
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r}" for r in reversed(range(n))])
    ax.set_xlabel(f"time ({unit})")
    kinds = sorted({it.kind for row in tl.busy for _, _, it in row},
                   key=list(LABELS).index)
    ax.legend(handles=[Patch(fc=COLORS.get(k, COLORS["F"]), ec="black", label=LABELS[k])
                       for k in kinds], loc="upper center", bbox_to_anchor=(0.5, -0.15),
              ncol=len(kinds), fontsize=7, frameon=False)
    return ax
