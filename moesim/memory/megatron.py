"""Megatron-LM's own memory estimate, for comparison with moesim's (``moesim memory
--megatron``; docs/model.md, "Memory against Megatron's estimate").

A re-statement, in moesim's terms, of ``megatron/training/theoretical_memory_usage.py``
(NVIDIA/Megatron-LM, commit d98e8a64ddf34856e74b24714e3bedb2f5a39553):
``compute_weight_and_optimizer_memory`` and ``compute_activation_memory`` (sequence
parallel with selective recompute) / ``compute_activation_memory_without_sp`` (every
other case), both for the most loaded pipeline stage (the first: embedding, and every MTP
layer). :func:`megatron_args` writes a moesim model and layout as the Megatron arguments
those functions read; tests/test_memory_megatron.py checks :func:`theoretical_memory`
against figures printed by Megatron's own file run on the same arguments.

Megatron's bytes per parameter (docs/user-guide/features/dist_optimizer.md there): bf16
weight 2 + fp32 main gradient 4 + fp32 main weight, Adam m and v 12 = 18, or
6 + 12/d with the distributed optimizer over d data-parallel ranks; split here into
``weights`` (2), ``gradients`` (4) and ``optimizer`` (12 or 12/d) so each category can be
compared with moesim's.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.model.spec import ModelSpec


@dataclass(frozen=True)
class MegatronSetup:
    """The layout and batch of one estimate (Megatron argument names in comments)."""

    tp: int = 1                     # tensor_model_parallel_size
    pp: int = 1                     # pipeline_model_parallel_size
    dp: int = 1                     # data_parallel_size (world / (tp·pp·cp))
    cp: int = 1                     # context_parallel_size (only in world_size: the
                                    # estimate does not split activations over it)
    ep: int = 1                     # expert_model_parallel_size
    etp: int = 1                    # expert_tensor_parallel_size
    vpp: int | None = None          # virtual_pipeline_model_parallel_size (None: not interleaved)
    micro_batch_size: int = 1
    seq_len: int = 4096             # seq_length
    microbatches: int | None = None  # num_microbatches (None: pp in flight)
    sequence_parallel: bool = False
    recompute: str | None = None    # recompute_granularity: None | selective | full
    distributed_optimizer: bool = True
    mtp_layers: int | None = None   # mtp_num_layers


def megatron_args(spec: ModelSpec, s: MegatronSetup) -> dict:
    """The Megatron arguments theoretical_memory_usage.py reads, for ``spec`` and ``s``.
    The vocabulary is passed unpadded (Megatron pads it to a multiple of 128·tp) so both
    estimates count the same embedding; ffn_hidden_size is the dense FFN width, or the
    expert width for a model without dense layers (Mixtral recipes set 14336)."""
    mla = spec.attention == "mla"
    shared = spec.n_shared_experts * spec.shared_ffn
    return {
        "num_layers": spec.layers, "hidden_size": spec.hidden,
        "ffn_hidden_size": spec.dense_ffn or spec.expert_ffn,
        "num_attention_heads": spec.heads, "kv_channels": spec.head_dim,
        "group_query_attention": (not mla) and spec.kv_heads != spec.heads,
        "num_query_groups": spec.kv_heads, "swiglu": spec.gated,
        "num_experts": spec.n_experts if spec.moe else None,
        "moe_layer_freq": [int(spec.is_moe_layer(i)) for i in range(spec.layers)],
        "moe_ffn_hidden_size": spec.expert_ffn, "moe_router_topk": spec.top_k,
        "moe_shared_expert_intermediate_size": shared or None,
        "moe_latent_size": None, "moe_shared_expert_gate": False, "add_bias_linear": False,
        "mtp_num_layers": s.mtp_layers, "normalization": "RMSNorm",
        "multi_latent_attention": mla, "q_lora_rank": spec.q_lora_rank or None,
        "qk_head_dim": spec.qk_nope_dim, "qk_pos_emb_head_dim": spec.qk_rope_dim,
        "kv_lora_rank": spec.kv_lora_rank, "v_head_dim": spec.v_head_dim,
        "padded_vocab_size": spec.vocab,
        "untie_embeddings_and_output_weights": not spec.tied_embeddings,
        "tensor_model_parallel_size": s.tp, "pipeline_model_parallel_size": s.pp,
        "expert_model_parallel_size": s.ep, "expert_tensor_parallel_size": s.etp,
        "data_parallel_size": s.dp, "world_size": s.tp * s.pp * s.dp * s.cp,
        "virtual_pipeline_model_parallel_size": s.vpp,
        "use_distributed_optimizer": s.distributed_optimizer,
        "seq_length": s.seq_len, "micro_batch_size": s.micro_batch_size,
        "sequence_parallel": s.sequence_parallel, "recompute_granularity": s.recompute,
    }


def _params_on_first_stage(a: dict) -> tuple[float, float]:
    """(non-expert, expert) parameters of one rank of the most loaded stage."""
    h, layers = a["hidden_size"], a["num_layers"]
    gated = 3 / 2 if a["swiglu"] else 1
    pattern = a["moe_layer_freq"] if a["num_experts"] is not None else [0] * layers
    n_moe = sum(pattern)
    n_dense = layers - n_moe
    mtp = a["mtp_num_layers"] or 0
    mtp_moe = pattern[-1] * mtp if a["num_experts"] is not None else 0
    mtp_dense = mtp - mtp_moe
    norm = 1 if a["normalization"] == "RMSNorm" else 2
    heads = a["num_attention_heads"]
    if a["multi_latent_attention"]:
        qk = a["qk_head_dim"] + a["qk_pos_emb_head_dim"]
        q = (h * heads * qk if a["q_lora_rank"] is None
             else a["q_lora_rank"] * (h + heads * qk + norm))
        attn = (q + a["kv_lora_rank"] * (h + heads * (a["qk_head_dim"] + a["v_head_dim"]) + norm)
                + h * a["qk_pos_emb_head_dim"] + heads * a["v_head_dim"] * h)
    else:
        groups = a["num_query_groups"] if a["group_query_attention"] else heads
        attn = 2 * h * h * (1 + groups / heads) * (a["kv_channels"] * heads / h)
    embedding = h * a["padded_vocab_size"]
    dense_mlp = 2 * h * a["ffn_hidden_size"] * gated
    shared = 2 * h * (a["moe_shared_expert_intermediate_size"] or 0) * gated
    experts = (2 * h * a["moe_ffn_hidden_size"] * (a["num_experts"] or 1) * gated
               if a["num_experts"] is not None else 0)
    ln = 2 * h * norm
    router = h * a["num_experts"] if a["num_experts"] is not None else 0
    tp, pp = a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"]
    tp_sharded = ((attn + dense_mlp) * n_dense + (attn + shared) * n_moe) / pp
    tp_sharded += (attn + dense_mlp) * mtp_dense + (attn + shared) * mtp_moe + embedding
    replicated = (ln * n_dense + (ln + router) * n_moe + norm * h) / pp
    replicated += ln * mtp_dense + (ln + router) * mtp_moe
    expert = (experts * n_moe / pp + experts * mtp_moe) / (
        a["expert_tensor_parallel_size"] * a["expert_model_parallel_size"])
    dense = tp_sharded / tp + replicated
    if a["untie_embeddings_and_output_weights"] and pp == 1:
        dense += embedding / tp
    return dense, expert


def _activation(a: dict, num_microbatches: int | None) -> float:
    s, b, h = a["seq_length"], a["micro_batch_size"], a["hidden_size"]
    tp, pp, vpp = (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"],
                   a["virtual_pipeline_model_parallel_size"])
    with_sp = a["sequence_parallel"] and a["recompute_granularity"] == "selective"
    if with_sp:   # Korthikanti Table 2, selective recompute, SP: sbh(18 + 4·f/h) per layer
        act = s * b * h * (18 + 4 * a["ffn_hidden_size"] / h)
    else:         # sbh(10 + 24/t) per layer
        act = s * b * h * (10 + 24 / tp)
    act *= a["num_layers"]
    act += 8 * s * b * pp + s * b * h * pp   # embedding input, embedding dropout
    if vpp is not None:
        act *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1 and num_microbatches is not None:
        act *= min(1, num_microbatches / pp)
    if pp == 1:
        vocab = a["padded_vocab_size"]
        if with_sp:
            act += s * b * h * 4 * (1 + vocab / h)
        else:
            act += (s * b * vocab / tp + s * b * h) * 2
    return act / tp if with_sp else act * 1.05


def theoretical_memory(args: dict, num_microbatches: int | None = None) -> dict[str, float]:
    """Megatron's estimate for the most loaded stage, bytes: ``weights``, ``gradients``,
    ``optimizer`` (their sum is Megatron's weight_and_optimizer_memory), ``activations``,
    ``total``; ``dense_params``/``expert_params`` of one rank."""
    dense, expert = _params_on_first_stage(args)
    pp = args["pipeline_model_parallel_size"]
    edp = args["world_size"] // (args["expert_tensor_parallel_size"]
                                 * args["expert_model_parallel_size"] * pp)
    dist = args["use_distributed_optimizer"]
    optim = 12 * (dense / args["data_parallel_size"] + expert / edp if dist else dense + expert)
    out = {"weights": 2 * (dense + expert), "gradients": 4 * (dense + expert),
           "optimizer": optim, "activations": _activation(args, num_microbatches),
           "dense_params": dense, "expert_params": expert}
    out["total"] = sum(out[k] for k in ("weights", "gradients", "optimizer", "activations"))
    return out


COMPARED = ("weights", "gradients", "optimizer", "activations", "token_buffers",
            "recompute_workspace")


def setup_of(res) -> MegatronSetup:
    """The Megatron setup of a resolved scenario (``moesim memory --megatron``)."""
    scn, lay = res.scenario, res.layout
    par, sch = scn.parallel, scn.schedule
    rec = scn.memory.recompute
    return MegatronSetup(
        tp=par.tp, pp=par.pp, dp=lay.dp, cp=par.cp, ep=par.ep, etp=par.etp,
        vpp=par.vpp if sch.kind == "interleaved" else None,
        micro_batch_size=sch.micro_batch_size, seq_len=sch.seq_len,
        microbatches=sch.microbatches, sequence_parallel=bool(par.sequence_parallel),
        recompute=None if rec == "none" else rec, distributed_optimizer=par.zero >= 1,
        mtp_layers=getattr(res.model, "mtp_layers", 0) or None)


def compare(res, moesim_row: dict) -> dict:
    """moesim's bytes for the first pipeline stage (``moesim_row``, a
    :meth:`moesim.memory.report.StageMemory.row`) beside Megatron's estimate, per
    category, with the difference moesim − Megatron (bytes)."""
    setup = setup_of(res)
    meg = theoretical_memory(megatron_args(res.model, setup), setup.microbatches)
    rows = []
    for k in COMPARED:
        ours, theirs = float(moesim_row[k]), float(meg.get(k, 0.0))
        rows.append({"category": k, "moesim": ours, "megatron": theirs,
                     "difference": ours - theirs})
    ours = sum(r["moesim"] for r in rows)
    rows.append({"category": "total", "moesim": ours, "megatron": meg["total"],
                 "difference": ours - meg["total"]})
    return {"setup": setup.__dict__, "rows": rows,
            "megatron_source": "megatron/training/theoretical_memory_usage.py "
                               "(NVIDIA/Megatron-LM d98e8a6)"}
