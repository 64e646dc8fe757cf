"""Entry points from a scenario file or shipped name to a result: what the CLI,
notebooks, serving, RL, validation and sweeps call.

    from moesim.wiring import simulate
    result = simulate("hot-expert", ["model.layers=2"])      # file or name, --set items

:func:`resolve_path` reads and checks the file (:mod:`moesim.scenario`) and builds its
parts (:func:`moesim.wiring.resolve.resolve`); :func:`simulate` hands the
:class:`~moesim.scenario.resolved.Resolved` scenario to an engine
(:func:`moesim.engine.api.simulate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from moesim.engine.api import Progress, check_size
from moesim.engine.api import simulate as simulate_resolved
from moesim.scenario.read import load_scenario
from moesim.scenario.resolved import Resolved
from moesim.trace.result import SimResult
from moesim.wiring.resolve import resolve


def resolve_path(path: str | Path, overrides: Sequence[str] = ()) -> Resolved:
    """Load, check and resolve a scenario file (or shipped name) with ``--set`` overrides;
    a step too large to simulate on its ``engine.mode`` is refused here."""
    res = resolve(load_scenario(path, list(overrides)))
    check_size(res)
    return res


def simulate(target: str | Path | Resolved, overrides: Sequence[str] = (), *,
             progress: Progress | None = None, engine: str | None = None,
             **options) -> SimResult:
    """Simulate one step. ``target``: a scenario file/name or an already resolved one.
    ``engine`` overrides the scenario's ``engine.mode``; ``options`` go to the engine
    (``replicas`` for both; see :func:`moesim.engine.exact.engine.simulate_exact` for the
    exact engine's own)."""
    res = target if isinstance(target, Resolved) else resolve_path(target, overrides)
    return simulate_resolved(res, progress=progress, engine=engine, **options)
