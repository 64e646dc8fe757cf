"""The one engine interface: ``simulate(res, *, progress, engine, **options)`` over a
resolved scenario (a file or a name goes through :func:`moesim.wiring.simulate`).

An engine is a function ``engine(res, *, progress=None, **options) -> SimResult`` over a
resolved scenario (:class:`Engine`). Two are registered in :data:`ENGINES`, chosen by
the scenario's ``engine.mode``:

- ``exact`` (:mod:`moesim.engine.exact`): simpy, every flow on the network model;
- ``fast`` (:mod:`moesim.engine.fast`): the analytical lockstep path for thousands of GPUs.

Both build the same pure op programs (:mod:`moesim.program`), cost ops with the same
models (:mod:`moesim.model.costs`, :mod:`moesim.compute`), route tokens with the same
policies (:mod:`moesim.gating`) and report through the same summary
(:mod:`moesim.engine.summary`); neither imports the other. ``progress`` is called as
``progress("built", total_items)`` once, then with increments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from moesim.engine import collector
from moesim.engine.exact.engine import simulate_exact
from moesim.engine.fast.engine import simulate_fast
from moesim.engine.fast.sampled import sampled_count
from moesim.errors import InputError
from moesim.scenario.limits import check_work
from moesim.scenario.resolved import Resolved
from moesim.trace.result import SimResult

Progress = Callable[..., None]


class Engine(Protocol):
    def __call__(self, res: Resolved, *, progress: Progress | None = None, **options
                 ) -> SimResult: ...


#: engine.mode -> engine
ENGINES: dict[str, Engine] = {"exact": simulate_exact, "fast": simulate_fast}

#: options only the exact engine takes (the fast engine ignores them: it has no flow
#: series, no per-rank mirror traffic switch and no coalescing option; ``dedup`` both take)
EXACT_ONLY = ("record_series", "mirror_traffic", "coalesce_rtol")


def check_size(res: Resolved, mode: str | None = None) -> None:
    """Refuse a step too large to simulate before building it (moesim.scenario.limits):
    the ranks the engine runs count, on the fast path only the replicas it simulates
    (``engine.replicas``: identical one, sampled N of the edp; a bad N is refused here)."""
    scn = res.scenario
    mode = mode or scn.engine.mode
    layers = getattr(res.model, "layers", 1)
    world, edp = res.layout.world, res.layout.edp
    if scn.engine.replicas == "sampled":
        if mode != "fast":
            raise InputError(scn.source, "engine.replicas", "independent or identical on the "
                             "exact engine (sampled runs on engine.mode: fast)", "sampled")
        world = world // edp * sampled_count(scn, edp)
    elif scn.engine.replicas == "identical" and mode == "fast":
        world //= edp
    check_work(scn.source, mode, world, layers, scn.schedule.microbatches)


def simulate(res: Resolved, *, progress: Progress | None = None, engine: str | None = None,
             **options) -> SimResult:
    """Simulate one step of a resolved scenario. ``engine`` overrides the scenario's
    ``engine.mode``; ``options`` go to the engine (``replicas`` for both; see
    :func:`moesim.engine.exact.engine.simulate_exact` for the exact engine's own)."""
    mode = engine or res.scenario.engine.mode
    if mode not in ENGINES:
        raise InputError(res.scenario.source, "engine.mode", "one of " + ", ".join(ENGINES),
                         mode)
    check_size(res, mode)
    if mode == "exact" and options.get("replicas") == "sampled":
        raise InputError(res.scenario.source, "engine.replicas", "independent or identical "
                         "on the exact engine (sampled runs on engine.mode: fast)", "sampled")
    if mode != "exact":
        options = {k: v for k, v in options.items() if k not in EXACT_ONLY}
    with collector.paused():   # almost no reference cycles; ~15 % of the CPU time
        return ENGINES[mode](res, progress=progress, **options)
