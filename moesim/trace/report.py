"""summary.md / summary.json and the files of a run directory.

The engine produces ``result.summary`` (step time, throughput, MFU, breakdown,
per-rank breakdown, experts, memory); :func:`full_summary` adds the stall top list,
the critical path and the scenario echo, and :func:`write_run_outputs` writes every
output file of a run.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from moesim import __version__
from moesim.errors import InputError
from moesim.outputs import Outputs, check_dir_target, claim, foreign_files, run_manifest
from moesim.trace.chrome import write_chrome_trace
from moesim.trace.result import SimResult
from moesim.trace.stalls import (
    path_breakdown,
    stall_over_ranks,
    stall_table,
    stall_totals,
    top_stalls,
    write_stalls_csv,
)
from moesim.units import GiB

#: keys left out of summary.json: wall-clock times differ between runs of the same seed
WALL_CLOCK_KEYS = ("sim_wall_s", "wall_s")
OUTPUT_FILES = ("summary.md", "summary.json", "trace.json", "timeline.png", "experts.png",
                "links.png", "stalls.csv")


def jsonable(obj: Any) -> Any:
    """Plain JSON types from numpy arrays/scalars, tuples, sets; non-finite floats → None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.integer | np.bool_):
        return obj.item()
    if isinstance(obj, float | np.floating):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj


def full_summary(result: SimResult, n_top: int = 10, rows: list[dict] | None = None) -> dict:
    """``result.summary`` plus ``stalls`` (total, per blocking rank/expert, top list),
    ``critical_path``, ``scenario``, ``seed`` and ``moesim_version``. The simulator's wall
    time is left out so that the same scenario and seed give the same bytes. ``rows``:
    :func:`stall_table` of ``result`` if the caller has it already."""
    s = {k: v for k, v in result.summary.items() if k not in WALL_CLOCK_KEYS}
    if isinstance(s.get("scenario"), str):
        s["scenario_name"] = s["scenario"]
    rows = stall_table(result) if rows is None else rows
    s["stalls"] = {**stall_totals(rows), **stall_over_ranks(result, rows),
                   "top": top_stalls(rows, n_top)}
    s["critical_path"] = path_breakdown(result)
    s["hot_ranks"] = list(result.hot_ranks)
    s["hot_rule"] = result.hot_rule
    s["n_ranks"] = result.n_ranks
    s["ranks_per_node"] = result.ranks_per_node
    s.setdefault("step_time_s", result.step_time_s)
    s["scenario"] = result.scenario
    if s.get("seed") is None:
        s["seed"] = result.scenario.get("seed") if isinstance(result.scenario, dict) else None
    s["moesim_version"] = __version__
    return jsonable(s)


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.3f}"


