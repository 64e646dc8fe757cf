"""A Gantt picture of a few RL steps: one row per (pool, phase), bars coloured by phase
and labelled with the step; generation bars carry the policy version they ran."""

from __future__ import annotations

from matplotlib.axes import Axes

from moesim.rl.algorithms import algorithm

COLORS = {"generate": "#4c78a8", "old_logprob": "#f58518", "reference": "#e45756",
          "reward": "#72b7b2", "train": "#54a24b", "weight_sync": "#b279a2",
          "switch": "#9d755d"}
#: a phase without a colour of its own (another algorithm's)
OTHER = "#bab0ac"


def plot_gantt(run, ax: Axes, max_steps: int = 4) -> Axes:
    """Draw the first ``max_steps`` steps' spans on ``ax`` and return it."""
    spans = [sp for sp in run.timeline.spans if sp.step < max_steps]
    rows = []
    for pool in ("rollout", "train"):
        for phase in algorithm(run.setup.cfg.algorithm).report:
            if any(sp.pool == pool and sp.phase == phase for sp in spans):
                rows.append((pool, phase))
    y = {r: i for i, r in enumerate(rows)}
    for sp in spans:
        w = sp.end_s - sp.start_s
        ax.barh(y[(sp.pool, sp.phase)], w, left=sp.start_s, height=0.7,
                color=COLORS.get(sp.phase, OTHER), edgecolor="white", linewidth=0.5)
        label = f"{sp.step}" + (f" v{sp.version}" if sp.phase == "generate" else "")
        ax.text(sp.start_s + w / 2, y[(sp.pool, sp.phase)], label, ha="center",
                va="center", fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{p}: {ph}" for p, ph in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time since the run's start (s)")
    cfg = run.setup.cfg
    mode = "colocated" if cfg.colocated else f"max_lag {cfg.max_lag}"
    shown = min(max_steps, len(run.works))
    end = max((sp.end_s for sp in spans), default=0.0)
    ax.set_title(f"{run.setup.scenario.name}: first {shown} RL steps ({mode}) over "
                 f"{end:,.1f} s; bars: phase wall time (s), labels: step, policy version")
    ax.grid(axis="x", alpha=0.3)
    return ax
