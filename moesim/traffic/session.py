"""Serving a scenario's ``load:`` section end to end: the load configuration read from
the resolved scenario, the engine's step-cost surface, the requests run on it and,
under an SLO, the capacity search. What ``moesim serve`` (with a ``load:`` section),
``moesim layout`` and a notebook call, so each reads the section the same way.

    from moesim.serve.run import resolve_serve
    from moesim.traffic.session import load_config, serve_under_load
    res, cfg = resolve_serve("mixtral-8x7b-serve-load")
    sim, summary = serve_under_load(res, cfg, load_config(res))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from moesim.errors import InputError
from moesim.memory.fit import flag_fits
from moesim.scenario.blame import blame_overrides
from moesim.scenario.sections import written
from moesim.traffic.config import LoadConfig, load_from_dict
from moesim.traffic.deploy import build_for, kv_tokens_per_member, load_fits
from moesim.traffic.run import find_capacity, run_load
from moesim.traffic.surface import EngineStepCosts


def load_config(res: Any, overrides: Sequence[str] = (), requests: bool = True) -> LoadConfig:
    """The resolved scenario's ``load:`` section, checked (with ``requests``, its trace and
    length files read now, before any long work); an error from a ``--set`` value names
    the command line."""
    scn = res.scenario
    src = Path(scn.source)
    base = str(src.parent) if src.is_file() else "."
    try:
        cfg = load_from_dict(written(scn.load) if scn.load is not None else {},
                             scn.source, seed=scn.seed, base=base)
        if requests:
            cfg.requests_list()
        return cfg
    except InputError as err:
        raise blame_overrides(err, scn.source, list(overrides)) from None


def check_kv_room(res: Any, cfg: Any, load_cfg: LoadConfig,
                  overrides: Sequence[str] = ()) -> None:
    """Room for a KV cache on every member, checked before any work."""
    try:
        kv_tokens_per_member(res, cfg, load_cfg)
    except InputError as err:
        raise blame_overrides(err, res.scenario.source, list(overrides)) from None


def serve_under_load(res: Any, cfg: Any, load_cfg: LoadConfig, *, slo: dict | None = None,
                     capacity: bool = False, check_points: int = 0, cache: bool = True,
                     strict: bool = False, show: Callable[[str], None] | None = None
                     ) -> tuple[Any, dict]:
    """Run the requests of ``load_cfg`` on the serving deployment ``(res, cfg)``
    (:func:`moesim.serve.run.resolve_serve`): the memory verdict first (``strict``: a
    deployment that does not fit stops there), the step-cost surface (read from the cache
    unless ``cache`` is False; ``check_points``: its worst error against as many direct
    simulations), the run, and with ``capacity`` the largest arrival rate meeting ``slo``.
    ``show`` is told what is happening (a status line). Returns the simulation and the
    ``load`` summary (``moesim serve --json``)."""
    if getattr(cfg, "mtp", None) is not None:   # serve.mtp: one step, not requests
        raise InputError(res.scenario.source, "serve.mtp", "unset with a load run (the "
                         "request-level run emits one token per request per step)",
                         "set")

    def say(text: str) -> None:
        if show is not None:
            show(text)

    fit = flag_fits(load_fits(res, cfg, kv_tokens_per_member(res, cfg, load_cfg)), "serve",
                    strict=strict)
    n = [0]

    def point(kw) -> None:
        n[0] += 1
        say(f"step-cost surface: engine steps simulated: {n[0]}")

    costs = EngineStepCosts(res, cfg, cache=cache, progress=point, **load_cfg.surface.given())
    surf = {"points": costs.sims, "from_cache": costs.from_cache,
            "build_cpu_s": costs.build_s, "key": costs.key()}
    if check_points:
        n[0] = 0
        chk = costs.check(check_points)
        surf["check"] = {"points": check_points, "worst_error": chk["worst_error"],
                         "worst_at": list(chk["worst"])}

    def build(lc, series):
        return build_for(res, cfg, lc, costs, series=series)

    say(f"running {load_cfg.requests or 'the'} requests")
    sim, load = run_load(build, load_cfg, slo)
    if capacity:
        k = [0]

        def ran(r) -> None:
            k[0] += 1
            say(f"capacity search, run {k[0]}: {r['rate_rps']:.4g} requests/s, "
                f"{r['requests']:,} requests: "
                + ("meets the SLO" if r["met"] else f"fails ({r['verdict']})"))

        load["capacity"] = find_capacity(build, load_cfg, slo, progress=ran)
        load["capacity_rps"] = load["capacity"]["capacity_rps"]
    load["surface"] = surf
    summary = {"scenario": res.scenario.name, "mode": "load",
               "scheduler": load_cfg.scheduler, "router": load_cfg.router,
               "groups": len(sim.groups), "members": len(sim.members),
               "kv_tokens_per_member": sim.members[0].kv.tokens, "load": load,
               "fit": fit, "oom": fit["oom"]}
    return sim, summary
