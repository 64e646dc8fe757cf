"""The layer's kernel recipe: which kernels make up each compute op of a step (pure).

One function per op the step programs name (``fwd.attn``, ``fwd.router``,
``fwd.experts``, ``fwd.unpermute``, ``fwd.ffn``, ``fwd.embedding``, ``fwd.lm_head``,
``fwd.mtp``, ``opt.adam``, their backward ``B``/``W`` parts, ``bwd.recompute``, the
serving step's attention), each returning the op's kernels on one rank in execution
order (:class:`moesim.compute.base.Kernel`; their shapes and bytes come from
:mod:`moesim.model.costs`). This is the one module that calls the model's ``*_kernels``
functions: the exact builder (:mod:`moesim.program.build`, DualPipe, recompute, the
serving builder), the fast engine, the op inventory and the GPU validation all take an
op's kernels from here, so a kernel added to an op here reaches every engine.

Every op's list passes through :func:`with_fusion` once, where it is assembled: the scenario's
``compute.fusion`` (``spec.fusion``) merges kernel pairs (:mod:`moesim.model.kernels.
fusion`); with none the lists are the inventory's as they are.

``graphs``: the scenario's ``overlap.cuda_graphs`` modules (:mod:`moesim.program.
cuda_graphs`); ``side``: the shared experts run beside the all-to-alls
(:mod:`moesim.program.shared_overlap`).
"""

from __future__ import annotations

from dataclasses import replace

from moesim.compute.base import Kernel, fused_launches
from moesim.model import costs, mtp, window
from moesim.model.kernels.deepseek import launches
from moesim.model.kernels.fusion import fuse
from moesim.model.kernels.tensorwise import NAMES as TENSORWISE_OPS
from moesim.model.spec import ModelSpec
from moesim.program.cuda_graphs import maybe
from moesim.program.shared_overlap import split

__all__ = ["attn", "attn_op", "attn_w", "backward_part", "decode_attn", "dense_ffn",
           "dualpipe_part", "embedding", "expert", "expert_post", "lm_head", "mlp_w",
           "mtp_draft_pre", "mtp_head", "optimizer", "post_op", "prefill_attn", "recompute_layer",
           "recompute_op", "router", "shared_part", "with_fusion"]


def with_fusion(spec: ModelSpec, kernels: list[Kernel]) -> list[Kernel]:
    """One op's ``kernels`` with the scenario's fusions (``spec.fusion``) applied."""
    return fuse(launches(spec, kernels), getattr(spec, "fusion", ()))


def backward_part(kernels: list[Kernel], part: str) -> list[Kernel]:
    """The ``B`` (input-gradient) or ``W`` (weight-gradient) part of an op's kernels
    (:func:`moesim.model.costs.backward_part`)."""
    return costs.backward_part(kernels, part)


# ------------------------------------------------------------------ embedding and heads
def embedding(spec: ModelSpec, tokens: int, tp: int, phase: str = "fwd") -> list[Kernel]:
    """``fwd.embedding``: the vocabulary-parallel lookup."""
    return costs.embedding_kernels(spec, tokens, tp, phase)


def lm_head(spec: ModelSpec, tokens: int, tp: int, phase: str,
            sp: bool = False) -> list[Kernel]:
    """``fwd.lm_head`` / ``bwd.lm_head``: final norm (on the sequence shard with ``sp``),
    LM-head GEMM and the loss."""
    return with_fusion(spec, costs.lm_head_kernels(spec, tokens, tp, phase, sp))


def mtp_head(spec: ModelSpec, tokens: int, tp: int, phase: str,
             sp: bool = True) -> list[Kernel]:
    """``fwd.mtp`` / ``bwd.mtp``: what an MTP depth adds beyond its transformer layer
    (its norms on the sequence shard with ``sp``)."""
    return with_fusion(spec, mtp.head_kernels(spec, tokens, tp, phase, sp))


def mtp_draft_pre(spec: ModelSpec, tokens: int, tp: int) -> list[Kernel]:
    """A serving draft step's MTP kernels before its decoder layer, for ``tokens``
    tokens: the shared embedding, ``enorm``/``hnorm`` and ``eh_proj`` (:func:`mtp_head`'s
    forward less its loss head; :mod:`moesim.serve.mtp`)."""
    pre = mtp.head_kernels(spec, tokens, tp, "fwd", sp=False)
    return pre[:len(pre) - len(costs.lm_head_kernels(spec, tokens, tp, "fwd", False))]


