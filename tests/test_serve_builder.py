"""The serving step's builder holds the training builder instead of inheriting it (issue 37,
composition instead of mixins): :class:`moesim.serve.program.ServeBuilder` writes its ops
through :class:`moesim.program.build.Builder`'s public op-writing interface
(``compute_op``, ``tp_allreduce_ops``, ``moe_ops``, ``collective_spec``/``collective_op``,
``build(rank_program)``), and a tiny decode step's program on rank 0 is the recipe's,
op by op, priced by hand from the kernels.
"""

from __future__ import annotations

import pytest
import yaml

from moesim.program import recipe
from moesim.program.build import Builder
from moesim.serve import costs as serve_costs
from moesim.serve.program import ServeBuilder, build_serve_step
from moesim.serve.run import resolve_serve

B, CTX, H, VOCAB, TOP_K = 4, 512, 1024, 4096, 2   # requests per GPU, context, model dims


def _decode(tmp_path, tp: int = 1):
    """8 GPUs of one DGX H100 node, EP8 over NCCL, 2 layers (the first dense), 8 experts
    top-2, one micro-batch of decode, the roofline's prices."""
    data = {"name": "sb", "seed": 1, "cluster": {"topology": "dgx-h100", "nodes": 1},
            "model": {"layers": 2, "hidden": H, "heads": 8, "kv_heads": 8, "head_dim": 128,
                      "vocab": VOCAB, "attention": "mha", "dense_ffn": 4096, "n_experts": 8,
                      "top_k": TOP_K, "expert_ffn": 1024, "first_dense_layers": 1},
            "compute": {"model": "roofline"},
            "serve": {"phase": "decode", "batch_per_gpu": B, "context": CTX, "ep": 8,
                      "tp": tp, "ep_backend": "nccl"}}
    p = tmp_path / "sb.yaml"
    p.write_text(yaml.safe_dump(data))
    return resolve_serve(str(p))


def _price(res, kernels) -> float:
    return sum(res.compute.time_s(k) for k in kernels)


def test_serve_builder_holds_a_builder_instead_of_being_one(tmp_path):
    res, cfg = _decode(tmp_path)
    sb = ServeBuilder(res, cfg)
    assert not issubclass(ServeBuilder, Builder)
    assert isinstance(sb.builder, Builder)
    assert sb.builder.step == cfg.step


def test_decode_program_of_rank_0_is_the_recipe_op_by_op(tmp_path):
    res, cfg = _decode(tmp_path)
    spec = res.model
    plan = build_serve_step(res, cfg)
    prog = plan.programs[0]
    # embedding; dense layer 0: attention, FFN; MoE layer 1: attention, router, dispatch,
    # experts, combine, unpermute; the LM head (TP 1: no all-reduce, no top-k exchange)
    assert [op.name for op in prog] == [
        "fwd.embedding", "fwd.attn", "fwd.ffn", "fwd.attn", "fwd.router", "fwd.dispatch",
        "fwd.experts", "fwd.combine", "fwd.unpermute", "fwd.lm_head"]
    assert [op.layer for op in prog] == [-1, 0, 0, 1, 1, 1, 1, 1, 1, -1]
    assert {op.microbatch for op in prog} == {0}
    # decode: B tokens per GPU, each reads CTX cached tokens; every token to TOP_K experts
    want = {"fwd.embedding": recipe.embedding(spec, B, 1, "fwd"),
            "fwd.attn": serve_costs.decode_attention_kernels(spec, B, CTX, 1, cfg.kv_bytes),
            "fwd.ffn": recipe.dense_ffn(spec, B, 1, "fwd"),
            "fwd.router": recipe.router(spec, B, B * TOP_K, "fwd", ()),
            "fwd.unpermute": recipe.expert_post(spec, B * TOP_K, B, 1, "fwd", False),
            "fwd.lm_head": serve_costs.head_kernels(spec, B, 1)}
    for op in prog:
        if op.name in want:
            assert op.duration_s == pytest.approx(_price(res, want[op.name]), rel=1e-12), op.name
            assert op.duration_s > 0
    (exp,) = [op for op in prog if op.name == "fwd.experts"]
    grouped = ServeBuilder(res, cfg).builder.grouped
    by_hand = sum(_price(res, recipe.expert(spec, n, 1, "fwd", grouped and i > 0))
                  for i, n in enumerate(exp.expert_tokens))
    assert exp.duration_s == pytest.approx(by_hand, rel=1e-12)
    assert sum(exp.expert_tokens) == exp.tokens > 0
    # the step's tokens: B per GPU on 8 GPUs
    assert plan.tokens_per_step == 8 * B


def test_tp2_head_samples_by_a_distributed_top_k(tmp_path):
    """TP 2: the head's max and sum of exponentials all-reduce one fp32 per token (2 B
    requests per TP group: 8 tokens -> 32 bytes), the top-k all-gathers k = 50 candidates
    of 8 bytes (fp32 value + int32 id) from each of 2 ranks: 2 * 8 * 50 * 8 = 6400 bytes."""
    res, cfg = _decode(tmp_path, tp=2)
    assert cfg.sample_top_k == 50
    prog = build_serve_step(res, cfg).programs[0]
    tail = [(op.kind, op.name, op.nbytes) for op in prog[-3:]]
    assert tail == [("tp", "fwd.head_max", 32.0), ("tp", "fwd.head_sumexp", 32.0),
                    ("tp", "fwd.head_topk", 6400.0)]
    assert prog[-4].name == "fwd.lm_head"
    assert prog[-4].duration_s == pytest.approx(
        _price(res, serve_costs.head_kernels(res.model, 2 * B, 2)), rel=1e-12)
