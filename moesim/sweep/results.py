"""Sweep results as pandas DataFrames: one row per point (every swept value, the seed,
the status and every scalar summary metric), consolidated into ``results.parquet``;
per-combination mean and spread over seeds; the best layout per skew level.

Files in a sweep directory:

* ``points.jsonl``: one JSON record per finished point, appended as points finish;
  the last record of a point id wins (a retried failed point);
* ``sweep.json``: the sweep file as run;
* ``results.parquet``: the consolidated frame, ordered as the sweep expands;
* ``means.csv``: :func:`aggregate` of it (mean, std, min, max over seeds).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moesim.errors import InputError
from moesim.outputs import write_file
from moesim.sweep.spec import SweepSpec, expand, format_value

POINTS_FILE = "points.jsonl"
SPEC_FILE = "sweep.json"
RESULTS_FILE = "results.parquet"
MEANS_FILE = "means.csv"
META = ("point_id", "index", "seed", "status", "reason", "error", "sim_wall_s")
# headline metrics shown by default; every other scalar summary field is a column too
HEADLINE = ("step_time_s", "tokens_per_s", "mfu", "stall_fraction", "breakdown_s.stall",
            "stall_max_rank_s", "experts.dropped_total", "experts.max_over_mean_max",
            "memory.peak_bytes_max")


@dataclass
class Consolidated:
    path: Path
    frame: pd.DataFrame
    counts: dict[str, int] = field(default_factory=dict)
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    failed_errors: dict[str, int] = field(default_factory=dict)


def repair_points_file(outdir: str | Path) -> int:
    """Cut a partial last line (a crash mid-write) so appends start on a fresh line.
    Returns the bytes removed."""
    p = Path(outdir) / POINTS_FILE
    if not p.exists():
        return 0
    data = p.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    with open(p, "r+b") as fh:
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return len(data) - keep


def read_records(outdir: str | Path) -> list[dict]:
    """Records of ``points.jsonl``, the last per point id, in file order of that last
    record. A partial final line (crash mid-write) is ignored; a corrupt line elsewhere
    is an :class:`InputError`."""
    p = Path(outdir) / POINTS_FILE
    if not p.exists():
        return []
    lines = p.read_text(encoding="utf-8").split("\n")
    last: dict[str, dict] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            pid = rec["point_id"]
        except (json.JSONDecodeError, KeyError, TypeError):
            if i == len(lines) - 1:   # no newline after it: an interrupted write
                continue
            raise InputError(str(p), f"line {i + 1}", "one JSON point record per line",
                             line[:60]) from None
        last.pop(pid, None)
        last[pid] = rec
    return list(last.values())


def _cell(v: Any) -> Any:
    return format_value(v) if isinstance(v, list | tuple) else v


def records_frame(records: list[dict], spec: SweepSpec | None = None) -> pd.DataFrame:
    """One row per record: meta columns, one column per axis key, then the metrics.
    With ``spec``, only its points are kept, ordered and indexed as it expands."""
    order: dict[str, int] | None = None
    keys: list[str] = []
    if spec is not None:
        order = {p.point_id: p.index for p in expand(spec)}
        keys = list(spec.axis_keys)
    rows = []
    for r in records:
        if order is not None and r["point_id"] not in order:
            continue
        row = {k: r.get(k) for k in META}
        if order is not None:
            row["index"] = order[r["point_id"]]
        for k, v in (r.get("values") or {}).items():
            row[k] = _cell(v)
            if k not in keys:
                keys.append(k)
        row.update(r.get("metrics") or {})
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        df = pd.DataFrame(columns=[*META, *keys])
    for k in (*META, *keys):
        if k not in df.columns:
            df[k] = None
    rest = [c for c in df.columns if c not in META and c not in keys]
    df = df[[*META, *keys, *rest]]
    return df.sort_values("index", kind="stable").reset_index(drop=True)


def axis_columns(df: pd.DataFrame) -> list[str]:
    """The swept keys stored in a results frame (``df.attrs['axes']``)."""
    return list(df.attrs.get("axes", []))


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Numeric metric columns (everything numeric that is not meta or an axis)."""
    skip = set(META) | set(axis_columns(df))
    return [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])
            and not pd.api.types.is_bool_dtype(df[c])]


