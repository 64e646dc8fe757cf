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
    if not isinstance(data, dict) or "step_time_s" not in data:
        raise InputError(str(p), "step_time_s", "a moesim summary with step_time_s",
                         type(data).__name__ if not isinstance(data, dict) else "missing")
    return data


def _num(x) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, int | float):
        return float(x)
    if isinstance(x, list):  # e.g. dropped per layer × expert
        flat = []
        stack = list(x)
        while stack:
            v = stack.pop()
            if isinstance(v, list):
                stack.extend(v)
            elif isinstance(v, int | float):
                flat.append(v)
        return float(sum(flat))
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
    for k, label in (("max_over_mean", "expert max/mean"), ("dropped", "dropped tokens"),
                     ("lb_loss", "lb loss")):
        if k in ex:
            m[label] = _num(ex[k])
    mem = s.get("memory") or {}
    per = mem.get("per_rank") or []
    if per:
        m["peak memory, max rank (GB)"] = max(p.get("peak_bytes", 0) for p in per) / 1e9
    if "oom" in mem:
        m["OOM"] = float(bool(mem["oom"]))
    return m


def compare_summaries(a: dict, b: dict) -> list[dict]:
    """Rows ``{metric, a, b, delta, delta_pct}`` for every metric in either summary, in
    A's order then B's; missing values are None, Δ% is None when A is 0 or missing."""
    ma, mb = metrics(a), metrics(b)
    rows = []
    for k in dict.fromkeys([*ma, *mb]):
        va, vb = ma.get(k), mb.get(k)
        d = None if va is None or vb is None else vb - va
        pct = None if d is None or not va else d / abs(va) * 100
        rows.append({"metric": k, "a": va, "b": vb, "delta": d, "delta_pct": pct})
    return rows


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "—"
    if pct:
        return f"{x:+.1f}%"
    return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"


def format_table(rows: list[dict], name_a: str = "A", name_b: str = "B") -> str:
    head = ("metric", name_a, name_b, "Δ", "Δ%")
    body = [(r["metric"], _fmt(r["a"]), _fmt(r["b"]),
             "—" if r["delta"] is None else f"{r['delta']:+,.4g}", _fmt(r["delta_pct"], True))
            for r in rows]
    w = [max(len(str(x[i])) for x in [head, *body]) for i in range(5)]
    lines = ["  ".join(str(c).ljust(w[0]) if i == 0 else str(c).rjust(w[i])
                       for i, c in enumerate(x)) for x in [head, *body]]
    lines.insert(1, "  ".join("-" * n for n in w))
    return "\n".join(lines)
