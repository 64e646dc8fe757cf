"""The layers of moesim, bottom to top: each tier lists top-level packages (and base
modules) of ``moesim/``; a package imports only packages of its own tier or of tiers
below it, function-level imports included. Inside a tier the packages import one another
without a cycle. tests/test_layers.py checks both and allows at most two imports that run
from a lower tier up to a higher one; a new package is added to a tier here.
"""

from __future__ import annotations

TIERS: tuple[tuple[str, ...], ...] = (
    # base modules: errors, units, paths, YAML reading, numba switch; the package root
    ("moesim", "errors", "units", "paths", "yamlio", "jitenv", "layers"),
    # writing files safely (run folders, the outputs manifest)
    ("outputs",),
    # the cluster, its links and flows, the parallel layout, pipeline schedules, token
    # routing, kernel pricing
    ("topology", "network", "layout", "schedule", "gating", "compute"),
    # what is built on those: collectives over the network, the model's layers and
    # kernels, expert-parallel exchanges
    ("collectives", "model", "ep"),
    # a scenario's schema, reading and checks: pure data
    ("scenario",),
    # device memory of a step
    ("memory",),
    # the step plan: per-rank programs of kernels and transfers
    ("program",),
    # results, spans, plots and reports: they take data, never an engine
    ("trace",),
    # the exact and fast engines, the breakdown and summary both report
    ("engine",),
    # a scenario file or name -> resolved objects -> an engine
    ("wiring",),
    # what is built on an engine: the serving step, serving traffic, RL, validation
    # against recorded traces, sweeps, training campaigns over days, distillation
    ("serve", "traffic", "rl", "validation", "sweep", "campaign", "distill"),
    # the command line
    ("cli", "__main__"),
)


def tier_of() -> dict[str, int]:
    """Package -> its tier (0 = bottom)."""
    return {p: i for i, tier in enumerate(TIERS) for p in tier}
