"""A campaign end to end: the campaign file, the scenario's step (simulated through
:mod:`moesim.wiring`, or given), the costs, the simulated campaign, the interval sweep
and the summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moesim.campaign.costs import scenario_costs
from moesim.campaign.simulate import Costs, Timeline, simulate_campaign
from moesim.campaign.spec import DAY, Campaign, positive
from moesim.campaign.summary import interval_sweep, summarize
from moesim.errors import InputError

#: the longest campaign one run simulates: ten years of wall clock
MAX_DAYS = 3650.0
CLI = "command line"


@dataclass
class CampaignRun:
    campaign: Campaign
    costs: Costs
    timeline: Timeline
    summary: dict


def check_length(days: Any, tokens: Any) -> tuple[float | None, float | None]:
    """--days and --tokens checked: one of them, days at most :data:`MAX_DAYS`."""
    if days is None and tokens is None:
        raise InputError(CLI, "--days", "--days D or --tokens N (how long the campaign "
                         "runs)", None)
    if days is not None:
        days = positive(CLI, "--days", days, upto=MAX_DAYS)
    if tokens is not None:
        tokens = positive(CLI, "--tokens", tokens, upto=1e18)
    return days, tokens


def resolve_step(scenario: str | None, overrides: list[str], step_s: float | None
                 ) -> tuple[Any, float | None, str]:
    """(resolved scenario or None, step seconds or None, where the step came from)."""
    if scenario is None:
        if overrides:
            raise InputError(CLI, "--set", "a scenario to apply --set to", overrides[0])
        return None, step_s, "--step-s" if step_s is not None else ""
    from moesim.scenario import load_scenario
    from moesim.wiring import resolve, simulate

    if step_s is not None:      # no step to simulate: the size limit of a step is moot
        return resolve(load_scenario(scenario, list(overrides))), step_s, "--step-s"
    from moesim.wiring import resolve_path

    res = resolve_path(scenario, overrides)
    result = simulate(res)
    return res, float(result.step_time_s), f"one simulated step of {res.scenario.name} " \
        f"({res.scenario.engine.mode} engine)"


def run_campaign(camp: Campaign, res: Any, step_s: float | None, step_from: str, *,
                 days: float | None, tokens: float | None, seed: int = 0,
                 sweep: bool = True, progress: Callable[[float], None] | None = None
                 ) -> CampaignRun:
    costs, sources = scenario_costs(camp, res, step_s)
    if step_from:
        sources["step"] = step_from
    if not costs.step_s > 0:
        raise InputError(camp.source, "step.seconds", "a step time > 0 (a scenario to "
                         "simulate, --step-s, or step.seconds)", costs.step_s or None)
    target = None if tokens is None else tokens / costs.tokens_per_step * costs.step_s
    limit = MAX_DAYS if days is None else days
    tl = simulate_campaign(camp, costs, days=limit, target_work_s=target, seed=seed,
                           progress=progress)
    sw = interval_sweep(camp, costs, tl.wall_s / DAY, seed) if sweep else None
    summary = summarize(camp, costs, tl, sources, seed=seed, days=days, tokens=tokens,
                        sweep=sw)
    if tokens is not None:
        summary["tokens_reached"] = bool(summary["tokens"] >= tokens * (1 - 1e-12))
    return CampaignRun(camp, costs, tl, summary)