def render_markdown(s: dict) -> str:
    """A human-readable summary.md from a :func:`full_summary` dict."""
    step = s.get("step_time_s") or 0.0
    out = ["# moesim run summary" + (f": {s['scenario_name']}" if s.get("scenario_name") else ""), ""]
    out += ["| metric | value |", "|---|---|", f"| step time | {_ms(step)} ms |"]
    if s.get("tokens_per_s") is not None:
        out.append(f"| throughput | {s['tokens_per_s']:,.0f} tokens/s |")
    if s.get("mfu") is not None:
        out.append(f"| MFU | {s['mfu'] * 100:.1f} % |")
    out.append(f"| ranks | {s.get('n_ranks')} ({s.get('ranks_per_node')} per node) |")
    fit = s.get("fit")
    if isinstance(fit, dict) and fit.get("checks"):
        out.append("| fits in device memory | " + ("**no**: the figures are for a step that "
                                                   "does not fit" if fit.get("oom") else "yes")
                   + " |")
    host = s.get("host")
    if isinstance(host, dict):     # a serving step's CPU time (moesim.serve.host)
        out.append(f"| host CPU per step ({host['engine']}) | {_ms(host['host_s'])} ms, "
                   f"{_ms(host['exposed_s'])} ms exposed"
                   + ("; **host-bound**" if host.get("host_bound") else "") + " |")
    kp = s.get("kernel_pricing")
    if isinstance(kp, dict) and kp.get("compute_model"):
        out.append(f"| kernels priced by | {kp['compute_model']}"
                   + (f" (compute: {kp['compute_section']})" if kp.get("compute_section")
                      else "")
                   + (f"; roofline: {kp['roofline_kernels']:,} of {kp['kernels']:,} kernels, "
                      f"{kp.get('roofline_fraction', 0.0):.1%} of compute time"
                      if "kernels" in kp else "") + " |")
    out += ["", "## Time breakdown (mean over ranks)", "", "| kind | ms | % of step |", "|---|---|---|"]
    for k, v in (s.get("breakdown_s") or {}).items():
        pct = v / step * 100 if step else 0.0
        out.append(f"| {k} | {_ms(v)} | {pct:.1f} |")
    st = s.get("stalls") or {}
    n_ranks = s.get("n_ranks") or 0
    with_spans = st.get("ranks_with_spans", n_ranks)
    out += ["", "## Top stalls", "",
            f"Total stall time, summed over all {n_ranks} ranks: "
            f"{_ms(st.get('total_s', 0.0))} ms (stall spans; the breakdown above counts "
            "only the part not hidden under compute)."]
    if with_spans < n_ranks:
        out.append(f"Spans were kept for {with_spans} of the {n_ranks} ranks; the other "
                   f"{st.get('ranks_from_breakdown', 0)} count their breakdown's stall. "
                   f"The table and lists below come from the {st.get('count', 0)} waits "
                   f"of the ranks with spans ({_ms(st.get('spans_total_s', 0.0))} ms).")
    else:
        out.append(f"{st.get('count', 0)} waits.")
    kept = s.get("spans_kept") or {}
    if kept.get("ranks"):
        low = kept.get("lowest") or []
        lows = (f"{low[0]}–{low[-1]}" if low and low == list(range(low[0], low[-1] + 1))
                else _short(low))
        picked = kept.get("per_stage") or []
        out.append(f"Ranks whose spans were kept ({len(kept['ranks'])}): "
                   + (f"the lowest {lows}; " if low else "")
                   + (f"per stage (most-stalled, most-loaded hot): {_short(picked, 64)}; "
                      if picked else "")
                   + f"all: {_short(kept['ranks'])}. Rule: {kept.get('rule')}.")
    out.append("")
    if st.get("top"):
        out += ["| layer | phase | blocking rank | expert | tokens (max) | ms (sum) | waits | cause |",
                "|---|---|---|---|---|---|---|---|"]
        for t in st["top"]:
            reason = str(t["reason"]).replace("|", "\\|")
            out.append(f"| {t['layer']} | {t['phase']} | {t['blocking_rank']} | {t['expert']} | "
                       f"{t['tokens']} | {_ms(t['seconds'])} | {t['count']} | {reason} |")
        out += ["", "- by blocking rank (ms): " + ", ".join(
            f"rank {k}: {_ms(v)}" for k, v in list(st.get("by_blocking_rank", {}).items())[:8]),
            "- by expert (ms): " + ", ".join(
            (f"expert {k}: {_ms(v)}" if k != "-1" else f"no expert (late peer): {_ms(v)}")
            for k, v in list(st.get("by_expert", {}).items())[:8])]
    cp = s.get("critical_path") or {}
    if cp:
        out += ["", "## Critical path", "",
                f"Through ranks {cp.get('ranks')}; {_ms(cp.get('total_s'))} ms in all.", "",
                "| kind | ms | % of step |", "|---|---|---|"]
        for k, v in sorted(cp.get("by_kind", {}).items(), key=lambda kv: -kv[1]):
            out.append(f"| {k} | {_ms(v)} | {v / step * 100 if step else 0:.1f} |")
        if cp.get("by_expert"):
            out += ["", "Expert compute on the path: " + ", ".join(
                f"experts {k}: {_ms(v)} ms" for k, v in
                sorted(cp["by_expert"].items(), key=lambda kv: -kv[1]))]
    ex = s.get("experts") or {}
    if ex:
        out += ["", "## Expert load", "",
                f"- max/mean tokens per expert (worst layer): "
                f"{_scalar(ex, 'max_over_mean_max', 'max_over_mean', max)}",
                f"- dropped (token, expert) assignments, summed over MoE layers and micro-batches: "
                f"{_scalar(ex, 'dropped_total', 'dropped', sum)}",
                f"- load-balancing loss (mean over layers, 1 = balanced): "
                f"{_scalar(ex, 'lb_loss_mean', 'lb_loss', np.mean)}"]
        if "hot_ranks" in s:
            out.append(f"- hot ranks: {_short(s['hot_ranks']) or 'none'} "
                       f"({s.get('hot_rule', '')})")
        mom = ex.get("max_over_mean")
        if isinstance(mom, list) and 1 < len(mom) <= 64:
            out.append("- max/mean per MoE layer: " + ", ".join(f"{float(x):.2f}" for x in mom))
    mem = s.get("memory") or {}
    if mem:
        out += ["", "## Memory", ""]
        cap = mem.get("capacity_bytes")
        per = mem.get("per_rank") or []
        peak = mem.get("peak_bytes_max") or max((p.get("peak_bytes", 0) for p in per), default=0)
        out += [f"- peak per rank: {peak / GiB:.2f} GiB (max over ranks)",
                f"- capacity: {cap / GiB:.2f} GiB per GPU (as the card reports it)" if cap
                else "- capacity: unknown",
                f"- out of memory: {'YES' if mem.get('oom') else 'no'}"]
        for c in (fit or {}).get("checks", []) if isinstance(fit, dict) else []:
            out.append(f"- {c['what']}: {c['need_bytes'] / GiB:.2f} GiB of "
                       f"{c['capacity_bytes'] / GiB:.2f} GiB"
                       + (" (does not fit)" if c.get("oom") else ""))
        worst = max(per, key=lambda p: p.get("peak_bytes", 0), default=None)
        if worst and worst.get("by_category"):
            out.append(f"- rank {worst.get('rank')} by category (GiB): " + ", ".join(
                f"{k} {v / GiB:.2f}" for k, v in worst["by_category"].items()
                if isinstance(v, int | float)))
    name = s.get("scenario_name") or ""
    out += ["", "## Scenario", "", f"{name} (moesim {s.get('moesim_version')}, seed {s.get('seed')})", "",
            "```json", json.dumps(s.get("scenario"), indent=1, sort_keys=True), "```", ""]
    return "\n".join(out)


