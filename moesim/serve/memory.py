"""Memory of a serving rank: weights of every expert it holds, the KV cache, activations,
what is free, and the largest batch that fits. Pure arithmetic, bytes throughout.

- weights: the rank's parameters (:func:`moesim.memory.model.rank_params`, one pipeline
  stage holding every layer, embedding and head) × ``weight_bytes``: every local expert is
  resident though a token uses a few;
- KV cache: a TP group serves ``tp · batch_per_gpu`` requests, each caching
  ``kv_tokens`` tokens of :func:`moesim.serve.kv.kv_bytes_per_token` on every rank (GQA
  heads split over TP, MLA's latent not), a sliding-window layer only its last ``window``
  (:func:`moesim.serve.kv.kv_bytes_per_request`);
- activations: per micro-batch alive (two with two-micro-batch overlap) the tensors a
  forward keeps for its largest layer (:func:`moesim.memory.model.layer_activation_bytes`
  with FlashAttention's ``selective`` rule: no score matrix; an upper bound on inference's
  working set, which frees a layer's tensors when the next starts), the routed-token
  dispatch/combine buffers of one layer, and the fp32 logits of the head's slice.

The largest batch is the largest ``batch_per_gpu`` whose table fits the device
(:func:`largest_batch`, by bisection over the same table).
"""

from __future__ import annotations

from moesim.gating.eplb_placement import experts_held
from moesim.memory.checkpoint import checkpoint_spec
from moesim.memory.model import ACT_BYTES, layer_activation_bytes, rank_params
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve.kv import kv_bytes_per_request, kv_bytes_per_token

FP32_BYTES = 4
#: bisection bound on batch_per_gpu (no device holds 2^24 requests per GPU)
MAX_BATCH = 1 << 24


def weight_bytes(spec, tp: int, ep: int, experts: int | None = None) -> float:
    """``experts``: routed experts the rank holds per MoE layer, EPLB's redundant
    replicas included (None: E / ep)."""
    dense, expert = rank_params(spec, range(spec.layers), tp=tp, ep=ep, first=True, last=True,
                                experts_per_rank=experts)
    return float(spec.weight_bytes * (dense + expert))


def table(spec, cfg: ServeConfig, capacity: float, batch: int | None = None,
          received: float | None = None, experts: int | None = None) -> dict:
    """The memory table of one rank at ``batch`` requests per GPU (default the
    configuration's); ``received``: routed tokens the rank's experts get in its most
    loaded MoE layer per micro-batch (default balanced: the tokens it sends × top_k);
    ``experts``: routed experts it holds per MoE layer (:func:`weight_bytes`)."""
    b = cfg.batch_per_gpu if batch is None else batch
    tp, m = cfg.tp, cfg.microbatches
    per = cfg.prompt if cfg.phase == "prefill" else 1
    requests = b * tp                                  # per TP group
    mb_tokens = -(-requests * per // m)
    mb_requests = -(-requests // m)
    k = spec.top_k if spec.moe else 0
    sent = -(-mb_tokens // tp) * k
    recv = float(sent if received is None else received)
    act_layer = max((layer_activation_bytes(spec, i, mb_tokens, per, tp, "selective", recv)
                     for i in range(spec.layers)), default=0.0)
    buffers = (sent + recv) * spec.hidden * 2 * ACT_BYTES if spec.moe else 0.0
    logits = mb_requests * -(-spec.vocab // tp) * FP32_BYTES
    activations = m * (act_layer + buffers + logits)
    kv_req = float(kv_bytes_per_request(spec, cfg.kv_tokens, cfg.kv_bytes, tp))
    kv_total = kv_req * requests
    w = weight_bytes(spec, tp, cfg.ep, experts)
    used = w + kv_total + activations
    return {"batch_per_gpu": b, "weights_bytes": w, "kv_per_token_bytes":
            float(kv_bytes_per_token(spec, cfg.kv_bytes, tp)), "kv_tokens_per_request":
            cfg.kv_tokens, "kv_per_request_bytes": kv_req, "kv_requests": requests,
            "kv_total_bytes": kv_total, "activations_bytes": activations,
            "used_bytes": used, "capacity_bytes": float(capacity),
            "free_bytes": float(capacity) - used, "fits": used <= capacity}


def largest_batch(spec, cfg: ServeConfig, capacity: float, experts: int | None = None) -> int:
    """Largest ``batch_per_gpu`` whose :func:`table` fits (0: not even one request)."""
    def fits(b: int) -> bool:
        return table(spec, cfg, capacity, b, experts=experts)["fits"]

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi < MAX_BATCH and fits(hi):
        lo, hi = hi, hi * 2
    if hi >= MAX_BATCH and fits(hi):
        return hi
    while hi - lo > 1:              # lo fits, hi does not
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def serve_memory(res, cfg: ServeConfig, rank_received=None) -> dict:
    """Per-rank tables (with each rank's most loaded MoE layer's received tokens per
    micro-batch, ``rank_received`` (world, moe layers)) and the largest batch, in the
    shape of the training summary's ``memory`` (``per_rank``, ``capacity_bytes``,
    ``peak_bytes_max``, ``oom``)."""
    spec = checkpoint_spec(res.model, res.scenario.compute)   # quantised / 2:4 weights
    cap = float(getattr(res.device, "hbm_bytes", float("inf")))
    rt, held = res.routing, None     # EPLB's redundant replicas: their weights too
    if spec.moe and (rt.placement is not None or rt.replicate):
        held = experts_held(rt, n_experts=spec.n_experts, ep=cfg.ep,
                            source=res.scenario.source)
    rows = []
    for r in range(res.layout.world):
        recv = None
        if rank_received is not None and rank_received.shape[1]:
            recv = float(rank_received[r].max())
        t = table(spec, cfg, cap, received=recv, experts=held)
        rows.append({"rank": r, "peak_bytes": t["used_bytes"], "oom": not t["fits"],
                     "free_bytes": t["free_bytes"],
                     "by_category": {"weights": t["weights_bytes"],
                                     "kv_cache": t["kv_total_bytes"],
                                     "activations": t["activations_bytes"]}})
    base = table(spec, cfg, cap, experts=held)
    worst = max(rows, key=lambda x: x["peak_bytes"])
    return {
        "weights_bytes": base["weights_bytes"],
        "kv_per_token_bytes": base["kv_per_token_bytes"],
        "kv_per_request_bytes": base["kv_per_request_bytes"],
        "kv_total_bytes": base["kv_total_bytes"],
        "activations_bytes": worst["by_category"]["activations"],
        "free_bytes": worst["free_bytes"],
        "capacity_bytes": cap,
        "largest_batch_per_gpu": largest_batch(spec, cfg, cap, held),
        "peak_bytes_max": worst["peak_bytes"],
        "oom": any(x["oom"] for x in rows),
        "per_rank": rows,
    }
