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
- Span, busy time per stream role (compute streams, communication streams), exposed
  communication, and per phase and layer the GPU time (``busy_s``) and communication
  kernel time (``comm_s``, the DeepEP dispatch/combine): simulated by running the
  scenario (a DualPipe(V) schedule) and reading one rank's overlapped F&B pair from its
  spans (:mod:`moesim.validation.gpu.pair`); ``null`` when the scenario has no such pair.
  The measured ``busy_s`` of a phase is the union of its kernels (``gpu_busy_s``), the
  simulated one the summed time of its ops (one stream each, so the same thing).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from moesim.compute.base import Kernel
from moesim.program.recipe import backward_part, dualpipe_part

GEMM_KINDS = ("gemm", "grouped_gemm", "kgrouped_gemm")
PHASE_RE = re.compile(r"(attn|mlp|dispatch|combine)\(([FBW])\)")
COMPARED = ("per layer and phase (attn/mlp × F/B/W): GEMM kernel time and attention "
            "kernel time, priced by the compute model with balanced routing; span, busy "
            "time of the compute and communication streams, exposed communication, and "
            "per layer and phase GPU time (busy) and dispatch/combine kernel time (comm), "
            "from the simulated run of the scenario: one rank's overlapped DualPipe F&B "
            "pair, its layer ops only (no pipeline communication, embedding or LM head)")
NO_PAIR = ("per layer and phase (attn/mlp × F/B/W): GEMM kernel time and attention "
           "kernel time, priced by the compute model with balanced routing; span, stream "
           "busy time and per-phase busy/comm are measured only: ")


def part_kernels(spec: Any, part: str, pss: str, tokens: int, seq_len: int,
                 ep: int, recompute: dict | None = None) -> tuple[list[Kernel], list[Kernel]]:
    """(GEMM kernels, attention kernels) one layer's ``part`` runs in pass ``pss`` on
    one rank: the pass's own kernels (``F`` forward, ``B`` dgrad, ``W`` wgrad:
    :func:`moesim.model.costs.backward_part`), so each GEMM is priced in its pass's
    layout and the attention backward with its pre/post-processing kernels; in ``B``
    also the forward kernels recomputation re-runs there (``recompute``: {part:
    kernels}, :func:`moesim.validation.gpu.classes.recompute_kernels`)."""
    ks = dualpipe_part(spec, part, tokens, seq_len, ep, "fwd" if pss == "F" else "bwd")
    if pss != "F":
        ks = backward_part(ks, pss)
    if pss == "B" and recompute:
        ks = list(recompute.get(part, [])) + ks
    return ([k for k in ks if k.kind in GEMM_KINDS],
            [k for k in ks if k.kclass == "attention"])


class ForwardFit:
    """A compute model fitted on the forward phases only: GEMMs at the FLOP rate
    (FLOPs of :func:`part_kernels` over the ``*(F)`` phases / their measured GEMM kernel
    time), core attention at its own such rate; used to predict the ``B`` and ``W``
    phases, which it has not seen."""

    name = "forward-fit"

    def __init__(self, gemm_flops_per_s: float, attention_flops_per_s: float,
                 fallback: Any = None):
        self.gemm_flops_per_s = gemm_flops_per_s
        self.attention_flops_per_s = attention_flops_per_s
        self.fallback = fallback

    def time_s(self, k: Kernel) -> float:
        """Core attention and GEMMs (``m > 0``) at the fitted rates; any other kernel
        (norms, permutes, the optimizer: what the forward GEMMs say nothing about) from
        ``fallback`` (the scenario's compute model) when given, else at the GEMM rate."""
        if k.kind in ("attn_fwd", "attn_bwd"):
            return k.flops / self.attention_flops_per_s
        if k.kind in GEMM_KINDS or self.fallback is None:
            return k.flops / self.gemm_flops_per_s
        return self.fallback.time_s(k)


def forward_fit(g: dict, spec: Any, tokens: int, seq_len: int, ep: int,
                fallback: Any = None) -> ForwardFit | None:
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
    return ForwardFit(flops["gemm"] / secs["gemm"], flops["attention"] / secs["attention"],
                      fallback)


def _err(sim: float | None, meas: float) -> float | None:
    return None if sim is None or meas <= 0 else (sim - meas) / meas