def _short(xs: list, n: int = 40) -> str:
    return ", ".join(map(str, xs[:n])) + (f", … ({len(xs)} in all)" if len(xs) > n else "")


def _scalar(d: dict, key: str, fallback: str, reduce) -> str:
    """A scalar statistic: ``d[key]``, else ``reduce`` over the list ``d[fallback]``."""
    v = d.get(key)
    if v is None:
        raw = d.get(fallback)
        if isinstance(raw, list):
            flat = np.asarray(raw, dtype=float).ravel()
            v = reduce(flat) if flat.size else None
        else:
            v = raw
    if v is None:
        return "—"
    v = float(v)
    return f"{v:,.0f}" if v.is_integer() else f"{v:.3f}"


def check_outdir(outdir: Path, force: bool, scenario: Any = None) -> None:
    """Refuse (InputError) an ``outdir`` that cannot be written (a file, under a file,
    no permission, a name too long); unless ``force``, also one holding files moesim
    did not write (recognised by the list in its summary.json, not by their names), or
    the outputs of a run of a different scenario."""
    check_dir_target(outdir)
    if not outdir.is_dir() or force:
        return
    foreign = foreign_files(outdir)
    if foreign:
        raise InputError(str(outdir), "output directory",
                         "a new directory or one holding only moesim outputs (pass --force "
                         "to write there anyway)", ", ".join(foreign[:5]))
    old = outdir / "summary.json"
    rec = run_manifest(outdir)
    if rec is not None and rec.get("complete", True) and scenario is not None:
        try:
            old_scenario = json.loads(old.read_text()).get("scenario")
        except (OSError, ValueError, AttributeError):
            old_scenario = "<unreadable>"
        if old_scenario != jsonable(scenario):
            raise InputError(str(outdir), "output directory",
                             "no outputs of a different scenario (pass --force to replace them)",
                             "summary.json of another run")


