"""A GPU trace against a scenario's compute model, phase by phase and layer by layer.

What is compared (and what is not):

- For each annotated phase named as DualPipe names them (``attn(F)``, ``attn(B)``,
  ``attn(W)``, ``mlp(F)``, ``mlp(B)``, ``mlp(W)``; ``dispatch``/``combine`` phases are
  measured only) and each layer k (the k-th annotation of that name), the GPU time of
  the GEMM kernels launched under it and of the attention kernels, measured (summed
  kernel durations) and simulated: the scenario's compute model (roofline, or the
  ``--calibration`` file) prices the kernels :mod:`moesim.model.costs` gives that part
  of one layer of the scenario's model, for ``micro_batch_size · seq_len`` tokens per
  rank and balanced routing (each rank's experts receive ``tokens · top_k`` rows, split
  evenly over its ``n_experts / ep`` experts).
- Parts: ``attn`` = the attention projections, the router GEMM and core attention
  (DeepSeek's profile launches the router inside ``attn(F)``); ``mlp`` = the routed
  experts on this rank and the shared experts. Passes: ``F`` forward GEMMs and core
  attention; ``B`` the input-gradient GEMMs (dX = dY·Wᵀ: the forward shapes) and the
  core attention backward (2.5× forward FLOPs, :mod:`moesim.model.costs`); ``W`` the
  weight-gradient GEMMs (dW = Xᵀ·dY: the forward FLOPs), no attention.
- Span, per-stream busy time and the dispatch/combine kernels are reported as
  measured; their simulated values are ``null``: simulating a DualPipe forward+backward
  chunk pair with DeepEP on 20 SMs needs the engine's chunk-pair schedule.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from moesim.compute.base import Kernel
from moesim.model.costs import (
    attention_kernels,
    expert_kernels,
    router_kernels,
    shared_expert_kernels,
)

PHASE_RE = re.compile(r"(attn|mlp|dispatch|combine)\(([FBW])\)")
COMPARED = ("per layer and phase (attn/mlp × F/B/W): GEMM kernel time and attention "
            "kernel time, simulated from the scenario's compute model with balanced "
            "routing; span, per-stream busy time and dispatch/combine are measured only "
            "(simulated null: a DualPipe F&B chunk pair with DeepEP needs the engine's "
            "chunk-pair schedule)")


def part_kernels(spec: Any, part: str, pss: str, tokens: int, seq_len: int,
                 ep: int) -> tuple[list[Kernel], list[Kernel]]:
    """(GEMM kernels, attention kernels) one layer's ``part`` runs in pass ``pss`` on
    one rank."""
    if part == "attn":
        fwd = attention_kernels(spec, tokens, seq_len, 1, "fwd") + router_kernels(spec, tokens)
        gemms = [k for k in fwd if k.m > 0 and k.name not in ("attention", "router_topk")]
        if pss == "W":
            return gemms, []
        core = attention_kernels(spec, tokens, seq_len, 1, "fwd" if pss == "F" else "bwd")
        return gemms, [k for k in core if k.name in ("attention", "attention_bwd")]
    local = max(spec.n_experts // max(ep, 1), 1)
    rows = tokens * spec.top_k * ep // max(spec.n_experts, 1)   # per expert, balanced
    ks = [k for _ in range(local) for k in expert_kernels(spec, rows)]
    ks += shared_expert_kernels(spec, tokens, 1)
    return [k for k in ks if k.m > 0], []


class ForwardFit:
    """A compute model fitted on the forward phases only: GEMMs at the FLOP rate
    (FLOPs of :func:`part_kernels` over the ``*(F)`` phases / their measured GEMM kernel
    time), core attention at its own such rate; used to predict the ``B`` and ``W``
    phases, which it has not seen."""

    name = "forward-fit"

    def __init__(self, gemm_flops_per_s: float, attention_flops_per_s: float):
        self.gemm_flops_per_s = gemm_flops_per_s
        self.attention_flops_per_s = attention_flops_per_s

    def time_s(self, k: Kernel) -> float:
        core = k.name in ("attention", "attention_bwd")
        return k.flops / (self.attention_flops_per_s if core else self.gemm_flops_per_s)


def forward_fit(g: dict, spec: Any, tokens: int, seq_len: int, ep: int) -> ForwardFit | None:
    """:class:`ForwardFit` from the trace's ``attn(F)``/``mlp(F)`` phases; None when the
    trace has no forward GEMM or attention time to fit."""
    flops = {"gemm": 0.0, "attention": 0.0}
    secs = {"gemm": 0.0, "attention": 0.0}
    for p in g["phases"]:
        m = PHASE_RE.fullmatch(p["phase"])
        if not m or m.group(2) != "F" or m.group(1) not in ("attn", "mlp"):
            continue
        gemms, attn = part_kernels(spec, m.group(1), "F", tokens, seq_len, ep)
        flops["gemm"] += sum(k.flops for k in gemms)
        flops["attention"] += sum(k.flops for k in attn)
        secs["gemm"] += p["classes"].get("gemm", 0.0)
        secs["attention"] += p["classes"].get("attention", 0.0)
    if min(secs.values()) <= 0 or min(flops.values()) <= 0:
        return None
    return ForwardFit(flops["gemm"] / secs["gemm"], flops["attention"] / secs["attention"])


def _err(sim: float | None, meas: float) -> float | None:
    return None if sim is None or meas <= 0 else (sim - meas) / meas


def gpu_validate(g: dict, spec: Any, model: Any, tokens: int, seq_len: int, ep: int) -> dict:
    """``g``: :func:`moesim.validation.gpu_summary.summarize`; ``model``: a compute model
    (``time_s(Kernel)``). Returns {"measured", "simulated", "error", ...} (seconds)."""
    meas_ph: dict[str, dict[str, dict]] = {}
    sim_ph: dict[str, dict[str, dict]] = {}
    err_ph: dict[str, dict[str, dict]] = {}
    errs: dict[str, list[float]] = {"F": [], "B": [], "W": []}
    for p in g["phases"]:
        m = PHASE_RE.fullmatch(p["phase"])
        if not m:
            continue
        part, pss = m.groups()
        lay = str(p["layer"])
        comm = sum(p["comm"].values())
        meas = {"gemm_s": p["classes"].get("gemm", 0.0),
                "attention_s": p["classes"].get("attention", 0.0), "comm_s": comm}
        meas_ph.setdefault(p["phase"], {})[lay] = meas
        if part in ("dispatch", "combine"):
            sim = {"gemm_s": None, "attention_s": None, "comm_s": None}
        else:
            gemms, attn = part_kernels(spec, part, pss, tokens, seq_len, ep)
            sim = {"gemm_s": float(sum(model.time_s(k) for k in gemms)),
                   "attention_s": float(sum(model.time_s(k) for k in attn)), "comm_s": None}
        sim_ph.setdefault(p["phase"], {})[lay] = sim
        e = {k: _err(sim[k], meas[k]) for k in meas}
        err_ph.setdefault(p["phase"], {})[lay] = e
        errs[pss] += [abs(v) for v in e.values() if v is not None]
    streams = {str(s["stream"]): s["busy_s"] for s in g["streams"]}
    return {
        "measured": {"span_s": g["span_s"], "stream_busy_s": streams,
                     "exposed_comm_s": g["exposed_comm_s"], "phases": meas_ph},
        "simulated": {"span_s": None, "stream_busy_s": None, "exposed_comm_s": None,
                      "phases": sim_ph},
        "error": {"span_s": None, "stream_busy_s": None, "phases": err_ph},
        "median_abs_error": _median([x for v in errs.values() for x in v]),
        "median_abs_error_by_pass": {k: _median(v) for k, v in errs.items()},
        "compared": COMPARED,
        "tokens_per_rank": tokens, "units": "seconds; error = (simulated - measured) / measured",
    }


def _median(x: list[float]) -> float | None:
    return float(np.median(x)) if x else None


def text_table(doc: dict) -> str:
    lines = [f"{'phase':<12}{'layer':>6}{'what':>11}{'measured ms':>13}{'simulated ms':>14}"
             f"{'error':>9}"]
    for ph, layers in doc["measured"]["phases"].items():
        for lay, meas in layers.items():
            sim, err = doc["simulated"]["phases"][ph][lay], doc["error"]["phases"][ph][lay]
            for key in ("gemm_s", "attention_s", "comm_s"):
                if meas[key] <= 0 and sim[key] in (None, 0.0):
                    continue
                s = "-" if sim[key] is None else f"{sim[key] * 1e3:.3f}"
                e = "-" if err[key] is None else f"{err[key]:+.1%}"
                lines.append(f"{ph:<12}{lay:>6}{key.removesuffix('_s'):>11}"
                             f"{meas[key] * 1e3:>13.3f}{s:>14}{e:>9}")
    med = doc["median_abs_error"]
    m = doc["measured"]
    lines.append(f"measured span {m['span_s'] * 1e3:.3f} ms; stream busy ms: " + ", ".join(
        f"{k} {v * 1e3:.3f}" for k, v in m["stream_busy_s"].items())
        + f"; exposed comm {m['exposed_comm_s'] * 1e3:.3f} ms (simulated: -)")
    by = ", ".join(f"{k} {'n/a' if v is None else f'{v:.1%}'}"
                   for k, v in doc["median_abs_error_by_pass"].items())
    lines.append("median |error| over compared entries: "
                 + ("n/a" if med is None else f"{med:.1%}") + f" (by pass: {by})")
    lines.append("compared: " + doc["compared"])
    return "\n".join(lines)
