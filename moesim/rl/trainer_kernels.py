"""Kernels Megatron-Core's trainer runs that the RL trainer's resolved scenarios leave out
(``rl.train.sort_chunks``).

An RL trainer's training step and log-prob passes are priced on scenarios built for
them (:func:`moesim.rl.engine_costs.trainer_scenario`, a serving prefill for the passes),
which :func:`moesim.wiring.resolve` treats as not-a-training-step: it lists
``sort_chunks_by_idxs`` only for a plain training scenario
(:mod:`moesim.model.kernels.reference`). Megatron-Core's all-to-all dispatcher runs it in
every MoE layer with more than one local expert, in the forward and in the backward,
whatever calls the model (NVIDIA/Megatron-LM 2ff0f099, the commit NeMo RL v0.3.0 pins,
``megatron/core/transformer/moe/token_dispatcher.py``: ``MoEAlltoAllTokenDispatcher``
``dispatch_postprocess`` and ``combine_preprocess``, with ``moe_permute_fusion`` TE's
``moe_sort_chunks_by_index``). :func:`with_sort_chunks` adds it to a resolved trainer
scenario when ``rl.train.sort_chunks`` is on, under the conditions a training scenario
has (the NCCL all-to-all, more than one local expert, ``compute.memory_kernels`` neither
``stream`` nor ``deepseek``). Pure.
"""

from __future__ import annotations

import dataclasses

from moesim.model.kernels.reference import SORT_CHUNKS


def sort_chunks_on(scn) -> bool:
    """``rl.train.sort_chunks`` of an RL scenario (False without an ``rl`` section)."""
    rl = getattr(scn, "rl", None)
    return bool(getattr(getattr(rl, "train", None), "sort_chunks", False))


def with_sort_chunks(res):
    """``res`` (a :class:`moesim.scenario.resolved.Resolved` trainer scenario) with
    Megatron's ``sort_chunks_by_idxs`` in its kernels where ``rl.train.sort_chunks`` is on
    and Megatron's dispatcher would run it; ``res`` itself otherwise."""
    scn, model = res.scenario, res.model
    local = getattr(model, "n_experts", 0) // max(scn.parallel.ep, 1)
    refs = tuple(getattr(model, "reference_kernels", ()) or ())
    if (not sort_chunks_on(scn) or scn.parallel.ep_backend.kind != "nccl" or local <= 1
            or scn.compute.memory_kernels in ("stream", "deepseek") or SORT_CHUNKS in refs):
        return res
    return dataclasses.replace(res, model=dataclasses.replace(
        model, reference_kernels=refs + (SORT_CHUNKS,)))