def write_run_outputs(result: SimResult, outdir: str | Path, *, force: bool = False,
                      quiet: bool = False, parallel: bool = True,
                      claimed: bool = False) -> list[Path]:
    """Write summary.md, summary.json, trace.json, timeline.png, experts.png, links.png
    and stalls.csv into ``outdir``; returns their paths.

    Every file goes to a temporary file first; then all are renamed into place,
    summary.json (which lists them as moesim's, :data:`moesim.outputs.MARKER`) last,
    each destination checked again at that moment (:class:`moesim.outputs.Outputs`).

    With ``parallel`` (default), where the process can fork safely (Linux, more than one
    CPU, no other Python thread), a forked child writes trace.json while this process
    writes the other files; the files are the same bytes either way. If the child
    fails, trace.json is written again here (raising the error).

    The folder is held (:func:`moesim.outputs.claim`) while writing, unless ``claimed``:
    the caller holds it already (``moesim run`` does, from its check before simulating)."""
    outdir = Path(outdir)
    if not claimed:
        check_outdir(outdir, force, result.scenario)
        with claim(outdir):
            return write_run_outputs(result, outdir, force=force, quiet=quiet,
                                     parallel=parallel, claimed=True)
    check_outdir(outdir, force, result.scenario)
    outs = Outputs(outdir, force=force)
    try:
        trace_tmp = outs.reserve("trace.json")

        def write_trace() -> None:
            write_chrome_trace(result, trace_tmp)

        child = _fork(write_trace) if parallel else None
        try:
            if child is None:
                outs.run("trace.json", write_trace)
            rows = stall_table(result)
            outs.add("stalls.csv", lambda t: write_stalls_csv(rows, t))
            summary = full_summary(result, rows=rows)
            # matplotlib only where figures are drawn (0.3 s of import for --no-files runs)
            from moesim.trace.plots import (
                new_figure,
                plot_experts,
                plot_links,
                plot_timeline,
                timeline_figsize,
            )
            fig = new_figure(*timeline_figsize(result.n_ranks, result.ranks_per_node))
            plot_timeline(result, fig.add_subplot())
            outs.add("timeline.png", lambda t: save_figure(fig, t))
            fig = new_figure(10, 5)
            plot_experts(result, fig.add_subplot())
            outs.add("experts.png", lambda t: save_figure(fig, t))
            fig = new_figure(11, 4.5)
            plot_links(result, fig.add_subplot())
            outs.add("links.png", lambda t: save_figure(fig, t))
        finally:
            ok = child is None or _wait(child)
        if not ok:  # the child failed: again here, where an error is raised
            outs.run("trace.json", write_trace)
        paths = outs.commit(summary, render_markdown)
    finally:
        outs.discard()
    if not quiet:
        print(f"wrote {len(paths)} files to {outdir}/", file=sys.stderr)
    return paths


def _fork(work) -> int | None:
    """Run ``work()`` in a forked child; its pid, or None (nothing started) where forking
    is not possible or not safe: not Linux (macOS frameworks may not survive a fork),
    fewer than two CPUs this process may use, or other Python threads running (a child
    of a threaded process may deadlock on a lock held by another thread)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if (not sys.platform.startswith("linux") or not hasattr(os, "fork") or cpus < 2
            or threading.active_count() > 1):
        return None
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: never return into the caller's stack
        code = 1
        try:
            work()
            code = 0
        except BaseException:
            pass  # the parent sees the status, does the work again and raises
        finally:
            os._exit(code)
    return pid


def _wait(pid: int) -> bool:
    """Wait for the child ``pid``; True if it exited with status 0."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            return False
    return os.waitstatus_to_exitcode(status) == 0


def save_figure(fig: Any, path: Path) -> Path:
    """A run's PNG at exactly ``path`` (PNG whatever its suffix: temporary names too)."""
    fig.savefig(path, format="png", bbox_inches="tight")
    return path
