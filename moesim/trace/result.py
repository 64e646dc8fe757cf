"""The result of simulating one step: spans plus everything reports need.

Contract between the engine (``moesim.engine``) and the readers (``moesim.trace``
exporters, plots, summaries, sweeps). All fields are plain data; ``summary`` is
JSON-able and is exactly what ``moesim run --json`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moesim.trace.spans import Span


@dataclass
class LinkStats:
    """Per directed link: identity and traffic. ``series`` is optional utilization
    over time: for link i, a list of (t_s, rate_Bps) change points (piecewise constant)."""

    names: list[str]                 # "u->v"
    kinds: list[str]                 # nvlink, pcie, ib, ethernet, internal
    capacity_Bps: np.ndarray         # after efficiency
    bytes: np.ndarray                # bytes carried in the step
    series: dict[int, list[tuple[float, float]]] = field(default_factory=dict)


@dataclass
class SimResult:
    spans: list[Span]
    summary: dict                    # the JSON summary (see README: step_time_s, breakdown_s, ...)
    scenario: dict                   # the full resolved scenario, JSON-able
    n_ranks: int
    ranks_per_node: int
    step_time_s: float
    hot_ranks: list[int] = field(default_factory=list)     # ranks holding the most-loaded experts
    hot_rule: str = ""               # the rule that picked hot_ranks, in words
    expert_tokens: np.ndarray | None = None   # (moe_layers, experts) tokens routed, before dropping
    expert_dropped: np.ndarray | None = None  # (moe_layers, experts) tokens dropped
    expert_capacity: np.ndarray | None = None  # (moe_layers,) capacity per expert, tokens (inf if none)
    links: LinkStats | None = None
    wall_s: float = 0.0              # simulator wall time
