"""Do the RL pools fit in device memory? One :class:`moesim.memory.fit.Fit` per placement.

- **Trainer** (:func:`trainer_fit`): the trainer pool's layout (``rl.train``: tp, pp, ep,
  ``zero``, rows of ``train.seq_len`` tokens, one row per micro-batch) priced exactly as
  ``moesim memory`` prices a training layout (:func:`moesim.memory.report.memory_table`:
  weights, gradients, optimizer states, activations alive at the stage's peak of the
  schedule, token buffers, recompute workspace), on the scenario the trainer's steps are
  simulated on (:func:`moesim.rl.engine_costs.trainer_scenario`), with as many
  micro-batches as the largest mini-batch gives one data-parallel replica. The peak is the
  largest over the pipeline stages (balanced routing). ``rl.train.zero`` shards what the
  frameworks shard: Megatron's distributed optimizer is ZeRO stage 1 (optimizer states
  over the data-parallel group), FSDP's full sharding stage 3 (docs/rl.md).
- **Rollout engine** (:func:`rollout_fit`): one GPU of an engine replica holds its share
  of the weights (:func:`replica_weight_bytes`), the KV cache the engine is
  given (``kv_fraction`` of the device less the weights, as :func:`moesim.rl.run.
  kv_capacity` sizes it, allocated up front as vLLM does) and the activations of its
  largest step: a decode step of ``max_batch`` sequences per attention-DP rank
  (:func:`moesim.serve.memory.table`'s activations: the largest layer's tensors, the
  routed tokens' buffers and the head's fp32 logits).

Colocated pools run the phases in turn (the switch offloads one side), so each side is
checked on its own.
"""

from __future__ import annotations

import math

from moesim.memory.fit import Fit
from moesim.memory.model import rank_params
from moesim.rl.packing import pack_rows, split_mini_batches


def replica_weight_bytes(spec, ro) -> float:
    """Weights on one GPU of an engine replica: dense layers split over TP, experts over
    EP, or over TP when EP is 1 (vLLM's fused MoE shards every expert over the TP group
    unless expert parallelism is enabled). ``rl.rollout.precision: fp8``: one byte per
    weight (:mod:`moesim.rl.rollout_fp8`; the bf16 embedding, head and norms are counted
    at one byte too, under 0.3 % of DeepSeek-V3's)."""
    dense, expert = rank_params(spec, range(spec.layers), tp=ro.tp, ep=ro.ep, first=True,
                                last=True, etp=ro.tp if ro.ep == 1 else 1)
    wb = 1 if getattr(ro, "precision", "bf16") == "fp8" else spec.weight_bytes
    return float(wb * (dense + expert))


#: bytes per trainer weight a reference swap copies: the module's bf16 parameters
SWAP_PARAM_BYTES = 2