def gpu_validate(g: dict, spec: Any, model: Any, tokens: int, seq_len: int, ep: int,
                 sim: dict | None = None, streams: dict | None = None,
                 recompute: dict | None = None) -> dict:
    """``g``: :func:`moesim.validation.gpu.summary.summarize`; ``model``: a compute model
    (``time_s(Kernel)``); ``sim``: :func:`moesim.validation.gpu.pair.simulate_pair` (None:
    not simulated); ``streams``: :func:`moesim.validation.gpu.pair.measured_streams`;
    ``recompute``: the recomputed kernels the ``B`` phases also run (:func:`part_kernels`).
    Returns {"measured", "simulated", "error", ...} (seconds)."""
    have = sim is not None and sim.get("span_s") is not None
    sim_pair = sim["phases"] if have else {}
    meas_ph: dict[str, dict[str, dict]] = {}
    sim_ph: dict[str, dict[str, dict]] = {}
    err_ph: dict[str, dict[str, dict]] = {}
    errs: dict[str, list[float]] = {"F": [], "B": [], "W": []}
    errs_tl: dict[str, list[float]] = {"F": [], "B": [], "W": []}
    for p in g["phases"]:
        m = PHASE_RE.fullmatch(p["phase"])
        if not m:
            continue
        part, pss = m.groups()
        lay = str(p["layer"])
        comm = sum(p["comm"].values())
        meas = {"gemm_s": p["classes"].get("gemm", 0.0),
                "attention_s": p["classes"].get("attention", 0.0), "comm_s": comm,
                "busy_s": p["gpu_busy_s"]}
        meas_ph.setdefault(p["phase"], {})[lay] = meas
        if part in ("dispatch", "combine"):
            sim_k = {"gemm_s": None, "attention_s": None}
        else:
            gemms, attn = part_kernels(spec, part, pss, tokens, seq_len, ep, recompute)
            sim_k = {"gemm_s": float(sum(model.time_s(k) for k in gemms)),
                     "attention_s": float(sum(model.time_s(k) for k in attn))}
        row = sim_pair.get(p["phase"], {}).get(lay) if have else None
        sim_p = dict(sim_k, comm_s=row["comm_s"] if row else None,
                     busy_s=row["busy_s"] if row else None)
        sim_ph.setdefault(p["phase"], {})[lay] = sim_p
        e = {k: _err(sim_p[k], meas[k]) for k in meas}
        err_ph.setdefault(p["phase"], {})[lay] = e
        errs[pss] += [abs(e[k]) for k in ("gemm_s", "attention_s") if e[k] is not None]
        errs_tl[pss] += [abs(e[k]) for k in ("comm_s", "busy_s") if e[k] is not None]
    st = streams or {"stream_busy_s": {"compute": g["compute_busy_s"],
                                       "comm": g["comm_busy_s"]},
                     "exposed_comm_s": g["exposed_comm_s"], "streams": None}
    meas_top = {"span_s": g["span_s"], "stream_busy_s": st["stream_busy_s"],
                "exposed_comm_s": st["exposed_comm_s"]}
    sim_top = {k: sim.get(k) if have else None for k in meas_top}
    err_top = {"span_s": _err(sim_top["span_s"], g["span_s"]),
               "stream_busy_s": None if not have else {
                   r: _err(sim_top["stream_busy_s"][r], v)
                   for r, v in st["stream_busy_s"].items()},
               "exposed_comm_s": _err(sim_top["exposed_comm_s"], st["exposed_comm_s"])}
    return {
        "measured": dict(meas_top, streams=st["streams"], trace_stream_busy_s={
            str(s["stream"]): s["busy_s"] for s in g["streams"]}, phases=meas_ph),
        "simulated": dict(sim_top, pair=(sim or {}).get("pair"), phases=sim_ph),
        "error": dict(err_top, phases=err_ph),
        "median_abs_error": _median([x for v in errs.values() for x in v]),
        "median_abs_error_by_pass": {k: _median(v) for k, v in errs.items()},
        "median_abs_error_timeline_by_pass": {k: _median(v) for k, v in errs_tl.items()},
        "compared": COMPARED if have else NO_PAIR + ((sim or {}).get("reason")
                                                     or "not simulated"),
        "tokens_per_rank": tokens, "units": "seconds; error = (simulated - measured) / measured",
    }


def _median(x: list[float]) -> float | None:
    return float(np.median(x)) if x else None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def text_table(doc: dict) -> str:
    lines = [f"{'phase':<12}{'layer':>6}{'what':>11}{'measured ms':>13}{'simulated ms':>14}"
             f"{'error':>9}"]
    for ph, layers in doc["measured"]["phases"].items():
        for lay, meas in layers.items():
            sim, err = doc["simulated"]["phases"][ph][lay], doc["error"]["phases"][ph][lay]
            comm_phase = ph.startswith(("dispatch", "combine"))
            for key in ("gemm_s", "attention_s", "comm_s", "busy_s"):
                if (meas[key] <= 0 and sim[key] in (None, 0.0)) or \
                        (key == "busy_s" and comm_phase):
                    continue
                lines.append(f"{ph:<12}{lay:>6}{key.removesuffix('_s'):>11}"
                             f"{meas[key] * 1e3:>13.3f}{_ms(sim[key]):>14}{_pct(err[key]):>9}")
    m, s, e = doc["measured"], doc["simulated"], doc["error"]
    rows = [("span", m["span_s"], s["span_s"], e["span_s"])]
    for r, v in m["stream_busy_s"].items():
        rows.append((f"{r} streams busy", v, (s["stream_busy_s"] or {}).get(r),
                     (e["stream_busy_s"] or {}).get(r)))
    rows.append(("exposed comm", m["exposed_comm_s"], s["exposed_comm_s"],
                 e["exposed_comm_s"]))
    lines.append(f"{'whole pair':<29}{'measured ms':>13}{'simulated ms':>14}{'error':>9}")
    for name, a, b, x in rows:
        lines.append(f"{name:<29}{_ms(a):>13}{_ms(b):>14}{_pct(x):>9}")
    if m.get("streams"):
        lines.append("measured streams: compute " + ", ".join(m["streams"]["compute"])
                     + "; communication " + ", ".join(m["streams"]["comm"]))
    med = doc["median_abs_error"]
    by = ", ".join(f"{k} {'n/a' if v is None else f'{v:.1%}'}"
                   for k, v in doc["median_abs_error_by_pass"].items())
    lines.append("median |error| of GEMM and attention kernel time: "
                 + ("n/a" if med is None else f"{med:.1%}") + f" (by pass: {by})")
    tl = doc["median_abs_error_timeline_by_pass"]
    if any(v is not None for v in tl.values()):
        lines.append("median |error| of per-phase busy and comm time by pass: " + ", ".join(
            f"{k} {'n/a' if v is None else f'{v:.1%}'}" for k, v in tl.items()))
    lines.append("compared: " + doc["compared"])
    return "\n".join(lines)
