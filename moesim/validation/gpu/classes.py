"""A GPU trace against a scenario, kernel class by kernel class and pass by pass.

Measured: the kernels launched under the trace's per-layer annotations (DualPipe's
``attn(F)``, ``mlp(F)``, ``attn(B)``, ``mlp(B)``, ``attn(W)``, ``mlp(W)``), compute
kernels only (the ``dispatch``/``combine`` annotations and communication kernels are
compared elsewhere), summed by class and pass (F, B, W) over the annotations and divided
by the number of layers traced: mean kernel time per layer. Classes are those of
:mod:`moesim.validation.gpu.kernel_names`, with the token permutation around the expert
exchange taken out of ``elementwise``/``other`` by name (``permute``: Megatron's
``moe_permute``/``moe_unpermute``, DeepSeek's ``expand_to_fused``, ``get_fused_mapping``,
``clean_and_count_expert``, ``reduce_fused``).

Measured time of a class is the time its kernels keep the GPU busy (the union of their
intervals), not the sum of their durations: DeepSeek's framework runs half the routed
experts' weight-gradient GEMMs on a second stream beside the first (the profile's
``mlp(W)``; DeepGEMM's own k-grouped weight-gradient kernel "utilizes 2 streams",
deepseek-ai/DeepGEMM issue #125), and two GEMMs sharing the SMs each take longer
while together taking the GPU time of both. On one stream the two are the same.

Simulated: one layer's kernels in each pass (:mod:`moesim.program.inventory`: fwd =
F, dgrad = B, wgrad = W), priced by the compute model, grouped the same way: GEMMs
(every GEMM kind, the router's included), attention (flash attention and its pre/post
kernels), cast (FP8 quantisation), norm, elementwise (activations, residual adds, rotary
and head-layout copies, the router's score/top-k, transposes), permute.
"""

from __future__ import annotations

import re
from typing import Any

from moesim.compute.sm_share import OnSms, pair_sms
from moesim.program.inventory import layer_ops
from moesim.validation.gpu.summary import length, union

CLASSES = ("gemm", "attention", "cast", "norm", "elementwise", "permute", "other")
PASS_OF = {"F": "fwd", "B": "dgrad", "W": "wgrad"}
_PHASE_RE = re.compile(r"(attn|mlp)\(([FBW])\)")
_PERMUTE_RE = re.compile(r"permute|expand_to_fused|get_fused_mapping|clean_and_count_expert|"
                         r"reduce_fused", re.IGNORECASE)
GEMM_KINDS = ("gemm", "grouped_gemm", "kgrouped_gemm")


def measured_class(name: str, cls: str) -> str:
    """The comparison class of a traced compute kernel (its gpu_kernels class, permute
    kernels by name); ``""`` for communication."""
    if cls == "comm":
        return ""
    if _PERMUTE_RE.search(name):
        return "permute"
    if cls in ("memcpy", "memset"):
        return "elementwise"
    return cls if cls in CLASSES else "other"


def simulated_class(k: Any) -> str:
    """The comparison class of a simulated kernel."""
    if k.kind in GEMM_KINDS:
        return "gemm"
    if k.name == "batched_transpose":     # the trace's classifier: transposes are elementwise
        return "elementwise"
    if k.kclass in ("gemm", "attention", "cast", "norm", "permute"):
        return k.kclass
    if k.kclass in ("elementwise", "router"):
        return "elementwise"
    return "other"


def measured(tr: Any) -> tuple[dict[str, dict[str, float]], int]:
    """({pass: {class: seconds per layer}}, layers traced) from a GPU trace."""
    spans: dict[str, dict[str, list]] = {p: {} for p in PASS_OF}
    layers: dict[str, set] = {p: set() for p in PASS_OF}
    for k in tr.kernels:
        m = _PHASE_RE.fullmatch(k.phase.name) if k.phase is not None else None
        if not m:
            continue
        c = measured_class(k.name, k.cls)
        if not c:
            continue
        p = m.group(2)
        layers[p].add(k.phase.index)
        spans[p].setdefault(c, []).append((k.start_s, k.start_s + k.dur_s))
    sums = {p: {c: length(union(iv)) for c, iv in d.items()} for p, d in spans.items()}
    n = max((len(v) for v in layers.values()), default=0)
    return ({p: {c: v / max(len(layers[p]), 1) for c, v in d.items()} for p, d in sums.items()},
            n)


