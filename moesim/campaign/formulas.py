"""Closed forms of checkpointing under exponential failures (pure arithmetic, seconds).

- Young's interval (J. W. Young, "A first order approximation to the optimum checkpoint
  interval", CACM 17(9), 1974): ``sqrt(2·C·M)`` for a checkpoint costing C seconds of
  the job and a mean time between interruptions M.
- Daly's higher-order interval (J. T. Daly, "A higher order estimate of the optimum
  checkpoint interval for restart dumps", Future Generation Computer Systems 22(3), 2006,
  Eq. 37): ``sqrt(2CM)·[1 + sqrt(C/(2M))/3 + (C/(2M))/9] − C`` for C < 2M, else M.
- Effective training time ratio (ETTR: productive training time over wall-clock time,
  the definition of Kokolis et al., "Revisiting Reliability in Large-Scale Machine
  Learning Research Clusters", HPCA 2025, arXiv 2410.21680) to first order in 1/M,
  moesim's own derivation from the quantities their estimate uses: each interruption costs
  its restart R plus the work since the last durable checkpoint, on average half a
  cycle (interval Δ plus pause C) plus the lag L until an asynchronous write is durable;
  each cycle spends C of Δ + C paused: ``(1 − (R + (Δ+C)/2 + L)/M) · Δ/(Δ+C)``.
- Expected work lost per interruption with checkpoints every Δ of training and
  exponential failures of rate λ restarting from a checkpoint (no pause, no restart):
  ``E[X mod Δ] = 1/λ − Δ·e^{−λΔ}/(1 − e^{−λΔ})`` for X ~ Exp(λ).
"""

from __future__ import annotations

import math


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """sqrt(2·C·M), seconds of training between checkpoints."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly 2006, Eq. 37 (M when the checkpoint costs at least 2M)."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost_s


def expected_ettr(interval_s: float, pause_s: float, restart_s: float, mtbf_s: float,
                  lag_s: float = 0.0, losing: float = 1.0) -> float:
    """First-order expected ETTR (see the module text), clipped at 0; ``losing``: the
    share of interruptions that lose the work since the last checkpoint (planned stops
    and a replica's own restart lose none)."""
    cycle = interval_s + pause_s
    e = (1.0 - (restart_s + losing * (cycle / 2.0 + lag_s)) / mtbf_s) * interval_s / cycle
    return max(e, 0.0)


def expected_lost_work(rate_per_s: float, interval_s: float) -> float:
    """E[X mod Δ] for X ~ Exp(rate): work lost per interruption, seconds."""
    z = math.exp(-rate_per_s * interval_s)
    return 1.0 / rate_per_s - interval_s * z / (1.0 - z)
