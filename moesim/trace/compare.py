"""Differences between the summaries of two runs: a table of (metric, A, B, Δ, Δ%)."""

from __future__ import annotations

import json
from pathlib import Path

from moesim.errors import InputError


def load_summary(run_dir: str | Path) -> dict:
    """summary.json of a run directory (or the path of a summary.json itself)."""
    p = Path(run_dir)
    if p.is_dir():
        p = p / "summary.json"
    try:
        data = json.loads(p.read_text())
    except OSError:
        raise InputError(str(p), "", "a run directory holding summary.json (from moesim run)",
                         "no such file") from None
    except json.JSONDecodeError as err:
        raise InputError(str(p), f"line {err.lineno}", "valid JSON", err.msg) from None
    rec = data.get("moesim_output") if isinstance(data, dict) else None
    if isinstance(rec, dict) and rec.get("complete") is False:
        raise InputError(str(p), "", "the summary of a complete run (this run was interrupted "
                         "while its files were put in place; run it again)", "incomplete")
    if not isinstance(data, dict) or "step_time_s" not in data:
        raise InputError(str(p), "step_time_s", "a moesim summary with step_time_s",
                         type(data).__name__ if not isinstance(data, dict) else "missing")
    return data


def _flat(x: list) -> list[float]:
    out: list[float] = []
    for v in x:
        if isinstance(v, list):
            out.extend(_flat(v))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out.append(float(v))
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _num(x) -> float | None:
    if isinstance(x, bool | int | float):
        return float(x)
    if isinstance(x, list):  # e.g. dropped per layer × expert
        return float(sum(_flat(x)))
    return None


def metrics(s: dict) -> dict[str, float | None]:
    """Flat metric name → value (ms for times, GB for memory) of one summary."""
    m: dict[str, float | None] = {}
    step = _num(s.get("step_time_s"))
    m["step time (ms)"] = None if step is None else step * 1e3
    m["throughput (tokens/s)"] = _num(s.get("tokens_per_s"))
    mfu = _num(s.get("mfu"))
    m["MFU (%)"] = None if mfu is None else mfu * 100
    for k, v in (s.get("breakdown_s") or {}).items():
        v = _num(v)
        m[f"breakdown {k} (ms)"] = None if v is None else v * 1e3
    st = s.get("stalls") or {}
    if "total_s" in st:
        m["stall total, all ranks (ms)"] = _num(st["total_s"]) * 1e3
    for t in st.get("top", [])[:5]:
        key = f"stall L{t['layer']} {t['phase']} ← rank {t['blocking_rank']} e{t['expert']} (ms)"
        m[key] = _num(t.get("seconds", 0.0)) * 1e3
    ex = s.get("experts") or {}
    for key, fallback, label, reduce in (
            ("max_over_mean_max", "max_over_mean", "expert max/mean (worst layer)", max),
            ("dropped_total", "dropped", "dropped assignments", sum),
            ("lb_loss_mean", "lb_loss", "lb loss (mean over layers)", _mean)):
        if ex.get(key) is not None:
            m[label] = _num(ex[key])
        elif isinstance(ex.get(fallback), list):
            flat = _flat(ex[fallback])
            m[label] = float(reduce(flat)) if flat else None
        elif fallback in ex:
            m[label] = _num(ex[fallback])
    mem = s.get("memory") or {}
    per = mem.get("per_rank") or []
    if mem.get("peak_bytes_max") is not None:
        m["peak memory, max rank (GB)"] = _num(mem["peak_bytes_max"]) / 1e9
    elif per:
        m["peak memory, max rank (GB)"] = max(p.get("peak_bytes", 0) for p in per) / 1e9
    if "oom" in mem:
        m["OOM"] = float(bool(mem["oom"]))
    return m


def compare_summaries(a: dict, b: dict) -> list[dict]:
    """Rows ``{metric, a, b, delta, delta_pct}`` for every metric in either summary, in
    A's order (B-only metrics next to their family); Δ = B - A, missing values are None,
    Δ% is None when A is 0 or missing."""
    ma, mb = metrics(a), metrics(b)
    rows = []
    keys = list(ma)
    for k in mb:  # B-only metrics go next to A's of the same family (e.g. "stall L3 ...")
        if k in ma:
            continue
        same = [i for i, x in enumerate(keys) if x.split()[0] == k.split()[0]]
        keys.insert(same[-1] + 1 if same else len(keys), k)
    for k in keys:
        va, vb = ma.get(k), mb.get(k)
        d = None if va is None or vb is None else vb - va
        if d is not None and abs(d) <= 1e-9 * max(abs(va), abs(vb)):
            d = 0.0  # float noise from unit conversion, not a difference
        pct = None if d is None or not va else d / abs(va) * 100
        rows.append({"metric": k, "a": va, "b": vb, "delta": d, "delta_pct": pct})
    return rows


def _fmt(x: float | None, pct: bool = False, sign: bool = False) -> str:
    if x is None:
        return "—"
    if pct:
        return f"{x:+.1f}%"
    s = "+" if sign else ""
    return f"{x:{s},.4g}" if abs(x) < 1e4 else f"{x:{s},.0f}"


def format_table(rows: list[dict], name_a: str = "A", name_b: str = "B") -> str:
    head = ("metric", name_a, name_b, "Δ", "Δ%")
    body = [(r["metric"], _fmt(r["a"]), _fmt(r["b"]),
             _fmt(r["delta"], sign=True), _fmt(r["delta_pct"], True))
            for r in rows]
    w = [max(len(str(x[i])) for x in [head, *body]) for i in range(5)]
    lines = ["  ".join(str(c).ljust(w[0]) if i == 0 else str(c).rjust(w[i])
                       for i, c in enumerate(x)) for x in [head, *body]]
    lines.insert(1, "  ".join("-" * n for n in w))
    return "\n".join(lines)
