"""The ``load:`` section run: :class:`LoadConfig`, the section (checked when the scenario
was read, :mod:`moesim.scenario.sections.load`) with the names its registries hold
checked (the scheduler and its own fields, :data:`SCHEDULERS`; the request balancer,
:data:`BALANCERS`; the length distributions, :mod:`moesim.traffic.lengths`), the folder
its files are read from, and the requests it draws. The fields and their defaults are
the section's (vLLM's: vllm/config.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import InputError
from moesim.scenario.sections.load import (
    KEYS,
    LOAD_LENGTH_DEFAULTS,
    LoadSection,
    section_values,
)
from moesim.traffic import arrivals as arr
from moesim.traffic import lengths as lens
from moesim.traffic.balancer import BALANCERS
from moesim.traffic.request import Request
from moesim.traffic.schedulers import SCHEDULERS


@dataclass(frozen=True)
class LoadConfig(LoadSection):
    options: dict = field(default_factory=dict)   # a registered scheduler's other fields
    base: str = "."                      # folder relative file names are read from
    source: str = "<load>"

    def scheduler_options(self) -> dict:
        """The fields the scheduler registered (:data:`SCHEDULERS`), with their values."""
        kind = SCHEDULERS.get(self.scheduler, self.source)
        return {f: getattr(self, f) if f in KEYS else self.options.get(f, default)
                for f, default in kind.fields.items()}

    def with_rate(self, rate: float) -> LoadConfig:
        return dataclasses.replace(self, arrival=dataclasses.replace(self.arrival,
                                                                     rate_rps=rate))

    def with_requests(self, n: int) -> LoadConfig:
        return dataclasses.replace(self, requests=int(n), duration_s=None)

    def requests_list(self) -> list[Request]:
        """The requests of the run, seeded: arrival times, prompt and output tokens."""
        a = self.arrival
        if a.kind == "trace":
            t, p, o = arr.read_trace(_path(self, a.file), self.source)
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
            cv = float(1.0 if a.cv is None else a.cv)
            if n is None:   # enough gaps for the duration, drawn in blocks
                gaps = np.zeros(0)
                while gaps.sum() * 1.0 < self.duration_s * self.rate:
                    gaps = np.concatenate([gaps, arr.gaps(a.kind, g_rng, 4096, cv)])
                t = np.cumsum(gaps) / self.rate
                t = t[t < self.duration_s]
            else:
                t = np.cumsum(arr.gaps(a.kind, g_rng, n, cv)) / self.rate
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
    """Check a ``load`` mapping (the section as written): its own keys as reading a
    scenario does (:func:`moesim.scenario.sections.load.section_values`), and the names
    and fields of the registries; every problem is one :class:`InputError`."""
    if not isinstance(d, dict):
        raise InputError(source, "load", "a mapping of key: value", d)
    d = dict(d)
    for k in d:
        if k not in keys():
            raise InputError(source, f"load.{k}", f"one of the load keys {list(keys())}", k)
    options = _scheduler_fields(d, source)
    values = section_values(d, source, seed)
    for k in ("prompt_tokens", "output_tokens"):
        if k in d:
            values[k] = lens.check(d[k], source, f"load.{k}", LOAD_LENGTH_DEFAULTS)
    if "router" in d:
        BALANCERS.get(d["router"], source)
    return LoadConfig(**values, options=options, base=base, source=source)
