"""Memory-bound kernels the reference code runs that the base inventory leaves out
(``ModelSpec.reference_kernels``, set when ``compute.memory_kernels`` is not ``stream``:
the inventory under ``stream`` stays as it was).

Each entry, with where the reference code runs it and the name DeepSeek's public profile
of a DualPipe F&B pair gives it (github.com/deepseek-ai/profile-data ``train.json``):

- ``routing_map`` (every MoE layer): the index kernels that build the permutation's row
  map from the top-k indices before the tokens are gathered: DeepSeek's
  ``get_fused_mapping`` (read the t·k int64 indices, write the int32 row of each copy and
  the experts' offsets) and ``clean_and_count_expert`` (read the indices, write the
  tokens per expert); Megatron-Core ``moe_utils.permute`` builds the same map
  (``routing_map.T``, ``argsort`` of it: NVIDIA/Megatron-LM
  ``megatron/core/transformer/moe/moe_utils.py``). Class ``permute``.
- ``fp8_act_cache`` (FP8 recipe with FP8 activations cached, ``memory.activation_dtype:
  fp8``): DeepSeek-V3 report §3.3.2, "Inputs of the SwiGLU Operator in MoE ... we cache
  the inputs of the SwiGLU operator and recompute its output in the backward pass. These
  activations are also stored in FP8": each routed expert's fc1 output is cast to FP8
  with 1×128 scales in the forward (the profile's ``per_token_cast_to_fp8`` over the
  experts' rows in ``mlp(F)``) and cast back to BF16 in the backward (``cast_back``);
  and §3.3.2's "Inputs of the Linear after the attention operator. These activations
  are also used in the backward pass of the attention operator" (the E5M6 cache the
  inventory already casts in the forward) are cast back for the attention's backward
  (``per_token_cast_back_special_fmt`` in ``attn(B)``). Class ``cast``.
- ``fp8_grad_dispatch`` (FP8 recipe with FP8 dispatch): report §3.3.3, "A similar
  strategy is applied to the activation gradient before MoE down-projections": in the
  backward the token gradients are cast to FP8 per token and the copies for the experts
  written in FP8 with their scales (the profile's ``expand_to_fused_with_scales`` in
  ``mlp(B)``), not in BF16.

- ``sort_chunks`` (Megatron's all-to-all dispatcher with more than one local expert):
  ``sort_chunks_by_idxs`` (NVIDIA/Megatron-LM 2ff0f099
  ``megatron/core/transformer/moe/token_dispatcher.py``, ``dispatch_postprocess`` and
  ``combine_preprocess`` of ``MoEAlltoAllTokenDispatcher``, run when
  ``num_local_experts > 1``; fused: Transformer Engine's ``moe_sort_chunks_by_index``):
  the rows the rank received, in (source rank, local expert) order, re-sorted into
  (local expert, source rank) order after the dispatch with their FP32 probabilities
  (read and write each BF16 row and its prob), and back before the combine (the rows
  only); the backward moves their gradients the same way. Listed with the
  permutation's ops (the rank's dispatched rows: the rows it receives under balanced
  routing). DeepSeek's code and Megatron's DeepEP (flex) dispatcher run no such kernel,
  so it is listed neither under ``deepseek`` nor with ``parallel.ep_backend: deepep``,
  nor in serving steps (vLLM's and SGLang's MoE layers order rows by expert
  themselves). Class ``permute``.

Each kernel's bytes are its tensors' sizes, priced as every ``memory`` kernel is
(``compute.memory_kernels``; no published rate by size exists for casts and the
permutation, so at the streaming rate).
"""

from __future__ import annotations

from moesim.compute.base import Kernel
from moesim.model.kernels.linear import CAST_TOKEN, cast_bytes
from moesim.model.kernels.make import FP8_ACT, mem

ROUTING_MAP = "routing_map"
FP8_ACT_CACHE = "fp8_act_cache"
FP8_GRAD_DISPATCH = "fp8_grad_dispatch"
SORT_CHUNKS = "sort_chunks"
NAMES = (ROUTING_MAP, FP8_ACT_CACHE, FP8_GRAD_DISPATCH, SORT_CHUNKS)
#: ``compute.memory_kernels: deepseek`` only: the kernels as DeepSeek's training code
#: launches them (moesim.model.kernels.deepseek), listed after the entries above
DEEPSEEK_LAUNCHES = "deepseek_launches"
INDEX_BYTES, ROW_BYTES, COUNT_BYTES = 8, 4, 4     # int64 top-k index, int32 row, int32 count
PROB_BYTES = 4                                     # FP32 routing probability
CACHE_CAST, CAST_BACK, ATTN_CAST_BACK = ("swiglu_input_cast_to_fp8", "cast_back",
                                         "per_token_cast_back_special_fmt")