def simulated(res: Any, model: Any, layer: int | None = None) -> dict[str, dict[str, float]]:
    """{pass: {class: seconds}} of one layer (default: the first MoE layer) on ``model``."""
    spec = res.model
    if layer is None:
        layer = next((i for i in range(spec.layers) if spec.is_moe_layer(i)), 0)
    out: dict[str, dict[str, float]] = {}
    for p, name in PASS_OF.items():
        d: dict[str, float] = {}
        for o in layer_ops(res, layer, name):
            for k in o.kernels:
                c = simulated_class(k)
                d[c] = d.get(c, 0.0) + model.time_s(k)
        out[p] = d
    return out


_ATTN_PART = ("attention", "norm", "router", "rotary", "_copy_tensor", "direct_copy")


def recompute_kernels(res: Any, layer: int | None = None) -> dict[str, list]:
    """{"attn": [...], "mlp": [...]}: the forward kernels the scenario's activation
    recomputation re-runs in one MoE layer's backward (op ``bwd.recompute`` of
    ``moesim kernels``), by the part whose backward annotation launches them (DeepSeek's
    profile runs the recomputed MLA up-projections under ``attn(B)``)."""
    spec = res.model
    if layer is None:
        layer = next((i for i in range(spec.layers) if spec.is_moe_layer(i)), 0)
    out: dict[str, list] = {"attn": [], "mlp": []}
    for o in layer_ops(res, layer, "dgrad"):
        if o.op != "bwd.recompute":
            continue
        for k in o.kernels:
            base = k.name.removeprefix("recompute.")
            out["attn" if base.startswith(_ATTN_PART) else "mlp"].append(k)
    return out


def pair_model(res: Any, model: Any) -> Any:
    """``model`` priced on the SMs an overlapped DualPipe pair leaves compute
    (:func:`moesim.compute.sm_share.pair_sms`: the device's less the EP kernels'), as
    the traced kernels ran; ``model`` itself when the scenario has no such pair."""
    sms = pair_sms(res)
    return model if sms is None else OnSms(model, sms)


def compare(tr: Any, res: Any, model: Any) -> dict:
    """Per pass and class: measured and simulated seconds per layer, error."""
    meas, n = measured(tr)
    sim = simulated(res, model)
    rows = []
    for p in PASS_OF:
        for c in CLASSES:
            a, b = meas[p].get(c, 0.0), sim[p].get(c, 0.0)
            if a <= 0 and b <= 0:
                continue
            rows.append({"pass": p, "class": c, "measured_s": a, "simulated_s": b,
                         "error": (b - a) / a if a > 0 else None})
        a, b = sum(meas[p].values()), sum(sim[p].values())
        rows.append({"pass": p, "class": "all compute", "measured_s": a, "simulated_s": b,
                     "error": (b - a) / a if a > 0 else None})
    return {"layers_traced": n, "rows": rows,
            "compared": "mean kernel time per layer by pass (F forward, B input gradient, "
                        "W weight gradient) and class; simulated: one layer's kernels "
                        "(moesim kernels), balanced routing"}


def class_table(doc: dict) -> list[str]:
    lines = [f"{'pass':<6}{'class':<14}{'measured ms':>13}{'simulated ms':>14}{'error':>9}"]
    for r in doc["rows"]:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        lines.append(f"{r['pass']:<6}{r['class']:<14}{r['measured_s'] * 1e3:>13.3f}"
                     f"{r['simulated_s'] * 1e3:>14.3f}{err:>9}")
    return lines
