"""Does a placed model fit? One verdict, flagged the same way by every command.

Every command that places a model on GPUs (``run``, ``serve`` one step and under load,
``rl`` for its trainer and its rollout engines, ``sweep`` for each point) builds one
:class:`Fit` per placement it checks (the peak bytes one GPU needs against the bytes the
device has, :attr:`moesim.compute.devices.DeviceSpec.hbm_bytes`) and calls
:func:`flag_fits`, which

- prints one warning line per placement that does not fit on stderr
  (``moesim rl: warning: trainer (stage 0) needs 131.7 GiB of 79.6 GiB per GPU: does
  not fit``),
- with ``strict`` raises :class:`moesim.errors.InputError` instead (one line, exit 2),
- returns the ``fit`` object every summary carries: ``{"oom": bool, "checks": [...]}``
  (each check: ``what``, ``need_bytes``, ``capacity_bytes``, ``oom``).

Summaries put it under the key ``fit`` and repeat ``oom`` at their top level, so
``jq .oom summary.json`` answers for every command; the text summary prints
:func:`fit_line`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

from moesim.errors import InputError
from moesim.units import GiB


@dataclass(frozen=True, slots=True)
class Fit:
    """One placement's memory verdict, per GPU, in bytes."""

    what: str               # what was placed, e.g. "trainer (stage 0)", "rollout engine"
    need_bytes: float       # peak bytes one GPU of it needs
    capacity_bytes: float   # bytes the device has (as the card reports them)

    @property
    def oom(self) -> bool:
        return self.need_bytes > self.capacity_bytes

    def text(self) -> str:
        verdict = "does not fit" if self.oom else "fits"
        return (f"{self.what} needs {self.need_bytes / GiB:.1f} GiB of "
                f"{self.capacity_bytes / GiB:.1f} GiB per GPU: {verdict}")

    def to_dict(self) -> dict:
        return {"what": self.what, "need_bytes": float(self.need_bytes),
                "capacity_bytes": float(self.capacity_bytes), "oom": self.oom}


def fit_summary(fits: Iterable[Fit]) -> dict:
    """``{"oom": any placement over capacity, "checks": [Fit.to_dict(), ...]}``."""
    rows = [f.to_dict() for f in fits]
    return {"oom": any(r["oom"] for r in rows), "checks": rows}


def flag_fits(fits: Iterable[Fit], command: str, *, strict: bool = False,
              stream: TextIO | None = None) -> dict:
    """Warn on ``stream`` (stderr) for each placement that does not fit, or with
    ``strict`` raise InputError naming the first; returns :func:`fit_summary`."""
    fits = list(fits)
    bad = [f for f in fits if f.oom]
    if bad and strict:
        raise InputError("command line", "--strict", "a layout that fits in device memory",
                         bad[0].text())
    out = sys.stderr if stream is None else stream
    for f in bad:
        print(f"moesim {command}: warning: {f.text()}", file=out)
    return fit_summary(fits)


def fit_line(fit: dict) -> str:
    """The text summary's line for a :func:`fit_summary` object."""
    checks = fit.get("checks", [])
    if not checks:
        return "  memory: not checked"
    parts = [f"{c['what']} {c['need_bytes'] / GiB:.1f} of {c['capacity_bytes'] / GiB:.1f} GiB"
             + (" OOM" if c["oom"] else "") for c in checks]
    head = "  memory per GPU (** does not fit **): " if fit["oom"] else "  memory per GPU: "
    return head + ", ".join(parts)


def fits_of(fit: dict) -> list[Fit]:
    """The :class:`Fit` objects back from a :func:`fit_summary` object (a summary's ``fit``)."""
    return [Fit(c["what"], c["need_bytes"], c["capacity_bytes"]) for c in fit.get("checks", [])]


def step_fits(memory: dict, what: str = "training step") -> list[Fit]:
    """One :class:`Fit` per pipeline stage of a step summary's ``memory`` (``per_rank``
    rows with ``stage`` and ``peak_bytes``, and ``capacity_bytes``): each stage's most
    loaded rank (a hot expert's rank holds the larger token buffers). A single stage is
    named ``what``; more are ``what (stage s)``."""
    cap = float(memory.get("capacity_bytes", float("inf")))
    if not math.isfinite(cap):      # no device memory to check against
        return []
    worst: dict[int, float] = {}
    for row in memory.get("per_rank", []):
        s = int(row.get("stage", 0))
        worst[s] = max(worst.get(s, 0.0), float(row["peak_bytes"]))
    if len(worst) <= 1:
        return [Fit(what, max(worst.values(), default=0.0), cap)] if worst else []
    return [Fit(f"{what} (stage {s})", need, cap) for s, need in sorted(worst.items())]
