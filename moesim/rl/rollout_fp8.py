"""FP8 rollout weights as NeMo RL runs them (``rl.rollout.precision: fp8``).

NeMo RL's vLLM generation with ``vllm_cfg.precision: "fp8"`` (NVIDIA-NeMo/RL v0.6.0,
5fb588932, ``nemo_rl/models/generation/vllm/quantization/fp8.py``) starts vLLM with a
block-scaled FP8 quantisation config (``FP8_BLOCK_QUANT_KWARGS``: ``weight_block_size``
[128, 128], dynamic activation scales), so every linear layer's weight lives on the engine
in FP8 with one FP32 scale per 128 x 128 block. The trainer stays in its own precision
and sends bf16 weights at every refit; the engine casts them:

- **Generation.** The engine's GEMMs run block-scaled FP8 (``use_deep_gemm: true``:
  DeepGEMM, the kernels ``compute.precision: fp8`` prices) and read one byte per weight
  (``model.weight_bytes: 1``, as the FP8 serving scenarios set it): :func:`rollout_scenario`.
  The weights take one byte per parameter of the engine's memory, so more is left to the
  KV cache (:func:`moesim.rl.memory.replica_weight_bytes`).
- **The cast at every refit** (``load_weights``, both refit paths: "the fp8 load_weights
  additionally casts bf16 weights into fp8", ``vllm_backend.py``): for each received tensor
  that is an FP8 weight (``_is_fp8_weight``: a ``LinearBase`` module's or a ``FusedMoE``'s
  weight, so every routed expert's, whether or not the rank holds that expert),
  ``cast_tensor_to_fp8_blockwise(v.to(torch.float))`` runs as eager PyTorch ops over the
  whole tensor, before vLLM's weight loader keeps the rank's shard. Its kernels
  (:data:`CAST_OPS`) and the bytes they move per element (:data:`CAST_BYTES`) are read
  from the function; the per-block ops on ``blk_m x blk_n`` scales are counted as kernels
  and not as bytes (1/16,384 of the tensor). Every FP8 weight then enters
  ``model.load_weights`` with its ``_scale_inv`` tensor: two entries where bf16 had one
  (:func:`load_entries`), and the engine's share is copied at one byte per element.

Simplified: NeMo RL's DeepSeek-V3 recipe keeps the layers named ``a_proj``/``b_proj``
(MLA's four low-rank projections, 0.6 % of the weights) in bf16
(``quantization_ignored_layer_kws``); moesim casts and prices them as FP8. The routers
(vLLM builds them without a quantisation config) and the embedding and LM head stay bf16.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from moesim.model.params import attention_params, layer_params
from moesim.model.read import parse as parse_model
from moesim.model.spec import ModelSpec
from moesim.program.host_dispatch import EAGER_OP_S

#: the kernels ``cast_tensor_to_fp8_blockwise(v.to(torch.float))`` launches per tensor
#: (fp8.py at v0.6.0, ``use_weight_pow2_scale`` False, a shape divisible by 128): ``to``
#: float, ``contiguous`` of the block permute, ``abs``, ``amax``, ``max_abs / max_dtype``
#: (the descale), ``max_dtype / max_abs``, ``max_abs == 0``, ``where``, ``max_abs ==
#: inf``, ``where``, ``reciprocal``, ``data_hp * scale_fp``, ``clamp``, ``to`` FP8 and the
#: ``reshape`` of the un-permuted blocks (a copy); the reshapes, permutes, ``flatten``,
#: slice and ``squeeze`` are views
CAST_OPS = 15
#: HBM bytes per element those kernels move: ``to`` float (read 2, write 4),
#: ``contiguous`` (4 + 4), ``abs`` (4 + 4), ``amax`` (read 4), the multiply (4 + 4),
#: ``clamp`` (4 + 4), ``to`` FP8 (4 + 1) and the un-permuting copy (1 + 1)
CAST_BYTES = 6 + 8 + 8 + 4 + 8 + 8 + 5 + 2
#: elements per FP32 scale: one per 128 x 128 block (``weight_block_size``)
BLOCK_ELEMENTS = 128 * 128
SCALE_BYTES = 4


def rollout_scenario(scn, precision: str):
    """The scenario the rollout engines are priced on: ``fp8`` sets the GEMMs to FP8
    (``compute.precision``) and the weights to one byte (``model.weight_bytes``); ``bf16``
    runs the GEMMs in bf16 whatever the trainer's ``compute.precision`` (NeMo RL's
    default: an FP8 trainer beside bf16 engines), the scenario otherwise as written."""
    from moesim.compute.select import parse as parse_compute

    if precision != "fp8":
        if scn.compute.precision != "fp8":
            return scn
        return dataclasses.replace(scn, compute=parse_compute(
            {**scn.compute.as_dict(), "precision": "bf16"}, scn.source))
    compute = parse_compute({**scn.compute.as_dict(), "precision": "fp8"}, scn.source)
    model = parse_model({**scn.model.as_dict(), "weight_bytes": 1}, scn.source)
    return dataclasses.replace(scn, compute=compute, model=model)


def _attention_linear(spec: ModelSpec) -> tuple[int, int]:
    """(tensors, elements) of one layer's attention projections: MLA's q_a (with a
    q LoRA rank), q_b, kv_a, kv_b and o, their two norms left out; q, k, v and o
    otherwise (attention sinks left out)."""
    a = attention_params(spec)
    if spec.attention == "mla":
        norms = spec.kv_lora_rank + (spec.q_lora_rank or 0)
        return (5 if spec.q_lora_rank else 4), a.total - norms
    return 4, a.total - (spec.heads if spec.attention_sinks else 0)


def fp8_weights(spec: ModelSpec) -> tuple[int, int]:
    """(tensors, elements) of the checkpoint's FP8 weights (module docstring): every
    attention projection and every routed, shared or dense FFN matrix."""
    at, ae = _attention_linear(spec)
    tensors = elements = 0
    for i in range(spec.layers):
        lp = layer_params(spec, i)
        moe = spec.is_moe_layer(i)
        tensors += at + ((spec.n_experts + spec.n_shared_experts) if moe else 1
                         ) * spec.ffn_matrices
        elements += ae + lp.routed_experts + lp.shared_experts + lp.dense_ffn
    return tensors, elements


@dataclass(frozen=True)
class Fp8Cast:
    """One engine GPU's cast of the whole model's FP8 weights at one refit."""

    tensors: int          # FP8 weight tensors cast
    elements: int         # their elements
    host_s: float         # tensors x CAST_OPS eager ops on the host
    gpu_s: float          # their bytes at HBM bandwidth and a launch each
    time_s: float         # the longer of the two (the ops queue ahead of the GPU)

    def as_dict(self) -> dict:
        return asdict(self)


def fp8_cast(spec: ModelSpec, hbm_Bps: float, launch_s: float) -> Fp8Cast:
    """The cast each engine GPU runs over every FP8 weight of ``spec`` it receives (the
    whole model: both NeMo RL refit paths hand each engine GPU every tensor)."""
    tensors, elements = fp8_weights(spec)
    ops = tensors * CAST_OPS
    host = ops * EAGER_OP_S
    gpu = elements * CAST_BYTES / hbm_Bps + ops * launch_s
    return Fp8Cast(tensors, elements, host, gpu, max(host, gpu))


def load_entries(spec: ModelSpec, tensors: int, precision: str) -> int:
    """Entries ``model.load_weights`` takes for ``tensors`` received tensors: each FP8
    weight brings its ``_scale_inv`` beside it."""
    return tensors + (fp8_weights(spec)[0] if precision == "fp8" else 0)


def loaded_bytes(spec: ModelSpec, nbytes: float, precision: str) -> float:
    """Bytes the engine's weights take of ``nbytes`` bf16 bytes received: the FP8 weights
    at one byte and a four-byte scale per 128 x 128 block, the rest as received."""
    if precision != "fp8":
        return nbytes
    e = fp8_weights(spec)[1]
    return nbytes - 2 * e + e + e / BLOCK_ELEMENTS * SCALE_BYTES


def engine_load_s(spec: ModelSpec, tensors: int, nbytes: float, replica_gpus: int,
                  per_tensor_s: float, hbm_Bps: float, precision: str,
                  launch_s: float) -> float:
    """One engine GPU's ``load_weights`` of a refit: ``per_tensor_s`` per loaded entry
    (:func:`load_entries`), its share of the ``nbytes`` model (:func:`loaded_bytes`) read
    and written once at HBM bandwidth, and with ``precision`` fp8 the cast of every FP8
    weight (:func:`fp8_cast`)."""
    load = (load_entries(spec, tensors, precision) * per_tensor_s
            + 2 * loaded_bytes(spec, nbytes, precision) / replica_gpus / hbm_Bps)
    if precision == "fp8":
        load += fp8_cast(spec, hbm_Bps, launch_s).time_s
    return load
