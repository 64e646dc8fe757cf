"""Run a sweep on Dask: a local cluster by default, or an existing one by address.

Each finished point is appended as one JSON line to ``OUTDIR/points.jsonl``, flushed
and fsync'd before the next is taken, so a crash or Ctrl-C loses nothing finished.
Re-running resumes: points whose id already has an ``ok`` or ``skipped`` line are not
run again (``failed`` ones are retried). At the end the lines are consolidated into
``results.parquet`` (see :mod:`moesim.sweep.results`).

A point raising :class:`~moesim.errors.InputError` (e.g. a layout that does not divide
the world) is *skipped* with the reason; any other exception is a *failed* point
recorded with its error, and the rest go on.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from moesim.errors import InputError
from moesim.outputs import (
    LOCK_NAME,
    check_dir_target,
    check_run_folder,
    make_dir,
    run_manifest,
    write_text,
)
from moesim.sweep.results import (
    POINTS_FILE,
    SPEC_FILE,
    read_records,
    repair_points_file,
    write_results,
)
from moesim.sweep.spec import Point, SweepSpec, expand
from moesim.trace.progress import Progress
from moesim.wiring import simulate

FINAL = ("ok", "skipped")
# summary keys that are not model output (wall-clock time) and are kept apart
VOLATILE = ("sim_wall_s",)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Scalar leaves of a nested dict as ``a.b.c`` keys; lists are left out."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        elif isinstance(v, bool | int | float | str) or v is None:
            out[name] = v
    return out


def point_metrics(summary: dict) -> dict[str, Any]:
    """Every scalar summary metric, flattened, plus derived columns:
    ``stall_fraction`` (mean stall / step time), ``stall_max_rank_s`` (the most any rank
    stalls), ``n_hot_ranks``. Wall-clock time is left out (not reproducible)."""
    m = {k: v for k, v in flatten(summary).items() if k not in VOLATILE}
    if "step_time_kind" in summary:     # an RL point (moesim.rl.summary): no ranks' stalls
        m["oom"] = bool(summary.get("oom", False))
        return m
    step = float(summary.get("step_time_s") or 0.0)
    stall = float(summary.get("breakdown_s", {}).get("stall", 0.0))
    m["stall_fraction"] = stall / step if step > 0 else 0.0
    per_rank = summary.get("per_rank") or []
    m["stall_max_rank_s"] = max((float(r["breakdown_s"].get("stall", 0.0)) for r in per_rank),
                                default=0.0)
    m["n_hot_ranks"] = len(summary.get("hot_ranks") or [])
    # the point's memory verdict (moesim.memory.fit): its layout does not fit on the device
    # (None where the summary carries none)
    oom = summary.get("oom", (summary.get("memory") or {}).get("oom"))
    m["oom"] = None if oom is None else bool(oom)
    return m


def run_point(point: dict) -> dict:
    """Simulate one point (a :meth:`Point.as_dict`); never raises. Runs on a worker."""
    rec: dict[str, Any] = {k: point[k] for k in ("point_id", "index", "values", "seed")}
    t0 = time.perf_counter()
    try:
        summary = _rl_summary(point)    # a scenario with an rl section: RL steps
        if summary is None:
            summary = simulate(point["scenario"], point["overrides"],
                               record_series=False).summary
    except InputError as err:
        rec.update(status="skipped", reason=str(err))
    except Exception as err:  # noqa: BLE001 - a failed point is data, the sweep goes on
        tb = traceback.format_exception(type(err), err, err.__traceback__)
        rec.update(status="failed", error=f"{type(err).__name__}: {err}",
                   traceback="".join(tb[-6:]))
    else:
        rec.update(status="ok", metrics=point_metrics(summary))
    rec["sim_wall_s"] = time.perf_counter() - t0
    return rec


def _rl_summary(point: dict) -> dict | None:
    """The RL summary (:mod:`moesim.rl.summary`) of a point whose scenario has an ``rl``
    section, else None."""
    from moesim.scenario import load_scenario

    if not load_scenario(point["scenario"], point["overrides"]).rl:
        return None
    from moesim.rl.run import rl_summary
    return rl_summary(point["scenario"], point["overrides"])


@dataclass
class SweepReport:
    """What a run did: counts by status (this run and in total) and where files are."""

    outdir: Path
    total: int
    reused: int
    ran: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    failed_errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    results_path: Path | None = None
    frame: Any = None        # the consolidated results (pandas DataFrame), as written


def append_record(fh: TextIO, rec: dict) -> None:
    """One JSON line, flushed and fsync'd so that it survives a crash."""
    fh.write(json.dumps(rec, sort_keys=True, allow_nan=False) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def check_sweep_folder(spec: SweepSpec, outdir: str | Path, force: bool = False) -> Path:
    """Before the long work, and again once the folder is held: ``outdir`` can be
    written, no other run is writing it, and, unless ``force``, it is new, empty, or
    this sweep's own (an earlier or interrupted run of a sweep of the same name, which
    this run resumes); a folder of other files, of another command or another sweep is
    refused."""
    out = check_dir_target(outdir)   # a file, under a file, no permission, too long, busy
    if force or not out.is_dir() or not [p for p in out.iterdir() if p.name != LOCK_NAME]:
        return out
    if run_manifest(out) is None and (out / SPEC_FILE).exists():
        # a sweep interrupted before its summary.json (or written before sweeps had one)
        try:
            name = json.loads((out / SPEC_FILE).read_text()).get("name")
        except (OSError, ValueError, AttributeError):
            name = None
        if name != spec.name:
            raise InputError(str(out), "-o", f"a new folder or one of sweep {spec.name!r} "
                             "(pass --force to write there anyway)",
                             f"the folder of sweep {name!r}")
        return out
    return check_run_folder(out, force, identity=sweep_identity(spec))


def sweep_identity(spec: SweepSpec) -> dict:
    """What makes a sweep folder this sweep's (its name: the sweep file may grow axes
    and values and still resume into it)."""
    return {"sweep": spec.name}


def prepare_outdir(spec: SweepSpec, outdir: Path, force: bool = False) -> None:
    """Create ``outdir`` or accept it as an earlier run of this sweep
    (:func:`check_sweep_folder`). Writes ``sweep.json`` (the spec echo)."""
    outdir = check_sweep_folder(spec, outdir, force)
    make_dir(outdir)
    write_text(outdir / SPEC_FILE, json.dumps(spec.to_dict(), indent=1, default=list) + "\n",
               force=True)


def make_client(scheduler: str | None = None, workers: int | None = None,
                processes: bool = True) -> Any:
    """A ``dask.distributed.Client``: connected to ``scheduler`` when given, else on a
    new LocalCluster of ``workers`` single-threaded workers (default: one per CPU)."""
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as err:
            raise InputError("--scheduler", "address", "a reachable Dask scheduler "
                             "(tcp://host:port)", f"{scheduler}: {err}") from None
    n = workers if workers else max(1, os.cpu_count() or 1)
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=processes,
                           dashboard_address=":0")   # any free port: no clash on a shared machine
    return Client(cluster)