def stage_params(spec, tr):
    """(dense, expert) parameters one GPU of each pipeline stage of the trainer's layout
    ``tr`` (``rl.train``) holds, the layers split evenly over the stages, dense parts
    over TP, experts over EP."""
    per = -(-spec.layers // tr.pp)
    for s in range(tr.pp):
        layers = range(s * per, min(spec.layers, (s + 1) * per))
        yield rank_params(spec, layers, tp=tr.tp, ep=tr.ep, first=s == 0,
                          last=s == tr.pp - 1)


def trainer_weight_bytes(spec, tr) -> float:
    """Weights (bf16) on the busiest GPU of the trainer's layout ``tr``: the largest
    pipeline stage of an even split (:func:`stage_params`)."""
    return max(dense + expert for dense, expert in stage_params(spec, tr)) * SWAP_PARAM_BYTES


def reference_swap_s(spec, tr, host_Bps: float, out_Bps: float | None = None,
                     in_Bps: float | None = None) -> float:
    """Seconds a reference pass spends moving weights when ``rl.train.reference_weights``
    is ``host`` (NeMo RL's ``use_reference_model``): the policy's weights to the host,
    the reference's in, the policy's back: three copies of the GPU's weights over its
    host link, in series. ``out_Bps`` / ``in_Bps``: the copy out and the two in at those
    rates where below the link's (every GPU of the host copying at once, pinned memory:
    :func:`moesim.rl.offload_pinned.sleep_Bps`, :func:`moesim.rl.refit_wake.wake_Bps`)."""
    if tr.reference_weights != "host":
        return 0.0
    w = trainer_weight_bytes(spec, tr)
    out = min(host_Bps, out_Bps) if out_Bps else host_Bps
    into = min(host_Bps, in_Bps) if in_Bps else host_Bps
    return w / out + 2 * w / into


def max_microbatches(setup, batches) -> int:
    """Micro-batches (rows) the busiest data-parallel replica of the trainer gets in the
    largest mini-batch of ``batches``."""
    tr = setup.cfg.train
    most = 1
    for b in batches:
        lengths = b.prompt + b.response
        for ix in split_mini_batches(len(lengths), tr.mini_batches):
            most = max(most, math.ceil(pack_rows(lengths[ix], setup.seq_len) / tr.dp))
    return most


def trainer_table(setup, microbatches: int) -> dict:
    """``moesim memory``'s table of the trainer's layout with ``microbatches`` rows."""
    from moesim.memory.report import memory_table
    from moesim.rl.engine_costs import trainer_scenario_of
    from moesim.wiring import resolve

    tr = setup.cfg.train
    m = microbatches
    if setup.scenario.schedule.kind == "interleaved":
        m = math.ceil(m / tr.pp) * tr.pp
    return memory_table(resolve(trainer_scenario_of(setup, m)))


def loss_extra_bytes(setup) -> float:
    """Bytes NeMo RL's loss log-probs hold on a last-stage GPU beyond the fp32 logits the
    memory table counts (``rl.train.loss_logprob: nemo``, :mod:`moesim.rl.loss`): the
    saved fp32 softmax and the backward's int64 one-hot of one micro-batch, 12 bytes
    per logits element; 0 otherwise."""
    from moesim.rl.loss import elements, loss_bytes

    tr = setup.cfg.train
    if tr.loss_logprob != "nemo":
        return 0.0
    v = setup.res.model.vocab
    return loss_bytes(setup.seq_len, v, tr.tp, tr.cp) - 4.0 * elements(setup.seq_len, v,
                                                                       tr.tp, tr.cp)


def trainer_fit(setup, batches) -> Fit:
    table = trainer_table(setup, max_microbatches(setup, batches))
    extra = loss_extra_bytes(setup)
    last = len(table["stages"]) - 1
    host_optimizer = setup.cfg.train.optimizer == "cpu"
    for r in table["stages"]:
        if r["stage"] == last and extra:
            r["peak_bytes"] += extra
        if host_optimizer:      # the states live in host memory (moesim.rl.cpu_optimizer)
            r["peak_bytes"] -= r["optimizer"]
    worst = max(table["stages"], key=lambda r: r["peak_bytes"])
    tr = setup.cfg.train
    what = (f"trainer (tp {tr.tp} pp {tr.pp} ep {tr.ep}"
            + (f" cp {tr.cp}" if tr.cp > 1 else "") + f", ZeRO-{tr.zero}"
            + (", optimizer on the host" if host_optimizer else "")
            + (f", stage {worst['stage']}" if tr.pp > 1 else "") + ")")
    return Fit(what, worst["peak_bytes"], worst["capacity_bytes"])


def rollout_need(setup) -> dict:
    """Bytes on one GPU of a rollout engine replica: weights, KV cache, activations."""
    from moesim.scenario.sections.serve import ServeConfig
    from moesim.serve.memory import table

    ro, spec, dev = setup.cfg.rollout, setup.res.model, setup.res.device
    weights = replica_weight_bytes(spec, ro)
    kv = max(ro.kv_fraction * dev.hbm_bytes - weights, 0.0)
    per_gpu = -(-ro.max_batch // ro.tp)      # a TP group runs max_batch sequences
    cfg = ServeConfig(phase="decode", batch_per_gpu=per_gpu, prompt=1, context=1, output=1,
                      tp=ro.tp, ep=ro.ep, kv_dtype=ro.kv_dtype)
    acts = table(spec, cfg, dev.hbm_bytes)["activations_bytes"]
    return {"weights": weights, "kv_cache": kv, "activations": acts,
            "total": weights + kv + acts}


def rollout_fit(setup) -> Fit:
    ro = setup.cfg.rollout
    need = rollout_need(setup)["total"]
    w8 = ", fp8 weights" if getattr(ro, "precision", "bf16") == "fp8" else ""
    return Fit(f"rollout engine (tp {ro.tp} ep {ro.ep}{w8}, kv_fraction {ro.kv_fraction:g})",
               need, setup.res.device.hbm_bytes)


def rl_fits(setup, batches) -> list[Fit]:
    """The trainer's and the rollout engines' verdicts."""
    return [trainer_fit(setup, batches), rollout_fit(setup)]
