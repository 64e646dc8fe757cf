"""A sweep's ``summary.json`` and ``summary.md``: what ran, what came out, which points do
not fit in device memory.

Every command that writes a folder writes these two (the output convention of
``moesim run``, ``serve``, ``rl`` and ``sweep``); for a sweep they sit beside the
per-point data (``results.parquet``, ``means.csv``, ``points.jsonl``) and say, in a few
lines, how many points ran, were skipped or failed, how many placed a model that does
not fit (each point's ``oom``), and the mean of the headline metrics per combination.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pandas as pd

from moesim.sweep.results import axis_columns
from moesim.sweep.spec import SweepSpec, format_value

#: columns of the means table in summary.md/json, when the points have them
MEAN_METRICS = ("step_time_s", "tokens_per_s", "samples_per_s", "mfu", "memory.peak_bytes_max")
#: rows of summary.md's means table (the rest are in means.csv)
MD_ROWS = 40
#: points listed by name as not fitting (the rest are counted)
OOM_LISTED = 20


def oom_mask(df: pd.DataFrame) -> pd.Series:
    """Per row: an ``ok`` point whose layout does not fit in device memory (its
    summary's ``oom``)."""
    if "oom" not in df.columns:
        return pd.Series(False, index=df.index)
    return (df["status"] == "ok") & (df["oom"] == True)  # noqa: E712 - None: not checked


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):           # numpy scalars
        return _plain(v.item())
    return v


def _point(row: pd.Series, keys: list[str]) -> dict:
    return {**{k: _plain(row[k]) for k in keys}, "seed": _plain(row["seed"])}


def sweep_summary(spec: SweepSpec, df: pd.DataFrame, agg: pd.DataFrame, *, ran: int,
                  reused: int, files: list[str]) -> dict:
    """summary.json of a sweep folder (``df``: results.parquet, ``agg``: means.csv)."""
    keys = axis_columns(df) or list(spec.axis_keys)
    counts = {str(k): int(v) for k, v in df["status"].value_counts().items()}
    oom = df[oom_mask(df)]
    ok = df["status"] == "ok"
    checked = int(df.loc[ok, "oom"].notna().sum()) if "oom" in df.columns else 0
    cols = [c for m in MEAN_METRICS if (c := f"{m}_mean") in agg.columns]
    means = [{**{k: _plain(r[k]) for k in keys}, "n_seeds": _plain(r["n_seeds"]),
              **{c: _plain(r[c]) for c in cols}} for _, r in agg.iterrows()]
    reasons: dict[str, int] = {}
    for col, what in (("reason", "skipped"), ("error", "failed")):
        for v in df[col].dropna() if col in df.columns else ():
            reasons[f"{what}: {v}"] = reasons.get(f"{what}: {v}", 0) + 1
    return {
        "sweep": spec.name, "scenario": spec.scenario, "set": list(spec.base_overrides),
        "mode": spec.mode, "axes": {a.key: [format_value(v) for v in a.values]
                                    for a in spec.axes},
        "seeds": list(spec.seeds), "points": int(len(df)), "counts": counts,
        "ran": ran, "already_done": reused,
        "oom_points": int(len(oom)), "oom": bool(len(oom)), "memory_checked": checked,
        "oom_at": [_point(r, keys) for _, r in oom.head(OOM_LISTED).iterrows()],
        "not_run": reasons, "means": means,
        "units": {"step_time_s": "s", "tokens_per_s": "tokens/s", "samples_per_s": "samples/s",
                  "mfu": "fraction", "memory.peak_bytes_max": "bytes"},
        "files": sorted(files),
    }


def _cell(v: Any, col: str, step_scale: float) -> str:
    if v is None:
        return "-"
    if col.startswith("step_time_s"):
        return f"{v * step_scale:.3f}"
    if col.startswith("memory.peak_bytes"):
        return f"{v / 2**30:.1f}"
    if col.startswith("mfu"):
        return f"{v * 100:.1f}"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


_HEAD = {"tokens_per_s_mean": "tokens/s", "samples_per_s_mean": "samples/s",
         "mfu_mean": "MFU (%)", "memory.peak_bytes_max_mean": "peak memory (GiB)"}


def _scenario_name(path: str) -> str:
    """A scenario as the user gave it: a path relative to the working folder when
    under it, else as given."""
    p = Path(path)
    if p.is_absolute():
        with contextlib.suppress(ValueError):
            return str(p.relative_to(Path.cwd()))
    return path


def summary_markdown(s: dict) -> str:
    """summary.md of a sweep folder, from its summary.json."""
    counts = ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
    axes = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in s["axes"].items())
    lines = [f"# Sweep {s['sweep']}", "",
             f"Scenario {_scenario_name(s['scenario'])}" + (f" with {', '.join(s['set'])}" if s["set"] else "")
             + f"; {s['mode']} over {axes}; seeds {', '.join(map(str, s['seeds']))}.", "",
             f"{s['points']} points ({counts}); this run ran {s['ran']}, "
             f"{s['already_done']} were already done."]
    if s["oom"]:
        lines += ["", f"**{s['oom_points']} of {s['points']} points do not fit in device "
                  "memory** (`oom` in results.parquet); the first:"]
        lines += [f"- {', '.join(f'{k}={v}' for k, v in p.items())}" for p in s["oom_at"]]
    elif s["memory_checked"]:
        lines += ["", f"Every point checked ({s['memory_checked']}) fits in device memory."]
    else:
        lines += ["", "Memory was not checked (the points' summaries carry no verdict)."]
    for why, n in s["not_run"].items():
        lines.append(f"- {n} {why}")
    if s["means"]:
        cols = list(s["means"][0])
        steps = [r.get("step_time_s_mean") or 0.0 for r in s["means"]]
        scale, unit = (1.0, "s") if max(steps) >= 1.0 else (1e3, "ms")   # RL steps: seconds
        head = {**_HEAD, "step_time_s_mean": f"step ({unit})"}
        lines += ["", "Mean over seeds per combination (means.csv has spread, min and max):",
                  "", "| " + " | ".join(head.get(c, c) for c in cols) + " |",
                  "|" + "---|" * len(cols)]
        for row in s["means"][:MD_ROWS]:
            lines.append("| " + " | ".join(_cell(row[c], c, scale) for c in cols) + " |")
        if len(s["means"]) > MD_ROWS:
            lines.append(f"\n({len(s['means']) - MD_ROWS} more rows in means.csv)")
    lines += ["", "Files: " + ", ".join(s["files"]) + "."]
    return "\n".join(lines) + "\n"