def for_scenario(memory_kernels: str, precision: str, activation_dtype: str,
                 dispatch_dtype: str, megatron_sort: bool = False) -> tuple[str, ...]:
    """The entries a scenario's inventory lists: none under ``stream``; under
    ``deepseek`` also :data:`DEEPSEEK_LAUNCHES`; :data:`SORT_CHUNKS` where
    ``megatron_sort`` (Megatron's all-to-all dispatcher in a training step, more than
    one local expert) and not under ``deepseek``."""
    if memory_kernels == "stream":
        return ()
    fp8 = precision == "fp8"
    sort = megatron_sort and memory_kernels != "deepseek"
    return tuple(n for n, on in ((ROUTING_MAP, True),
                                 (FP8_ACT_CACHE, fp8 and activation_dtype == "fp8"),
                                 (FP8_GRAD_DISPATCH, fp8 and dispatch_dtype == "fp8"),
                                 (SORT_CHUNKS, sort),
                                 (DEEPSEEK_LAUNCHES, memory_kernels == "deepseek")) if on)


def on(spec, name: str) -> bool:
    return name in getattr(spec, "reference_kernels", ())


def routing_map(spec, assignments: int) -> list[Kernel]:
    """Forward: the row map of ``assignments`` = tokens × top-k copies and the tokens per
    expert, before the gather."""
    if not on(spec, ROUTING_MAP) or assignments <= 0:
        return []
    a, e = assignments, spec.n_experts
    return [mem("get_fused_mapping", a * (INDEX_BYTES + ROW_BYTES) + e * COUNT_BYTES, "fwd",
                "permute"),
            mem("clean_and_count_expert", a * INDEX_BYTES + e * COUNT_BYTES, "fwd", "permute")]


def sort_chunks(spec, rows: int, phase: str, probs: bool) -> list[Kernel]:
    """Megatron's ``sort_chunks_by_idxs`` over ``rows`` received rows: each BF16 row (and,
    with ``probs``, its FP32 probability: the sort after the dispatch) read and written;
    ``phase`` ``fwd`` or ``dgrad`` (the gradients, the same bytes)."""
    if not on(spec, SORT_CHUNKS) or rows <= 0:
        return []
    nbytes = 2 * (2 * spec.hidden + (PROB_BYTES if probs else 0)) * rows
    return [mem("sort_chunks_by_idxs", nbytes, "fwd" if phase == "fwd" else "dgrad",
                "permute")]


def swiglu_cache(spec, rows: int, width: int, phase: str, fp8: bool) -> list[Kernel]:
    """A routed expert's SwiGLU input (rows × width, width = 2·ffn) cast to FP8 for the
    backward (``fwd``), and cast back to BF16 there (``dgrad``)."""
    if not (fp8 and on(spec, FP8_ACT_CACHE)) or rows <= 0:
        return []
    if phase == "fwd":
        return [mem(CACHE_CAST, cast_bytes(rows, width), "fwd", "cast")]
    return [mem(CAST_BACK, cast_bytes(rows, width), "dgrad", "cast")]


def attention_cast_back(spec, tokens: int, width: int, fp8: bool) -> list[Kernel]:
    """The attention output's FP8 cache cast back to BF16 for the attention backward."""
    if not (fp8 and on(spec, FP8_ACT_CACHE)) or tokens <= 0:
        return []
    return [mem(ATTN_CAST_BACK, cast_bytes(tokens, width), "dgrad", "cast")]


def fp8_grad_unpermute(spec, assignments: int, out_tokens: int) -> list[Kernel] | None:
    """The unpermute's backward with FP8 gradients: the token gradients cast to FP8, then
    written to every copy in FP8 with scales (plus the int32 row map); None when off."""
    fp8 = getattr(spec, "precision", "bf16") == "fp8"
    if not (fp8 and on(spec, FP8_GRAD_DISPATCH)) or assignments <= 0:
        return None
    h = spec.hidden
    expand = FP8_ACT * (out_tokens + assignments) * h + ROW_BYTES * assignments
    return [mem(CAST_TOKEN, cast_bytes(out_tokens, h), "dgrad", "cast"),
            mem("unpermute_bwd", expand, "dgrad", "permute")]


__all__ = ["DEEPSEEK_LAUNCHES", "NAMES", "attention_cast_back", "for_scenario", "fp8_grad_unpermute",
           "on", "routing_map", "sort_chunks", "swiglu_cache"]