def optimizer(shard: float) -> list[Kernel]:
    """``opt.adam``: the Adam step over the rank's ``shard`` parameters."""
    return costs.optimizer_kernels(shard)


# ------------------------------------------------------------------ one layer
def attn(spec: ModelSpec, tokens: int, seq: int, tp: int, phase: str,
         graphs=(), sp: bool = True) -> list[Kernel]:
    """``fwd.attn`` / ``bwd.attn``: the layer's norms and attention over ``seq`` keys
    (one CUDA graph with ``attn`` in ``graphs``); ``sp``: the norms and residual adds,
    and MLA's latent norms, on the rank's sequence shard
    (:func:`moesim.model.costs.norm_kernels`, :func:`~moesim.model.costs.attention_kernels`)."""
    return maybe(with_fusion(spec, [*costs.norm_kernels(spec, tokens, tp, phase, sp),
                              *costs.attention_kernels(spec, tokens, seq, tp, phase, sp)]),
                 "attn" in graphs)


def dense_ffn(spec: ModelSpec, tokens: int, tp: int, phase: str, graphs=()) -> list[Kernel]:
    """``fwd.ffn`` / ``bwd.ffn``: a dense layer's FFN (one CUDA graph with ``mlp``)."""
    return maybe(with_fusion(spec, costs.dense_ffn_kernels(spec, tokens, tp, phase)),
                 "mlp" in graphs)


def router(spec: ModelSpec, ep_tokens: int, sent: int, phase: str, graphs=()) -> list[Kernel]:
    """``fwd.router`` / ``bwd.router``: the MoE block before the dispatch, router (graphed
    with ``moe_router``) and the permutation of ``sent`` token copies (graphed with
    ``moe_preprocess``)."""
    ks = [*maybe(costs.router_kernels(spec, ep_tokens, phase), "moe_router" in graphs),
          *maybe(costs.permute_kernels(spec, sent, phase), "moe_preprocess" in graphs)]
    return with_fusion(spec, ks)


