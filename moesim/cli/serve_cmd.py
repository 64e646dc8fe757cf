"""``moesim serve SCENARIO``: simulate one prefill or decode step of a serving deployment,
or, with a ``load:`` section (or ``--set load...``), requests over time on it
(:mod:`moesim.traffic`): TTFT/TPOT/latency percentiles, throughput, goodput under ``--slo``,
``--find-capacity``.

Prints step time, TTFT (prefill) or time per output token (decode), tokens/s and the
memory table; ``--json`` prints the summary as JSON (phase, step_time_s, ttft_s /
tpot_s, tokens_per_s, tokens_per_s_per_gpu, breakdown_s, per_rank, experts, memory);
``-o OUTDIR`` writes the files ``moesim run`` writes (summary.md, summary.json,
trace.json for Perfetto, timeline.png with stalls, experts.png, links.png, stalls.csv).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moesim.cli.common import OUT_DEFAULT, add_output_flags
from moesim.trace.progress import Progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file with a serve section, or shipped name "
                   "(e.g. deepseek-v3-decode)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set serve.batch_per_gpu=64 (repeatable)")
    add_output_flags(p, out_default=OUT_DEFAULT)
    g = p.add_argument_group("requests over time (a load: section)")
    g.add_argument("--slo", default=None, metavar="KEY=TIME,...",
                   help="service-level objective, e.g. ttft_p99=2s,tpot_p99=50ms: goodput "
                   "and --find-capacity use it")
    g.add_argument("--find-capacity", action="store_true",
                   help="the largest arrival rate (requests/s) meeting --slo, by bisection")
    g.add_argument("--check-surface", type=int, default=0, metavar="N",
                   help="compare the surface with N direct simulations at random points "
                   "and print the worst error")
    g.add_argument("--no-cache", action="store_true",
                   help="build the step-cost surface again instead of reading the cache")


def run(args: argparse.Namespace) -> int:
    from moesim.cli.common import output_folder
    from moesim.errors import InputError
    from moesim.outputs import claim
    from moesim.serve.run import resolve_serve
    from moesim.trace.report import check_outdir

    if args.no_files and args.out:
        raise InputError("command line", "--no-files", "either -o DIR or --no-files", "both")
    res, cfg = resolve_serve(args.scenario, args.overrides)
    for w in res.warnings:
        print(f"moesim serve: warning: {w}", file=sys.stderr)
    if res.scenario.load:
        from moesim.cli.serve_load import run_load_cmd
        return run_load_cmd(args, res, cfg)
    given = [f for f, v in (("--slo", args.slo is not None), ("--find-capacity",
             args.find_capacity), ("--check-surface", args.check_surface),
             ("--no-cache", args.no_cache)) if v]
    if given:
        flag = given[0]
        raise InputError("command line", flag, "a scenario with a load: section (or "
                         "--set load.arrival.rate_rps=R --set load.requests=N)", "none")
    if args.no_files:
        return _simulate_step(args, res, cfg, None)
    # the output convention (moesim.cli.common): -o DIR, else out/<name>[--<overrides>]
    out = output_folder(args, res.scenario.name, args.overrides)
    check_outdir(out, args.force, res.scenario.to_dict())   # before the long part
    with claim(out):   # the folder is this run's until its files are in place
        check_outdir(out, args.force, res.scenario.to_dict())   # as it is now ours
        if not (args.quiet or args.json):
            print(f"moesim serve: output folder {out}/", file=sys.stderr)
        return _simulate_step(args, res, cfg, out)


def _simulate_step(args: argparse.Namespace, res, cfg, out: Path | None) -> int:
    from moesim.memory.fit import fits_of, flag_fits
    from moesim.outputs import write_text
    from moesim.serve.run import simulate_serve
    from moesim.trace.report import full_summary, jsonable, write_run_outputs

    prog = Progress(0, f"serving {res.scenario.name} ({cfg.phase})",
                    quiet=args.quiet or args.json)

    def progress(stage: str, n: float) -> None:
        if stage == "built":
            prog.total = n
        else:
            prog.update(n)

    result = simulate_serve(res, cfg, progress=progress)
    prog.close()
    # one memory verdict (moesim.memory.fit): a warning, or with --strict exit 2 before
    # any file is written
    flag_fits(fits_of(result.summary["fit"]), "serve", strict=getattr(args, "strict", False))
    if out is not None:
        # checked again as each file is put in place (moesim.outputs); summary.md is
        # moesim's own once written, so its serving section replaces it atomically
        write_run_outputs(result, out, force=args.force, quiet=args.quiet or args.json,
                          claimed=True)
        md = out / "summary.md"
        write_text(md, md.read_text(encoding="utf-8") + serving_markdown(result.summary),
                   force=True)
    if args.json:
        print(json.dumps(jsonable(full_summary(result)), indent=1))
    else:
        print(text_summary(result.summary, out))
    return 0


def text_summary(s: dict, out: Path | None) -> str:
    from moesim.memory.fit import fit_line
    step = s["step_time_s"]
    mem = s["memory"]
    sv = s["serve"]
    lat = (f"TTFT {s['ttft_s'] * 1e3:.2f} ms" if s["phase"] == "prefill"
           else f"TPOT {s['tpot_s'] * 1e3:.3f} ms")
    lines = [f"{s['scenario']}: {s['phase']} step {step * 1e3:.3f} ms on {s['world']} GPUs "
             f"(TP{sv['tp']} x attention DP{sv['attn_dp']}, EP{sv['ep']}, "
             f"{sv['ep_backend']}, {2 if sv['two_microbatch'] else 1} micro-batch"
             f"{'es' if sv['two_microbatch'] else ''}), {lat}",
             f"  {s['tokens_per_s']:,.0f} tokens/s, {s['tokens_per_s_per_gpu']:,.0f} tokens/s "
             f"per GPU, {s['requests_per_step']:,} requests"]
    b = s["breakdown_s"]
    parts = [f"{k} {v * 1e3:.3f} ms ({v / step * 100:.1f} %)" for k, v in b.items()
             if v > 0 and step > 0]
    lines.append("  breakdown (mean over ranks): " + ", ".join(parts))
    ex = s.get("experts", {})
    if ex.get("max_over_mean"):
        lines.append(f"  experts: max/mean load {ex['max_over_mean_max']:.2f}")
    kp = s.get("kernel_pricing") or {}
    if kp.get("compute_model"):
        lines.append(f"  kernels priced by {kp['compute_model']} (compute: "
                     f"{kp.get('compute_section')})")
    gib = 2**30
    lines.append(f"  memory breakdown per GPU: weights {mem['weights_bytes'] / gib:.2f} GiB, KV "
                 f"{mem['kv_per_request_bytes'] / 2**20:.2f} MiB per request x "
                 f"{sv['batch_per_gpu'] * sv['tp']} = {mem['kv_total_bytes'] / gib:.2f} GiB, "
                 f"activations {mem['activations_bytes'] / gib:.2f} GiB, free "
                 f"{mem['free_bytes'] / gib:.2f} GiB of {mem['capacity_bytes'] / gib:.1f} GiB; "
                 f"largest batch {mem['largest_batch_per_gpu']} requests per GPU")
    if s.get("fit") is not None:
        lines.append(fit_line(s["fit"]))
        if s["fit"]["oom"]:
            lines.append(f"  ** the step time, {lat.split()[0]} and tokens/s above are for a "
                         "step that does not fit in device memory: at most "
                         f"{mem['largest_batch_per_gpu']} requests per GPU fit **")
    return "\n".join(lines)      # (write_run_outputs says what it wrote)


def serving_markdown(s: dict) -> str:
    """The serving section appended to a run directory's summary.md."""
    sv, mem = s["serve"], s["memory"]
    lat = (("TTFT", s["ttft_s"]) if s["phase"] == "prefill" else ("TPOT", s["tpot_s"]))
    rows = [("phase", s["phase"]), (lat[0], f"{lat[1] * 1e3:.3f} ms"),
            ("tokens/s", f"{s['tokens_per_s']:,.0f}"),
            ("tokens/s per GPU", f"{s['tokens_per_s_per_gpu']:,.0f}"),
            ("requests per step", f"{s['requests_per_step']:,}"),
            ("layout", f"TP{sv['tp']} x attention DP{sv['attn_dp']}, EP{sv['ep']}, "
                       f"{sv['ep_backend']}, two micro-batches: {sv['two_microbatch']}"),
            ("weights per GPU", f"{mem['weights_bytes'] / 2**30:.2f} GiB"),
            ("KV cache per request", f"{mem['kv_per_request_bytes'] / 2**20:.2f} MiB"),
            ("KV cache per GPU", f"{mem['kv_total_bytes'] / 2**30:.2f} GiB"),
            ("activations per GPU", f"{mem['activations_bytes'] / 2**30:.2f} GiB"),
            ("free per GPU", f"{mem['free_bytes'] / 2**30:.2f} GiB of "
                             f"{mem['capacity_bytes'] / 2**30:.1f} GiB"),
            ("fits in device memory", "no: the figures above are for a step that does not "
             "fit" if mem["oom"] else "yes"),
            ("largest batch", f"{mem['largest_batch_per_gpu']} requests per GPU")]
    return "\n## Serving\n\n| metric | value |\n|---|---|\n" + "".join(
        f"| {k} | {v} |\n" for k, v in rows)