def aggregate(df: pd.DataFrame, metrics: list[str] | None = None) -> pd.DataFrame:
    """Per axis combination, over the seeds of its ``ok`` points: ``<m>_mean``,
    ``<m>_std`` (sample, NaN for one seed), ``<m>_min``, ``<m>_max`` and ``n_seeds``.
    Combinations with no ok point are left out. Rows keep the sweep order."""
    keys = axis_columns(df)
    ok = df[df["status"] == "ok"]
    metrics = [m for m in (metrics or metric_columns(df)) if m in ok.columns]
    if ok.empty or not keys:
        return pd.DataFrame(columns=[*keys, "n_seeds"])
    g = ok.groupby(keys, sort=False, dropna=False)
    parts = [g.size().rename("n_seeds")]
    for m in metrics:
        col = g[m]
        parts += [col.mean().rename(f"{m}_mean"), col.std(ddof=1).rename(f"{m}_std"),
                  col.min().rename(f"{m}_min"), col.max().rename(f"{m}_max")]
    out = pd.DataFrame({s.name: s for s in parts}).reset_index()   # one block, not one per column
    out.attrs["axes"] = keys
    return out


def best_layout(agg: pd.DataFrame, layout: list[str], metric: str = "step_time_s") -> pd.DataFrame:
    """For each combination of the non-layout axes (e.g. each skew level and topology),
    the layout values with the lowest mean ``metric`` and that value."""
    keys = axis_columns(agg)
    missing = [k for k in layout if k not in keys]
    if missing:
        raise InputError("sweep", "plots.layout", f"axis keys among {keys}", missing)
    col = f"{metric}_mean"
    others = [k for k in keys if k not in layout]
    if agg.empty:
        return pd.DataFrame(columns=[*others, *layout, col, "n_layouts"])
    if others:
        g = agg.groupby(others, sort=False, dropna=False)
        idx = g[col].idxmin()
        best = agg.loc[idx.values, [*others, *layout, col]].reset_index(drop=True)
        best["n_layouts"] = g.size().values
    else:
        best = agg.loc[[agg[col].idxmin()], [*layout, col]].reset_index(drop=True)
        best["n_layouts"] = len(agg)
    return best


def write_results(outdir: str | Path, spec: SweepSpec) -> Consolidated:
    """Consolidate ``points.jsonl`` into ``results.parquet`` and ``means.csv``
    (written to a temporary name, then renamed: a reader never sees half a file)."""
    out = Path(outdir)
    df = records_frame(read_records(out), spec)
    df.attrs["axes"] = list(spec.axis_keys)
    path = write_file(out / RESULTS_FILE, lambda t: df.to_parquet(t, index=False), force=True)
    agg = aggregate(df)
    write_file(out / MEANS_FILE, lambda t: agg.to_csv(t, index=False), force=True)
    status = df["status"].value_counts()
    res = Consolidated(path=path, frame=df, counts={str(k): int(v) for k, v in status.items()})
    for col, target in (("reason", res.skipped_reasons), ("error", res.failed_errors)):
        for v in df[col].dropna():
            target[str(v)] = target.get(str(v), 0) + 1
    return res


def load_results(outdir: str | Path) -> pd.DataFrame:
    """``results.parquet`` of a sweep directory, axis keys in ``df.attrs['axes']``."""
    out = Path(outdir)
    path = out / RESULTS_FILE
    if not path.exists():
        raise InputError(str(path), "", "the results of a finished or interrupted sweep "
                         "(run 'moesim sweep FILE -o DIR' first)", "no such file")
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types
        raise InputError(str(path), "", "a Parquet file written by moesim sweep",
                         f"{type(err).__name__}: {err}") from None
    if not df.attrs.get("axes"):
        spec = out / SPEC_FILE
        axes = list(json.loads(spec.read_text()).get("axes", {})) if spec.exists() else []
        df.attrs["axes"] = axes
    return df


def table(df: pd.DataFrame, metrics: tuple[str, ...] = HEADLINE) -> pd.DataFrame:
    """A compact view for printing: axes, seed, status and the headline metrics."""
    cols = [*axis_columns(df), "seed", "status", *[m for m in metrics if m in df.columns]]
    return df[cols].replace({np.nan: None})
