"""The ``load:`` scenario section (requests over time on a serving deployment, docs/
serving.md): :class:`LoadSection`, checked when the scenario is read. The scheduler and
the request balancer by name, a registered scheduler's own fields and the length
distributions by name are checked by :mod:`moesim.traffic.config` when the section is
run (their registries live there), which also reads the files it names.

```yaml
load:
  arrival: {kind: poisson, rate_rps: 4}     # poisson | gamma (cv) | trace (file)
  requests: 2000                            # or duration_s: arrivals for that long
  prompt_tokens: {dist: lognormal, mean: 1024, sigma: 0.8, max: 8192}
  output_tokens: {dist: lognormal, mean: 256, sigma: 0.8, max: 2048}
  scheduler: vllm                           # vllm | sarathi | disaggregated
  token_budget: 2048                        # tokens per step (sarathi; vllm's prompt cap)
  max_seqs: 256                             # running requests per attention-DP rank
  block_size: 16                            # KV block in tokens
  router: least_outstanding                 # round_robin | least_outstanding
  kv_fraction: 0.9                          # share of a GPU's free memory for the KV cache
  kv_tokens: null                           # or: KV cache tokens per attention-DP rank
  prefill_groups: 1                         # disaggregated: groups in the prefill pool
  seed: 0                                   # default: the scenario's seed
  surface: {batches: [1, 8, 64, 256], contexts: [128, 4096]}   # optional: the cost grid
```
Defaults are vLLM's (vllm/config.py: ``gpu_memory_utilization`` 0.9, ``block_size`` 16,
``max_num_seqs`` 256, ``max_num_batched_tokens`` 2048 with chunked prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from moesim.errors import InputError
from moesim.scenario.sections import as_written
from moesim.scenario.sections.lengths import LengthDist
from moesim.scenario.sections.lengths import parse as parse_length
from moesim.scenario.sections.load_limits import (
    CV,
    INT_LIMITS,
    MAX_DURATION_S,
    MAX_GRID,
    MAX_GRID_POINTS,
    MAX_REQUESTS,
    MAX_TOKENS,
    RATE_RPS,
)

#: vLLM's defaults: max_num_seqs 256, max_num_batched_tokens 2048 with chunked prefill
#: (vllm/config.py, SchedulerConfig; vllm/engine/arg_utils.py)
MAX_SEQS = 256
TOKEN_BUDGET = 2048
#: ``load.arrival.kind``: Poisson gaps, gamma gaps of a given cv, or a trace file
#: (moesim.traffic.arrivals draws them)
ARRIVAL_KINDS = ("poisson", "gamma", "trace")
#: the section's keys; a registered scheduler's fields are keys too
#: (moesim.traffic.config.keys)
KEYS = ("arrival", "requests", "duration_s", "prompt_tokens", "output_tokens", "scheduler",
        "token_budget", "max_seqs", "block_size", "router", "kv_fraction", "kv_tokens",
        "prefill_groups", "seed", "surface")
#: the built-in schedulers' fields checked here (integers >= 1, bounded by INT_LIMITS)
INT_FIELDS = ("token_budget", "max_seqs", "block_size", "prefill_groups")
SURFACE_KEYS = ("batches", "contexts", "prompts", "prompt_lens")
#: the lognormal's sigma where a load section gives none (the RL section's: 0.5)
LOAD_LENGTH_DEFAULTS = {"sigma": 1.0}


@dataclass(frozen=True)
class Arrival:
    """``load.arrival``: when requests arrive."""

    kind: str = "poisson"            # poisson | gamma | trace (ARRIVAL_KINDS)
    rate_rps: float | None = None    # requests/s (a trace: rescaled to it when given)
    cv: float | None = None          # gamma: the gaps' coefficient of variation (None: 1)
    file: str | None = None          # trace: a CSV of arrivals


@dataclass(frozen=True)
class Surface:
    """``load.surface``: the grid of the step-cost surface (None: the surface's own)."""

    batches: tuple[int, ...] | None = None
    contexts: tuple[int, ...] | None = None
    prompts: tuple[int, ...] | None = None
    prompt_lens: tuple[int, ...] | None = None

    def given(self) -> dict[str, tuple[int, ...]]:
        """The axes the section sets (keyword arguments of the surface)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class LoadSection:
    arrival: Arrival = field(default_factory=lambda: Arrival(rate_rps=1.0))
    requests: int | None = None
    duration_s: float | None = None
    prompt_tokens: LengthDist = field(default_factory=lambda: LengthDist(mean=1024))
    output_tokens: LengthDist = field(default_factory=lambda: LengthDist(mean=128))
    scheduler: str = "vllm"
    token_budget: int = TOKEN_BUDGET     # the built-in schedulers' fields and defaults
    max_seqs: int = MAX_SEQS
    block_size: int = 16
    router: str = "least_outstanding"
    kv_fraction: float = 0.9
    kv_tokens: int | None = None
    prefill_groups: int = 1
    seed: int = 0
    surface: Surface = field(default_factory=Surface)   # grid of the step-cost surface

    @property
    def rate(self) -> float | None:
        r = self.arrival.rate_rps
        return None if r is None else float(r)


def _num(v: Any, src: str, fld: str, lo: float, integer: bool = False, strict=False,
         hi: float | None = None):
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and (
        v > lo if strict else v >= lo) and (not integer or float(v).is_integer()) and (
        hi is None or v <= hi)
    if not ok:
        what = "an integer" if integer else "a finite number"
        top = "" if hi is None else (f" and <= {int(hi):,}" if float(hi).is_integer()
                                     else f" and <= {hi:g}")
        rng = f"{'>' if strict else '>='} {lo:g}{top}"
        raise InputError(src, fld, f"{what} {rng}", v)
    return int(v) if integer else float(v)


def _arrival(d: dict, source: str) -> Arrival:
    if not isinstance(d.get("arrival") or {}, dict):
        raise InputError(source, "load.arrival", "a mapping {kind: ..., rate_rps: ...}",
                         d["arrival"])
    a = {"kind": "poisson", **dict(d.get("arrival") or {})}
    if a.get("kind") not in ARRIVAL_KINDS:
        raise InputError(source, "load.arrival.kind", f"one of {list(ARRIVAL_KINDS)}",
                         a.get("kind"))
    for k in a:
        if k not in ("kind", "rate_rps", "cv", "file"):
            raise InputError(source, f"load.arrival.{k}", "one of kind, rate_rps, cv, file", k)
    if a["kind"] == "trace":
        if "file" not in a:
            raise InputError(source, "load.arrival.file", "a trace CSV for kind: trace",
                             "missing")
    elif "rate_rps" not in a:
        raise InputError(source, "load.arrival.rate_rps", "an arrival rate in requests/s",
                         "missing")
    if a.get("rate_rps") is not None:
        a["rate_rps"] = _num(a["rate_rps"], source, "load.arrival.rate_rps", RATE_RPS[0],
                             hi=RATE_RPS[1])
    if "cv" in a:
        a["cv"] = _num(a["cv"], source, "load.arrival.cv", CV[0], hi=CV[1])
    if "file" in a and not isinstance(a["file"], str):
        raise InputError(source, "load.arrival.file", "a trace file name", a["file"])
    return Arrival(**a)


def _surface(sf: Any, source: str) -> Surface:
    sf = sf or {}
    if not isinstance(sf, dict):
        raise InputError(source, "load.surface", f"a mapping with keys among "
                         f"{list(SURFACE_KEYS)}", sf)
    for k, v in sf.items():
        if k not in SURFACE_KEYS:
            raise InputError(source, f"load.surface.{k}", f"one of {list(SURFACE_KEYS)}", k)
        if not isinstance(v, list | tuple) or not v or len(v) > MAX_GRID_POINTS:
            raise InputError(source, f"load.surface.{k}", "a non-empty list of at most "
                             f"{MAX_GRID_POINTS} integers", v)
        for x in v:
            _num(x, source, f"load.surface.{k}", 1, integer=True,
                 hi=MAX_GRID if k in ("batches", "prompts") else MAX_TOKENS)
        if len(set(v)) != len(v):
            raise InputError(source, f"load.surface.{k}", "distinct values", v)
    return Surface(**{k: tuple(int(x) for x in v) for k, v in sf.items()})


def section_values(d: Any, source: str, seed: int = 0) -> dict:
    """The checked values of a ``load`` mapping's own keys (:data:`KEYS`), as
    :class:`LoadSection` takes them; keys it does not know are left to the scheduler
    registry (:func:`moesim.traffic.config.load_from_dict`)."""
    if not isinstance(d, dict):
        raise InputError(source, "load", "a mapping of key: value", d)
    out: dict[str, Any] = {"arrival": _arrival(d, source)}
    rate = out["arrival"].rate_rps
    if d.get("requests") is not None:
        out["requests"] = _num(d["requests"], source, "load.requests", 1, integer=True,
                               hi=MAX_REQUESTS)
    if d.get("duration_s") is not None:
        dur = out["duration_s"] = _num(d["duration_s"], source, "load.duration_s", 0,
                                       strict=True, hi=MAX_DURATION_S)
        if rate is not None and out.get("requests") is None and dur * rate > MAX_REQUESTS:
            raise InputError(source, "load.duration_s", f"at most {MAX_REQUESTS:,} requests "
                             f"(rate_rps x duration_s; {rate:g} x {dur:g}"
                             f" = {dur * rate:,.0f})", dur)
    if out.get("requests") is None and out.get("duration_s") is None:
        if out["arrival"].kind != "trace":
            raise InputError(source, "load.requests", "a number of requests (or "
                             "load.duration_s)", "missing")
    for k in ("prompt_tokens", "output_tokens"):
        if k in d:
            out[k] = parse_length(d[k], source, f"load.{k}", LOAD_LENGTH_DEFAULTS)
    for k in ("scheduler", "router"):
        if k in d:
            out[k] = d[k]          # names: the registries' (moesim.traffic.config)
    for k in INT_FIELDS:
        if k in d:
            out[k] = _num(d[k], source, f"load.{k}", 1, integer=True, hi=INT_LIMITS[k])
    if d.get("kv_tokens") is not None:
        out["kv_tokens"] = _num(d["kv_tokens"], source, "load.kv_tokens", 1, integer=True,
                                hi=INT_LIMITS["kv_tokens"])
    if "kv_fraction" in d:
        out["kv_fraction"] = _num(d["kv_fraction"], source, "load.kv_fraction", 0,
                                  strict=True)
        if out["kv_fraction"] > 1:
            raise InputError(source, "load.kv_fraction", "a share in (0, 1]",
                             out["kv_fraction"])
    out["surface"] = _surface(d.get("surface"), source)
    out["seed"] = _num(d["seed"], source, "load.seed", 0, integer=True,
                       hi=INT_LIMITS["seed"]) if "seed" in d else seed
    return out


def load_from_dict(d: Any, source: str, seed: int = 0) -> LoadSection | None:
    """The ``load`` section, checked as far as it goes without the registries (None: no
    section)."""
    if not d:
        return None
    return as_written(LoadSection(**section_values(d, source, seed)), d)