def expert(spec: ModelSpec, tokens: int, etp: int, phase: str,
           fused: bool = False) -> list[Kernel]:
    """``fwd.experts``: one routed expert's kernels for ``tokens`` (ETP-gathered) tokens at
    width ``expert_ffn / etp``; ``fused``: an expert after the rank's first under grouped
    launches (:func:`moesim.compute.base.fused_launches`)."""
    if etp <= 1:
        ks = costs.expert_kernels(spec, tokens, phase)
    else:
        ks = costs.expert_kernels(spec, tokens, phase, width=spec.expert_ffn // etp)
    return fused_launches(with_fusion(spec, ks), fused)


def expert_post(spec: ModelSpec, sent: int, tokens: int, tp: int, phase: str,
                side: bool = False) -> list[Kernel]:
    """``fwd.unpermute`` / ``bwd.unpermute``: the unpermute after the combine, with the
    shared experts unless they run beside the all-to-alls (``side``)."""
    return with_fusion(spec, [*costs.unpermute_kernels(spec, sent, phase),
                        *([] if side else costs.shared_expert_kernels(spec, tokens, tp,
                                                                      phase))])


def shared_part(spec: ModelSpec, tokens: int, tp: int, phase: str, part: int) -> list[Kernel]:
    """``fwd.shared_fc1`` ... : part ``part`` (0: beside the pass's first all-to-all, 1:
    its second) of the shared experts' kernels (:func:`moesim.program.shared_overlap.
    split`)."""
    return with_fusion(spec, split(costs.shared_expert_kernels(spec, tokens, tp, phase), phase)[part])


# ------------------------------------------------------------------ weight gradients apart
def mlp_w(spec: ModelSpec, ep_tokens: int, tokens: int, tp: int) -> list[Kernel]:
    """``bwd.w_mlp`` of an MoE layer (zero-bubble / DualPipe): the router's and the shared
    experts' weight-gradient GEMMs."""
    return backward_part(with_fusion(spec, [*costs.router_kernels(spec, ep_tokens, "bwd"),
                                      *costs.shared_expert_kernels(spec, tokens, tp, "bwd")]),
                         "W")


def attn_w(spec: ModelSpec, tokens: int, seq: int, tp: int, sp: bool = True) -> list[Kernel]:
    """``bwd.w_attn``: the weight-gradient part of the norms and attention."""
    return backward_part(attn(spec, tokens, seq, tp, "bwd", sp=sp), "W")


# ------------------------------------------------------------------ recompute
def recompute_layer(spec: ModelSpec, layer: int, mods: frozenset[str], *, tokens: int,
                    seq_len: int, tp: int, ep_tokens: int, sent: int,
                    sp: bool = True) -> list[Kernel]:
    """``bwd.recompute``: forward kernels, except the routed experts', that the
    recomputed modules ``mods`` (:func:`moesim.program.recompute.recomputes`) re-run in
    layer ``layer``'s backward (named ``recompute.<kernel>``; ``sp``: the norms on the
    sequence shard)."""
    if not mods:
        return []
    moe = spec.is_moe_layer(layer)
    full = "full" in mods
    attn_ks = costs.attention_kernels(spec, tokens, seq_len, tp, "fwd", sp)
    out: list[Kernel] = []
    if full:
        out += costs.norm_kernels(spec, tokens, tp, "fwd", sp) + attn_ks
    else:
        if "layernorm" in mods:     # the two RMSNorms, without the residual adds
            out += [k for k in costs.norm_kernels(spec, tokens, tp, "fwd", sp)
                    if k.name == "norm"]
        if "core_attn" in mods:
            out += [k for k in attn_ks if k.name == "attention"]
        if "mla_up_proj" in mods and spec.attention == "mla":
            # the up-projection GEMMs (from the q and kv latents) and the RoPE application
            # and key/query assembly between them and the core attention (elementwise),
            # and the latent norms (on the shard with ``sp``): Megatron-LM d98e8a6
            # multi_latent_attention.py checkpoints qkv_up_proj_and_rope_apply, whose
            # linear_q_up_proj / linear_kv_up_proj are TE's LayerNormColumnParallelLinear
            # with the norm inside (gpt_layer_specs.py, qk_layernorm), at any TP; DeepSeek
            # recomputes "all RMSNorm operations and MLA up-projections" (DeepSeek-V3
            # report §3.2.3); under per-tensor current scaling each re-run linear
            # quantises its input again (moesim.model.kernels.tensorwise: the three
            # kernels just before its GEMM)
            ranks = {spec.q_lora_rank, spec.kv_lora_rank} - {0}
            keep = {i for i, k in enumerate(attn_ks)
                    if (k.name == "attention_gemm" and k.k in ranks)
                    or k.kclass == "elementwise" or k.name == "norm"}
            keep |= {j for i in keep if attn_ks[i].name == "attention_gemm"
                     for j in range(max(i - 3, 0), i) if attn_ks[j].name in TENSORWISE_OPS}
            out += [attn_ks[i] for i in sorted(keep)]
    if not moe:
        if full or "mlp" in mods:
            out += costs.dense_ffn_kernels(spec, tokens, tp, "fwd")
    elif full or "moe" in mods:
        out += costs.router_kernels(spec, ep_tokens, "fwd")
        out += costs.permute_kernels(spec, sent, "fwd")
        out += costs.unpermute_kernels(spec, sent, "fwd")
        out += costs.shared_expert_kernels(spec, tokens, tp, "fwd")
    elif "shared_experts" in mods:
        out += costs.shared_expert_kernels(spec, tokens, tp, "fwd")
    return [replace(k, name=f"recompute.{k.name}") for k in with_fusion(spec, out)]


# ------------------------------------------------------------------ (timer key, kernels)
# The ops whose kernel list depends on more than the phase, with the key both engines'
# timers price them under (an op's kernels are priced once per key).
def attn_op(spec: ModelSpec, layer: int, tokens: int, seq: int, tp: int, phase: str,
            graphs=(), sp: bool = True) -> tuple:
    """(key, kernel maker) of layer ``layer``'s attention op for sequences of ``seq``
    tokens: a sliding-window layer scores fewer keys (:func:`moesim.model.window.
    effective_seq`) and is priced under a key of its own."""
    eff = window.effective_seq(spec, layer, seq)
    key = ("attn", phase) if eff == seq else ("attn", phase, eff)
    return key, lambda: attn(spec, tokens, eff, tp, phase, graphs, sp)


def post_op(spec: ModelSpec, sent: int, tokens: int, tp: int, phase: str,
            side: bool = False) -> tuple:
    """(key, kernel maker) of the ``unpermute`` op (:func:`expert_post`)."""
    return ((("post", phase, "side") if side else ("post", phase)),
            lambda: expert_post(spec, sent, tokens, tp, phase, side))


def recompute_op(spec: ModelSpec, layer: int, mods: frozenset[str], *, tokens: int, seq: int,
                 tp: int, ep_tokens: int, sent: int, sp: bool = True) -> tuple:
    """(key, kernel maker) of layer ``layer``'s ``bwd.recompute`` op
    (:func:`recompute_layer`; a sliding-window layer's attention scores fewer keys)."""
    eff = window.effective_seq(spec, layer, seq)
    return (("recompute", spec.is_moe_layer(layer), mods, eff),
            lambda: recompute_layer(spec, layer, mods, tokens=tokens, seq_len=eff, tp=tp,
                                    ep_tokens=ep_tokens, sent=sent, sp=sp))


# ------------------------------------------------------------------ serving
# A serving engine runs no sequence parallelism: vLLM's RowParallelLinear all-reduces
# its output (vllm-project/vllm 9e109c98 vllm/model_executor/layers/linear.py
# ``reduce_results and tp_size > 1``), so every TP rank holds all tokens' hidden states
# and runs the layer's RMSNorms on them (e06c9ba2 vllm/model_executor/models/llama.py
# ``LlamaDecoderLayer.forward``). ``sp`` is the step plan's (:class:`moesim.program.
# build.Builder` ``sp``): False for a serving scenario, the trainer's for RL's Megatron
# log-prob passes.
def prefill_attn(spec: ModelSpec, tokens: int, prompt: int, tp: int,
                 kv_write: Kernel, *, sp: bool) -> list[Kernel]:
    """A prefill step's ``fwd.attn``: training's forward norms (on the sequence shard
    only with ``sp``) and causal attention over the prompt, then ``kv_write``
    (:mod:`moesim.serve.costs`)."""
    return [*attn(spec, tokens, prompt, tp, "fwd", sp=sp), kv_write]


def decode_attn(spec: ModelSpec, tokens: int, tp: int, core: Kernel,
                kv_write: Kernel, *, sp: bool) -> list[Kernel]:
    """A decode step's ``fwd.attn``: the norms (on the sequence shard only with ``sp``),
    the new tokens' projections, ``core`` (attention over the KV cache) before the output
    projection, then ``kv_write``."""
    proj = [k for k in costs.attention_kernels(spec, tokens, 1, tp, "fwd", sp)
            if k.name != "attention"]
    return with_fusion(spec, [*costs.norm_kernels(spec, tokens, tp, "fwd", sp), *proj[:-1],
                              core, proj[-1], kv_write])


# ------------------------------------------------------------------ GPU validation
def dualpipe_part(spec: ModelSpec, part: str, tokens: int, seq_len: int, ep: int,
                  phase: str) -> list[Kernel]:
    """One layer's kernels on one rank as DualPipe's reference chunks split it (TP 1,
    balanced routing): ``attn`` the attention and the router, ``mlp`` the rank's routed
    experts and the shared experts (:mod:`moesim.validation.gpu.validate`)."""
    if part == "attn":
        return with_fusion(spec, costs.attention_kernels(spec, tokens, seq_len, 1, phase)
                     + costs.router_kernels(spec, tokens, phase))
    local = max(spec.n_experts // max(ep, 1), 1)
    rows = tokens * spec.top_k * ep // max(spec.n_experts, 1)   # per expert, balanced
    ks = [k for _ in range(local) for k in costs.expert_kernels(spec, rows, phase)]
    return with_fusion(spec, ks + costs.shared_expert_kernels(spec, tokens, 1, phase))
