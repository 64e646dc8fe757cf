"""The ``load:`` scenario section: requests over time on a serving deployment.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import InputError
from moesim.traffic import arrivals as arr
from moesim.traffic import lengths as lens
from moesim.traffic.balancer import BALANCERS
from moesim.traffic.limits import (
    CV,
    INT_LIMITS,
    MAX_DURATION_S,
    MAX_GRID,
    MAX_GRID_POINTS,
    MAX_REQUESTS,
    MAX_TOKENS,
    RATE_RPS,
)
from moesim.traffic.request import Request
from moesim.traffic.scheduler import MAX_SEQS, TOKEN_BUDGET
from moesim.traffic.schedulers import SCHEDULERS

#: the section's keys; a registered scheduler's fields are keys too (:func:`keys`)
KEYS = ("arrival", "requests", "duration_s", "prompt_tokens", "output_tokens", "scheduler",
        "token_budget", "max_seqs", "block_size", "router", "kv_fraction", "kv_tokens",
        "prefill_groups", "seed", "surface")
#: the built-in schedulers' fields checked here (integers >= 1, bounded by INT_LIMITS)
_INT_FIELDS = ("token_budget", "max_seqs", "block_size", "prefill_groups")
SURFACE_KEYS = ("batches", "contexts", "prompts", "prompt_lens")


@dataclass(frozen=True)
class LoadConfig:
    arrival: dict = field(default_factory=lambda: {"kind": "poisson", "rate_rps": 1.0})
    requests: int | None = None
    duration_s: float | None = None
    prompt_tokens: lens.LengthDist = field(default_factory=lambda: lens.LengthDist(mean=1024))
    output_tokens: lens.LengthDist = field(default_factory=lambda: lens.LengthDist(mean=128))
    scheduler: str = "vllm"
    token_budget: int = TOKEN_BUDGET     # the built-in schedulers' fields and defaults
    max_seqs: int = MAX_SEQS
    block_size: int = 16
    router: str = "least_outstanding"
    kv_fraction: float = 0.9
    kv_tokens: int | None = None
    prefill_groups: int = 1
    seed: int = 0
    surface: dict = field(default_factory=dict)   # grid of the step-cost surface
    options: dict = field(default_factory=dict)   # a registered scheduler's other fields
    base: str = "."                      # folder relative file names are read from
    source: str = "<load>"

    @property
    def rate(self) -> float | None:
        r = self.arrival.get("rate_rps")
        return None if r is None else float(r)

    def scheduler_options(self) -> dict:
        """The fields the scheduler registered (:data:`SCHEDULERS`), with their values."""
        kind = SCHEDULERS.get(self.scheduler, self.source)
        return {f: getattr(self, f) if f in KEYS else self.options.get(f, default)
                for f, default in kind.fields.items()}

    def with_rate(self, rate: float) -> LoadConfig:
        import dataclasses
        return dataclasses.replace(self, arrival={**self.arrival, "rate_rps": rate})

    def with_requests(self, n: int) -> LoadConfig:
        import dataclasses
        return dataclasses.replace(self, requests=int(n), duration_s=None)

    def requests_list(self) -> list[Request]:
        """The requests of the run, seeded: arrival times, prompt and output tokens."""
        a = self.arrival
        if a["kind"] == "trace":
            t, p, o = arr.read_trace(_path(self, a["file"]), self.source)
            if self.rate is not None and len(t) > 1 and t[-1] > 0:
                t = t * (len(t) - 1) / t[-1] / self.rate
            if self.duration_s is not None:
                keep = t < self.duration_s
                t, p, o = t[keep], p[keep], o[keep]
            if self.requests is not None:
                t, p, o = t[:self.requests], p[:self.requests], o[:self.requests]
        else:
            n = self.requests if self.requests is not None else None
            g_rng = np.random.default_rng([self.seed, 1])
            cv = float(a.get("cv", 1.0))
            if n is None:   # enough gaps for the duration, drawn in blocks
                gaps = np.zeros(0)
                while gaps.sum() * 1.0 < self.duration_s * self.rate:
                    gaps = np.concatenate([gaps, arr.gaps(a["kind"], g_rng, 4096, cv)])
                t = np.cumsum(gaps) / self.rate
                t = t[t < self.duration_s]
            else:
                t = np.cumsum(arr.gaps(a["kind"], g_rng, n, cv)) / self.rate
            t = t - (t[0] if len(t) else 0.0)      # the first request at t = 0
            p = lens.draw(self.prompt_tokens, np.random.default_rng([self.seed, 2]), len(t),
                          _counts(self, "prompt_tokens"))
            o = lens.draw(self.output_tokens, np.random.default_rng([self.seed, 3]), len(t),
                          _counts(self, "output_tokens"))
        return [Request(id=i, arrival_s=float(t[i]), prompt=int(p[i]), output=int(o[i]))
                for i in range(len(t))]


def _path(cfg: LoadConfig, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else Path(cfg.base) / p


def _counts(cfg: LoadConfig, key: str) -> np.ndarray | None:
    d = getattr(cfg, key)
    if d.dist != "empirical":
        return None
    return lens.read_counts(_path(cfg, d.file), d.column, cfg.source, f"load.{key}")


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


#: the lognormal's sigma where a load section gives none (the RL section's: 0.5)
LOAD_LENGTH_DEFAULTS = {"sigma": 1.0}


def keys() -> tuple[str, ...]:
    """The section's keys and every registered scheduler's fields."""
    return KEYS + tuple(f for f in SCHEDULERS.all_fields() if f not in KEYS)


def _scheduler_fields(d: dict, source: str) -> dict:
    """The scheduler by name from the registry; a key only other schedulers take is
    refused naming the schedulers that take it. Returns the scheduler's fields that are
    not section keys (its factory reads them); the fields not given take the scheduler's
    defaults."""
    kind = SCHEDULERS.get(d.get("scheduler", LoadConfig.scheduler), source)
    SCHEDULERS.refuse_foreign(d, kind, source, "load", "scheduler")
    for k, default in kind.fields.items():     # the scheduler's defaults
        d.setdefault(k, default)
    return {k: d.pop(k) for k in list(d) if k in kind.fields and k not in KEYS}


def load_from_dict(d: Any, source: str, seed: int = 0, base: str = ".") -> LoadConfig:
    """Check the ``load`` section; every problem is one :class:`InputError`."""
    if not isinstance(d, dict):
        raise InputError(source, "load", "a mapping of key: value", d)
    d = dict(d)
    for k in d:
        if k not in keys():
            raise InputError(source, f"load.{k}", f"one of the load keys {list(keys())}", k)
    if not isinstance(d.get("arrival") or {}, dict):
        raise InputError(source, "load.arrival", "a mapping {kind: ..., rate_rps: ...}",
                         d["arrival"])
    a = {"kind": "poisson", **dict(d.get("arrival") or {})}
    if a.get("kind") not in arr.KINDS:
        raise InputError(source, "load.arrival.kind", f"one of {list(arr.KINDS)}",
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
    d["arrival"] = a
    if d.get("requests") is not None:
        d["requests"] = _num(d["requests"], source, "load.requests", 1, integer=True,
                             hi=MAX_REQUESTS)
    if d.get("duration_s") is not None:
        d["duration_s"] = _num(d["duration_s"], source, "load.duration_s", 0, strict=True,
                               hi=MAX_DURATION_S)
        if a.get("rate_rps") is not None and d.get("requests") is None \
                and d["duration_s"] * a["rate_rps"] > MAX_REQUESTS:
            raise InputError(source, "load.duration_s", f"at most {MAX_REQUESTS:,} requests "
                             f"(rate_rps x duration_s; {a['rate_rps']:g} x {d['duration_s']:g}"
                             f" = {d['duration_s'] * a['rate_rps']:,.0f})", d["duration_s"])
    if d.get("requests") is None and d.get("duration_s") is None:
        if a["kind"] != "trace":
            raise InputError(source, "load.requests", "a number of requests (or "
                             "load.duration_s)", "missing")
    for k in ("prompt_tokens", "output_tokens"):
        if k in d:
            d[k] = lens.check(d[k], source, f"load.{k}", LOAD_LENGTH_DEFAULTS)
    options = _scheduler_fields(d, source)
    if "router" in d:
        BALANCERS.get(d["router"], source)
    for k in _INT_FIELDS:
        if k in d:
            d[k] = _num(d[k], source, f"load.{k}", 1, integer=True, hi=INT_LIMITS[k])
    if d.get("kv_tokens") is not None:
        d["kv_tokens"] = _num(d["kv_tokens"], source, "load.kv_tokens", 1, integer=True,
                              hi=INT_LIMITS["kv_tokens"])
    if "kv_fraction" in d:
        d["kv_fraction"] = _num(d["kv_fraction"], source, "load.kv_fraction", 0, strict=True)
        if d["kv_fraction"] > 1:
            raise InputError(source, "load.kv_fraction", "a share in (0, 1]", d["kv_fraction"])
    sf = d.get("surface") or {}
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
    d["surface"] = {k: tuple(int(x) for x in v) for k, v in sf.items()}
    if "seed" in d:
        d["seed"] = _num(d["seed"], source, "load.seed", 0, integer=True,
                         hi=INT_LIMITS["seed"])
    else:
        d["seed"] = seed
    return LoadConfig(**d, options=options, base=base, source=source)
