"""SGLang's weight-absorbed MLA in a decode step on an FP8 checkpoint
(``serve.mla_decode: sglang``).

By default (``gemm``) a decode step's MLA kernels are training's forward ones
(:func:`moesim.model.costs.attention_kernels`) around the attention over the cache: the
key/value up-projection ``kv_b`` as one GEMM (t, heads·(nope + v), kv_lora_rank), the
per-head key assembly and value copy that training's multi-head attention needs, and the
attention output's FP8 copy training keeps for the backward. SGLang's decode runs none of
these; it absorbs the up-projection into the query and the output
(sgl-project/sglang ``python/sglang/srt/models/deepseek_v2.py`` at commit 00114aef,
``DeepseekV2AttentionMLA.forward_absorb_prepare`` / ``forward_absorb_core``, taken for a
decode batch, ``AttnForwardMethod.MLA``). With ``w_kc`` / ``w_vc`` in ``float8_e4m3fn``
(an FP8 checkpoint's ``kv_b_proj``, requantised per tensor after loading) a layer runs, per
micro-batch of ``t`` tokens on ``a`` local heads:

1. ``per_tensor_quant_mla_fp8(q_nope.transpose(0, 1))``: two Triton launches over a
   (t, a) grid (``python/sglang/srt/layers/quantization/fp8_kernel.py`` at commit
   e2570945): stage 1 reads the BF16 query (t·a·nope) and atomically maxes one scale;
   stage 2 reads it again and writes FP8;
2. ``bmm_fp8`` (sgl_kernel, a cuBLASLt batched FP8 GEMM): ``a`` GEMMs of (t, kv_lora_rank,
   nope) against ``w_kc``; the result goes to the attention backend as a transposed view
   (``flashattention_backend`` ``forward_decode``: ``q_nope = q.view(...)``, ``qv=q_nope``),
   no copy;
3. the attention over the latent cache (unchanged: :func:`moesim.serve.costs.decode_core_kernel`);
4. ``per_tensor_quant_mla_fp8(attn_output.transpose(0, 1))`` over t·a·kv_lora_rank, two
   launches as in 1;
5. ``bmm_fp8``: ``a`` GEMMs of (t, v, kv_lora_rank) against ``w_vc``;
6. ``attn_bmm_output.transpose(0, 1).flatten(1, 2)``: the (a, t, v) result copied to
   (t, a·v) for ``o_proj`` (a flatten of a transposed tensor copies);

then ``o_proj``'s input cast and GEMM as before. The FLOPs are the replaced GEMM's
(2·t·a·kv_lora_rank·(nope + v)); the bytes and launches differ. No rate is published for
``bmm_fp8`` at these shapes, so the roofline prices it (counted in the summary's
coverage, as every roofline-priced kernel is); the quantisation passes and the copy are
memory-bound kernels priced by ``compute.memory_kernels``. Kernels that a scenario's
``compute.fusion`` has merged away are left as they are.
"""

from __future__ import annotations

from moesim.compute.base import Kernel
from moesim.model.kernels.linear import CAST_TOKEN, cast_bytes, linear
from moesim.model.kernels.make import ACT_BYTES, mem
from moesim.model.spec import ModelSpec

#: the kernels training's multi-head attention runs and SGLang's prefill does not: the
#: values made contiguous (SGLang hands FA3 the strided view ``kv[..., nope:]``)
VALUE_COPY = "direct_copy_kernel"

#: the kernels training's multi-head attention needs and the absorbed decode does not
#: (moesim.model.kernels.attention: the key assembled per head, the values contiguous)
HEAD_COPIES = ("_copy_tensor_kernel", "direct_copy_kernel")
#: FP8 bytes per element of bmm_fp8's operands
FP8 = 1


def bmm_fp8(batch: int, m: int, n: int, k: int) -> Kernel:
    """One cuBLASLt batched FP8 GEMM launch: ``batch`` GEMMs of (m, n, k), FP8 operands,
    BF16 output (no table: the roofline prices it)."""
    return Kernel("bmm_fp8", 2.0 * batch * m * n * k,
                  float(batch * (FP8 * (m * k + k * n) + ACT_BYTES * m * n)),
                  m=m, n=n, k=k, dtype="fp8", pass_="fwd", kclass="gemm")


def per_tensor_quant(elements: int) -> list[Kernel]:
    """``per_tensor_quant_mla_fp8`` over ``elements`` BF16 values: stage 1 reads them
    (the absolute maximum, one atomic scale), stage 2 reads them again and writes FP8."""
    return [mem("per_tensor_quant_mla_fp8_stage1", ACT_BYTES * elements, "fwd", "cast"),
            mem("per_tensor_quant_mla_fp8_stage2", (ACT_BYTES + FP8) * elements, "fwd",
                "cast")]