def _close(client: Any, own: bool) -> None:
    if not own:
        return
    cluster = getattr(client, "cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()


def pending_points(points: list[Point], records: Iterable[dict]) -> tuple[list[Point], int]:
    done = {r["point_id"] for r in records if r.get("status") in FINAL}
    todo = [p for p in points if p.point_id not in done]
    return todo, len(points) - len(todo)


def run_sweep(spec: SweepSpec, outdir: str | Path, *, scheduler: str | None = None,
              workers: int | None = None, processes: bool = True, client: Any = None,
              quiet: bool = False, force: bool = False, stream: TextIO | None = None,
              on_record: Callable[[dict], None] | None = None,
              point_fn: Callable[[dict], dict] = run_point) -> SweepReport:
    """Run every unfinished point of ``spec`` and write ``OUTDIR/results.parquet``.

    ``client``: an existing ``distributed.Client`` to use (not closed here); otherwise
    one is made by :func:`make_client` from ``scheduler``/``workers``/``processes``.
    ``on_record`` is called in this process after each record is on disk."""
    t0 = time.perf_counter()
    out = Path(outdir)
    prepare_outdir(spec, out, force)
    repair_points_file(out)
    points = expand(spec)
    todo, reused = pending_points(points, read_records(out))
    report = SweepReport(outdir=out, total=len(points), reused=reused)
    stream = stream if stream is not None else sys.stderr
    if todo:
        own = client is None
        if own:
            if workers is None and not scheduler:   # one per CPU, no more than points
                workers = max(1, min(os.cpu_count() or 1, len(todo)))
            client = make_client(scheduler, workers, processes)
        prog = Progress(len(todo), f"moesim sweep {spec.name}", quiet=quiet, stream=stream,
                        interval_s=2.0, delay_s=0.0)
        futures = []
        try:
            from distributed import as_completed

            payload = [p.as_dict() for p in todo]
            futures = client.map(point_fn, payload, key=[f"point-{p.point_id}" for p in todo],
                                 pure=False)
            by_key = {f.key: p for f, p in zip(futures, payload, strict=True)}
            with open(out / POINTS_FILE, "a", encoding="utf-8") as fh:
                for fut in as_completed(futures):
                    try:
                        rec = fut.result()
                    except Exception as err:  # noqa: BLE001 - e.g. a worker died
                        p = by_key[fut.key]
                        rec = {k: p[k] for k in ("point_id", "index", "values", "seed")}
                        rec.update(status="failed", error=f"{type(err).__name__}: {err}")
                    append_record(fh, rec)
                    fut.release()
                    report.ran += 1
                    if on_record:
                        on_record(rec)
                    prog.update(1)
        except KeyboardInterrupt:
            write_results(out, spec)   # what finished is on disk and in results.parquet
            raise
        finally:
            prog.close()
            for f in futures:
                if not f.done():
                    f.cancel()
            _close(client, own)
    final = write_results(out, spec)
    report.results_path = final.path
    report.frame = final.frame
    report.counts = final.counts
    report.skipped_reasons = final.skipped_reasons
    report.failed_errors = final.failed_errors
    report.wall_s = time.perf_counter() - t0
    return report
