"""``moesim serve`` on a scenario with a ``load:`` section: requests over time.

Builds (or reads from the cache) the engine's step-cost surface, runs the requests and
prints the ``load`` summary over the steady-state measurement window
(:mod:`moesim.traffic.window`; ``--json``: the summary as JSON), optionally the surface's
error against direct simulation (``--check-surface N``) and the capacity under ``--slo``
(``--find-capacity``); the work is :func:`moesim.traffic.session.serve_under_load`, this
module parses flags and prints. Files follow the output convention of every command: the folder
(``-o DIR``, default ``out/<scenario>``; none with ``--no-files``) is held by this run
(:func:`moesim.outputs.claim`) and gets ``summary.md``, ``summary.json`` (last),
``requests.csv``, ``load.png`` and ``trace.json`` (Perfetto counter tracks), written
atomically and marked as this command's, so the same command reruns into it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CLI = "command line"
#: direct simulations --check-surface may ask for per phase (each one engine step)
MAX_CHECK_POINTS = 100


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
    from moesim.outputs import check_run_folder, claim
    from moesim.traffic.session import check_kv_room, load_config

    load_cfg = load_config(res, args.overrides)
    slo = _check_flags(args, load_cfg)
    check_kv_room(res, cfg, load_cfg, args.overrides)     # before the work
    out = output_folder(args, res.scenario.name, args.overrides)
    ident = res.scenario.to_dict()
    if out is None:
        return _simulate(args, res, cfg, load_cfg, slo, None)
    check_run_folder(out, args.force, identity=ident)     # before the long part
    with claim(out, force=args.force, identity=ident):
        return _simulate(args, res, cfg, load_cfg, slo, out)


def _simulate(args, res, cfg, load_cfg, slo, out: Path | None) -> int:
    from moesim.traffic.report import text
    from moesim.traffic.session import serve_under_load
    from moesim.traffic.status import Status

    st = Status("moesim serve", args.quiet or args.json)
    try:
        sim, summary = serve_under_load(
            res, cfg, load_cfg, slo=slo, capacity=args.find_capacity,
            check_points=args.check_surface, cache=not args.no_cache,
            strict=getattr(args, "strict", False), show=st.show)
    finally:
        st.close()
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
