"""``moesim serve`` on a scenario with a ``load:`` section: requests over time.

Builds (or reads from the cache) the engine's step-cost surface, runs the requests and
prints the ``load`` summary over the steady-state measurement window
(:mod:`moesim.traffic.window`; ``--json``: the summary as JSON), optionally the surface's
error against direct simulation (``--check-surface N``) and the capacity under ``--slo``
(``--find-capacity``). Files follow the output convention of every command: the folder
(``-o DIR``, default ``out/<scenario>``; none with ``--no-files``) is held by this run
(:func:`moesim.outputs.claim`) and gets ``summary.md``, ``summary.json`` (last),
``requests.csv``, ``load.png`` and ``trace.json`` (Perfetto counter tracks), written
atomically and marked as this command's, so the same command reruns into it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

CLI = "command line"
#: direct simulations --check-surface may ask for per phase (each one engine step)
MAX_CHECK_POINTS = 100


def _load_cfg(res, overrides):
    from moesim.errors import InputError
    from moesim.scenario.blame import blame_overrides
    from moesim.traffic.config import load_from_dict
    scn = res.scenario
    src = Path(scn.source)
    base = str(src.parent) if src.is_file() else "."
    try:
        cfg = load_from_dict(dict(scn.load) if isinstance(scn.load, Mapping) else scn.load,
                             scn.source, seed=scn.seed, base=base)
        cfg.requests_list()     # trace and length files read now, before the long part
        return cfg
    except InputError as err:
        raise blame_overrides(err, scn.source, list(overrides)) from None


def _check_flags(args, load_cfg):
    """The serve-under-load flags, checked before any work: (slo or None)."""
    from moesim.errors import InputError
    from moesim.traffic.metrics import parse_slo
    slo = parse_slo(args.slo) if args.slo is not None else None
    if args.find_capacity and not slo:
        raise InputError(CLI, "--find-capacity", "an SLO to meet: --slo ttft_p99=2s,"
                         "tpot_p99=50ms", "no --slo")
    if args.find_capacity and load_cfg.rate is None:
        raise InputError(CLI, "--find-capacity", "a load.arrival.rate_rps to start the "
                         "search from", "none")
    n = args.check_surface
    if not 0 <= n <= MAX_CHECK_POINTS:
        raise InputError(CLI, "--check-surface", f"a number of points from 0 to "
                         f"{MAX_CHECK_POINTS} (each is one engine step per phase)", n)
    return slo


def run_load_cmd(args, res, cfg) -> int:
    from moesim.cli.common import output_folder
    from moesim.errors import InputError
    from moesim.outputs import check_run_folder, claim
    from moesim.scenario.blame import blame_overrides
    from moesim.traffic.deploy import kv_tokens_per_member

    load_cfg = _load_cfg(res, args.overrides)
    slo = _check_flags(args, load_cfg)
    try:
        kv_tokens_per_member(res, cfg, load_cfg)     # room for a KV cache, before the work
    except InputError as err:
        raise blame_overrides(err, res.scenario.source, list(args.overrides)) from None
    out = output_folder(args, res.scenario.name, args.overrides)
    ident = res.scenario.to_dict()
    if out is None:
        return _simulate(args, res, cfg, load_cfg, slo, None)
    check_run_folder(out, args.force, identity=ident)     # before the long part
    with claim(out, force=args.force, identity=ident):
        return _simulate(args, res, cfg, load_cfg, slo, out)


def _simulate(args, res, cfg, load_cfg, slo, out: Path | None) -> int:
    from moesim.memory.fit import flag_fits
    from moesim.traffic.deploy import build_for, kv_tokens_per_member, load_fits
    from moesim.traffic.report import text
    from moesim.traffic.run import find_capacity, run_load
    from moesim.traffic.status import Status
    from moesim.traffic.surface import EngineStepCosts

    quiet = args.quiet or args.json
    st = Status("moesim serve", quiet)
    # the memory verdict first: with --strict a deployment that does not fit stops here
    fit = flag_fits(load_fits(res, cfg, kv_tokens_per_member(res, cfg, load_cfg)), "serve",
                    strict=getattr(args, "strict", False))
    n = [0]

    def point(kw) -> None:
        n[0] += 1
        st.show(f"step-cost surface: engine steps simulated: {n[0]}")

    try:
        costs = EngineStepCosts(res, cfg, cache=not args.no_cache, progress=point,
                                **load_cfg.surface)
        surf = {"points": costs.sims, "from_cache": costs.from_cache,
                "build_cpu_s": costs.build_s, "key": costs.key()}
        if args.check_surface:
            n[0] = 0
            chk = costs.check(args.check_surface)
            surf["check"] = {"points": args.check_surface,
                             "worst_error": chk["worst_error"],
                             "worst_at": list(chk["worst"])}

        def build(lc, series):
            return build_for(res, cfg, lc, costs, series=series)

        st.show(f"running {load_cfg.requests or 'the'} requests")
        sim, load = run_load(build, load_cfg, slo)
        if args.find_capacity:
            k = [0]

            def ran(r) -> None:
                k[0] += 1
                st.show(f"capacity search, run {k[0]}: {r['rate_rps']:.4g} requests/s, "
                        f"{r['requests']:,} requests: "
                        + ("meets the SLO" if r["met"] else f"fails ({r['verdict']})"))

            load["capacity"] = find_capacity(build, load_cfg, slo, progress=ran)
            load["capacity_rps"] = load["capacity"]["capacity_rps"]
    finally:
        st.close()
    load["surface"] = surf
    summary = {"scenario": res.scenario.name, "mode": "load",
               "scheduler": load_cfg.scheduler, "router": load_cfg.router,
               "groups": len(sim.groups), "members": len(sim.members),
               "kv_tokens_per_member": sim.members[0].kv.tokens, "load": load,
               "fit": fit, "oom": fit["oom"]}
    if out is not None:
        _write(out, sim, summary, args.force)
    if args.json:
        print(json.dumps(summary, indent=1, allow_nan=False))
    else:
        print(text(summary))
    if out is not None and not args.quiet:
        print(f"moesim serve: wrote {out}/ (summary.md, summary.json, requests.csv, "
              "load.png, trace.json)", file=sys.stderr)
    return 0


def _write(out: Path, sim, summary: dict, force: bool) -> None:
    import matplotlib.pyplot as plt

    from moesim.outputs import Outputs
    from moesim.traffic.metrics import counter_events
    from moesim.traffic.report import load_figure, markdown, requests_csv

    o = Outputs(out, force=force)
    try:
        o.add("requests.csv", lambda t: t.write_text(requests_csv(sim)))
        fig = load_figure(sim, summary)
        try:
            o.add("load.png", lambda t: fig.savefig(t, format="png", dpi=110))
        finally:
            plt.close(fig)
        o.add("trace.json", lambda t: t.write_text(json.dumps(
            {"traceEvents": counter_events(sim), "displayTimeUnit": "ms"})))
    except BaseException:
        o.discard()
        raise
    o.commit(summary, markdown)