def absorbed_parts(spec: ModelSpec, tokens: int, tp: int) -> tuple[list[Kernel], list[Kernel]]:
    """SGLang's kernels before the attention core (query quantisation, ``w_kc``) and after
    it (output quantisation, ``w_vc``, the transpose copy) for ``tokens`` on one rank."""
    t, a = tokens, max(spec.heads // tp, 1)
    nope, kvl, v = spec.qk_nope_dim, spec.kv_lora_rank, spec.v_head_dim
    pre = [*per_tensor_quant(t * a * nope), bmm_fp8(a, t, kvl, nope)]
    post = [*per_tensor_quant(t * a * kvl), bmm_fp8(a, t, v, kvl),
            mem("transpose_copy", 2 * ACT_BYTES * t * a * v, "fwd", "elementwise")]
    return pre, post


def _is_kv_b(k: Kernel, spec: ModelSpec, a: int) -> bool:
    return (k.name == "attention_gemm" and k.k == spec.kv_lora_rank
            and k.n == a * (spec.qk_nope_dim + spec.v_head_dim))


def sglang_decode(spec: ModelSpec, kernels: list[Kernel], tokens: int, tp: int,
                  core: str) -> list[Kernel]:
    """A decode step's attention kernels (``kernels``, training's forward around the
    kernel named ``core``) as SGLang's absorbed path runs them; a model without MLA, or
    a list without ``core``, is returned unchanged."""
    names = [k.name for k in kernels]
    if spec.attention != "mla" or core not in names:
        return kernels
    a = max(spec.heads // tp, 1)
    out = list(kernels)
    at = next((i for i, k in enumerate(out) if _is_kv_b(k, spec, a)), None)
    if at is not None:
        cast = cast_bytes(tokens, spec.kv_lora_rank)
        drop = at - 1 if at > 0 and out[at - 1].name == CAST_TOKEN \
            and out[at - 1].bytes == cast else None
        out = [k for i, k in enumerate(out) if i not in (at, drop)]
    out = [k for k in out if k.name not in HEAD_COPIES]
    # training keeps the attention output in FP8 for the backward: a second cast of the
    # same bytes as o_proj's input cast; inference has no backward. The one left is
    # o_proj's, placed after the output's batched GEMM, just before o_proj
    kept = cast_bytes(tokens, a * spec.v_head_dim)
    twins = [k for k in out if k.name == CAST_TOKEN and k.bytes == kept]
    out = [k for k in out if not (k.name == CAST_TOKEN and k.bytes == kept)]
    pre, post = absorbed_parts(spec, tokens, tp)
    i = [k.name for k in out].index(core)
    return [*out[:i], *pre, out[i], *post, *twins[:1], *out[i + 1:]]


def _drop_output_copy(out: list[Kernel], tokens: int, spec: ModelSpec, a: int
                      ) -> list[Kernel]:
    """Without the FP8 copy of the attention output training keeps for its backward:
    of the two casts of its bytes, o_proj's input cast stays."""
    kept = cast_bytes(tokens, a * spec.v_head_dim)
    twins = [i for i, k in enumerate(out) if k.name == CAST_TOKEN and k.bytes == kept]
    return [k for i, k in enumerate(out) if i != twins[0]] if len(twins) > 1 else out


def sglang_prefill(spec: ModelSpec, kernels: list[Kernel], tokens: int, tp: int
                   ) -> list[Kernel]:
    """A prefill step's attention kernels (``kernels``, training's forward) as SGLang's
    multi-head prefill runs them (``forward_normal_chunked_kv_prepare`` / ``_core`` at
    00114aef, which its FA3 backend takes for prompts without a cached prefix): the
    query's and the latent's down-projections are one GEMM over one input cast
    (``fused_qkv_a_proj_with_mqa``, n = q_lora_rank + kv_lora_rank + rope); the latent
    is made contiguous before its norm (``kv_a.contiguous()``); the values reach FA3 as a
    strided view (no copy); no FP8 copy of the output is kept. The key's assembly
    (``k[..., :nope] = k_nope``; ``k[..., nope:] = k_pe``) is training's
    ``_copy_tensor_kernel``, the same bytes. A model without MLA or without a query
    down-projection is returned unchanged."""
    if spec.attention != "mla" or not spec.q_lora_rank:
        return kernels
    t, h, a = tokens, spec.hidden, max(spec.heads // tp, 1)
    ql, kvl, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_dim

    def find(n: int, k: int) -> int | None:
        return next((i for i, x in enumerate(out) if x.name == "attention_gemm"
                     and (x.n, x.k) == (n, k)), None)

    out = list(kernels)
    q_a, kv_a = find(ql, h), find(kvl + rope, h)
    if q_a is not None and kv_a is not None:
        out[q_a] = linear(out[q_a].name, t, ql + kvl + rope, h, "fwd",
                          spec.precision == "fp8", cast_input=False)[0]
        drop = {kv_a}
        if kv_a > 0 and out[kv_a - 1].name == CAST_TOKEN \
                and out[kv_a - 1].bytes == cast_bytes(t, h):
            drop.add(kv_a - 1)
        out = [k for i, k in enumerate(out) if i not in drop]
        # the latent made contiguous just before kv_a_layernorm
        norm = next((i for i, k in enumerate(out) if k.name == "norm"
                     and k.bytes == 2 * ACT_BYTES * t * kvl + 4 * t), None)
        if norm is not None:
            out.insert(norm, mem("contiguous_copy", 2 * ACT_BYTES * t * kvl, "fwd",
                                 "elementwise"))
    out = [k for k in out if k.name != VALUE_COPY]
    return _drop_output_copy(out, tokens, spec, a)
