"""The step builder's stages (moesim.program), each run alone on hand-worked inputs.

EP transfers (:class:`moesim.program.ep_transfers.EPTransfers`): a group's dispatch and
combine, forward and backward.

Folded transfers (:class:`moesim.program.folding.FoldedTransfers`): TP / SP / CP / ETP
collectives of a layer, their groups and bytes.

Recompute stage (:class:`moesim.program.recompute_ops.RecomputeStage`): which layers
re-run their forward in the backward, and the routed experts' re-run priced per expert.

Gradient stage (:class:`moesim.program.grads.GradientStage`) on the toy model (2 MoE
layers, hidden 512, 8 heads of 64, 8 experts of SwiGLU width 1024, vocab 32000, bf16
weights) over 4 ranks, dp = 4, ep = 2 (so edp = 2: ranks 0 and 2 hold the same experts).
Per layer one rank holds, in parameters:

- dense: attention 4 x 512 x 512 = 1,048,576, two norms 2 x 512, router 512 x 8 = 4,096:
  1,053,696 (2,107,392 bytes);
- experts: 8 / ep = 4 experts of 3 x 512 x 1,024 = 1,572,864: 6,291,456 (12,582,912 bytes);

and a rank holding the only stage adds the embedding and the LM head (32,000 x 512 each)
and the final norm (512): 32,768,512 dense parameters.
"""

from __future__ import annotations

import numpy as np
import pytest

from moesim.layout.mesh import Layout
from moesim.model.presets import TOY
from moesim.program.ep_transfers import EPTransfers
from moesim.program.folding import FoldedTransfers
from moesim.program.grads import GradientStage
from moesim.program.layer_plan import LayerKernels, Step
from moesim.program.ops import Op
from moesim.program.recompute import RecomputeRule
from moesim.program.recompute_ops import RecomputeStage
from moesim.scenario.schema import MemoryConfig

LAYER_DENSE = 1_053_696 * 2           # bytes
LAYER_EXPERT = 6_291_456 * 2
EXTRA_DENSE = 32_768_512 * 2


def stage(zero: int = 0, bucket: float = 1e12, overlap: bool = True,
          prefetch: int = 1) -> GradientStage:
    lay = Layout(world=4, dp=4, ep=2)
    return GradientStage(lay, TOY, tp=1, ep=2, pp=1, zero=zero, bucket_bytes=bucket,
                         overlap=overlap, prefetch=prefetch, sms=7)


def backward() -> tuple[list[Op], dict[int, int]]:
    """A rank's backward: layer 1's op (index 0), then layer 0's (index 1)."""
    prog = [Op(stream="compute", kind="compute", name="bwd.layer", layer=layer)
            for layer in (1, 0)]
    return prog, {1: 0, 0: 1}


def run(st: GradientStage, rank: int = 0):
    prog, last = backward()
    calls = []

    def optimizer(p, params, deps):
        calls.append((len(p), params, deps))
        p.append(Op(stream="compute", kind="compute", name="opt.adam", phase="opt"))
    st.reduce(prog, rank, 0, last, optimizer)
    return prog[2:], calls


def test_one_bucket_holds_every_gradient_byte():
    ops, calls = run(stage())
    assert [(o.name, o.coll.op, o.coll.group) for o in ops[:2]] == [
        ("dp.bucket0.dense", "all_reduce", (0, 1, 2, 3)),
        ("dp.bucket0.experts", "all_reduce", (0, 2))]
    assert ops[0].nbytes == 2 * LAYER_DENSE + EXTRA_DENSE
    assert ops[1].nbytes == 2 * LAYER_EXPERT
    # the bucket starts when its last layer's backward (layer 0, op 1) ends
    assert ops[0].deps == ops[1].deps == (1,)
    assert all(o.stream == "comm" and o.sms == 7 for o in ops[:2])
    # the optimizer (op 4) waits for both reductions, over every parameter (no ZeRO)
    assert calls == [(4, (2 * LAYER_DENSE + EXTRA_DENSE + 2 * LAYER_EXPERT) / 2, (2, 3))]
    assert len(ops) == 3


def test_small_buckets_cut_per_layer_in_backward_order():
    ops, _ = run(stage(bucket=1.0))
    assert [o.name for o in ops[:4]] == ["dp.bucket0.dense", "dp.bucket0.experts",
                                        "dp.bucket1.dense", "dp.bucket1.experts"]
    assert [o.layer for o in ops[:4]] == [1, 1, 0, 0]
    assert [o.deps for o in ops[:4]] == [(0,), (0,), (1,), (1,)]
    # conservation: the last bucket takes the embedding, head and norm
    assert [o.nbytes for o in ops[:4]] == [LAYER_DENSE, LAYER_EXPERT,
                                           LAYER_DENSE + EXTRA_DENSE, LAYER_EXPERT]


def test_without_overlap_every_bucket_waits_for_the_backward():
    ops, _ = run(stage(bucket=1.0, overlap=False))
    assert [o.deps for o in ops[:4]] == [(1,)] * 4


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_shards_the_optimizer_and_gathers_after_it(zero):
    ops, calls = run(stage(zero=zero), rank=1)
    assert [o.coll.op for o in ops[:2]] == ["reduce_scatter"] * 2
    assert ops[1].coll.group == (1, 3)
    dense = (2 * LAYER_DENSE + EXTRA_DENSE) / 2 / 4      # parameters over dp = 4
    expert = 2 * LAYER_EXPERT / 2 / 2                    # over edp = 2
    assert calls == [(4, dense + expert, (2, 3))]
    gathers = ops[3:]
    assert [(o.name, o.coll.op, o.nbytes, o.deps) for o in gathers] == [
        ("opt.param_gather.dense", "all_gather", 2 * LAYER_DENSE + EXTRA_DENSE, (4,)),
        ("opt.param_gather.experts", "all_gather", 2 * LAYER_EXPERT, (4,))]


def test_zero3_gathers_a_layer_at_most_prefetch_layers_ahead():
    st = stage(zero=3, prefetch=2)
    assert st.zero3
    prog: list[Op] = [Op(stream="compute", kind="compute", name="x")] * 6
    assert st.zero3_gather(prog, 2, 1, 0, "fwd", [0]) == (6, 7)    # one layer began: free
    assert st.zero3_gather(prog, 2, 1, 0, "fwd", [0, 3]) == (8, 9)  # waits for layer -2
    first, experts, _, later = prog[6:10]
    assert first.deps == () and later.deps == (0,)
    assert (first.coll.op, first.coll.group, first.nbytes) == ("all_gather", (0, 1, 2, 3),
                                                              LAYER_DENSE)
    assert (experts.coll.group, experts.nbytes) == ((0, 2), LAYER_EXPERT)
    assert not stage(zero=2).zero3


# ---------------------------------------------------------------- recompute stage
def recompute_stage(recompute: str, grouped: bool = True, **mem) -> RecomputeStage:
    """The toy model's two layers in one stage chunk; 128 tokens, 2 routed per token."""
    rule = RecomputeRule(MemoryConfig(recompute=recompute, **mem), [[0, 1]], TOY)
    return RecomputeStage(rule, TOY, tokens=128, seq=128, tp=1, ep_tokens=128, top_k=2,
                          etp=1, grouped=grouped)


class FakeTimer:
    """Prices n tokens at n seconds and 10 n FLOP; remembers the keys it was asked."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []

    def __call__(self, key, make):
        self.keys.append(key)
        assert make()          # a non-empty kernel list
        return float(key[1]), 10.0 * key[1]


def test_block_recompute_reruns_the_first_layer_of_its_chunk_only():
    st = recompute_stage("full", recompute_method="block", recompute_num_layers=1)
    # the layer's own bwd.recompute op: its template step, priced by LayerKernels
    lk = LayerKernels(TOY, 128, 128, 1, 128, 256, rc=st.rc)
    step = Step("recompute", "bwd.recompute", "bwd")
    assert lk.op(step, 1) is None
    key, make = lk.op(step, 0)
    assert make()
    timer = FakeTimer()
    assert st.experts(1, [5, 7], timer) is None
    # experts without tokens are skipped; the rank's later experts share the first's launches
    assert st.experts(0, [5, 0, 7], timer) == (12.0, 120.0)
    assert timer.keys == [("expert", 5, "fwd", 1), ("expert", 7, "fwd", 1, "fused")]


def test_selective_moe_act_reruns_only_the_experts_activation():
    st = recompute_stage("selective", grouped=False, recompute_modules=("moe_act",))
    timer = FakeTimer()
    assert st.experts(1, [3], timer) == (3.0, 30.0)
    assert timer.keys == [("expert", 3, "act", 1)]
    assert recompute_stage("none").experts(0, [3], timer) is None


# ---------------------------------------------------------------- folded transfers
def folded(**kw) -> FoldedTransfers:
    """The toy model, 128 tokens per rank and micro-batch (64 with CP = 2), 4 ranks."""
    lay = Layout(world=4, dp=4 // (kw.get("tp", 1) * kw.get("cp", 1)), ep=2,
                 tp=kw.get("tp", 1), cp=kw.get("cp", 1), etp=kw.get("etp", 1))
    args = dict(tokens=128, tp=1, sp=False, cp=1, etp=1, tp_overlap=False) | kw
    return FoldedTransfers(lay, TOY, **args)


def test_tp_all_reduces_a_blocks_output():
    (t,) = folded(tp=2).tp_reduce(3, 1, 0, "fwd", "attn")
    assert (t.kind, t.name, t.spec.op, t.spec.group) == ("tp", "fwd.tp_attn", "all_reduce",
                                                         (2, 3))
    assert t.nbytes == 128 * 512 * 2 and t.stream == "compute"
    assert folded().tp_reduce(0, 1, 0, "fwd", "attn") == []


def test_sequence_parallel_moe_layer_keeps_one_half_per_block():
    f = folded(tp=2, sp=True)
    assert [t.name for t in f.tp_reduce(0, 1, 0, "fwd", "attn")] == ["fwd.sp_attn_reduce_scatter"]
    assert [t.name for t in f.tp_reduce(0, 1, 0, "fwd", "mlp")] == ["fwd.sp_mlp_all_gather"]
    # TE's TP overlap: the backward's exchanges are the gradients' own kinds
    g = folded(tp=2, sp=True, tp_overlap=True)
    assert [t.name for t in g.tp_reduce(0, 1, 0, "bwd", "attn")] == ["bwd.sp_attn_all_gather"]


def test_cp_exchanges_the_other_ranks_kv_beside_attention():
    f = folded(cp=2, tokens=64)
    fwd, bwd = f.cp_kv(1, 0, 0, "fwd"), f.cp_kv(1, 0, 0, "bwd")
    # one peer's K and V: 64 tokens x 8 heads x 64 x 2 (K, V) x 2 bytes; backward twice
    assert (fwd.nbytes, bwd.nbytes) == (131_072, 262_144)
    assert (fwd.stream, fwd.name, fwd.spec.group) == ("cp", "fwd.cp_kv", (0, 1))
    assert folded().cp_kv(1, 0, 0, "fwd") is None


def test_etp_gathers_the_peers_tokens_and_scatters_back():
    f = folded(etp=2)
    gathered = np.array([3, 0, 5, 2])
    gather = f.etp_transfer((0, 1), gathered, 1, 0, "fwd", 0)
    scatter = f.etp_transfer((0, 1), gathered, 1, 0, "fwd", 1)
    assert (gather.name, gather.spec.op) == ("fwd.etp_gather", "all_gather")
    assert (scatter.name, scatter.spec.op) == ("fwd.etp_scatter", "reduce_scatter")
    assert gather.spec.nbytes == 10 * 512 * 2      # the 10 gathered tokens' activations
    assert f.etp_transfer((0,), gathered, 1, 0, "fwd", 0) is None


# ---------------------------------------------------------------- EP transfers
class Route:
    """A two-rank group's sample: rank 0 sends 3 tokens to rank 1, rank 1 sends 1 to 0
    (and keeps 2); 1,024 bytes per token forward."""
    dispatch_tokens = np.array([[0, 3], [1, 2]])
    combine_tokens = dispatch_tokens.T
    dispatch_bytes = dispatch_tokens * 1024.0
    combine_bytes = combine_tokens * 1024.0


class Pairwise:
    deepep = False
    dtypes = {"grad_dispatch": "bf16"}     # routing.grad_dispatch_dtype's default


def test_ep_exchange_forward_then_gradients_reversed():
    ep = EPTransfers(Pairwise(), hidden=512, gpus_per_node=8, a2a_algo="direct")
    disp, comb = ep.exchange((4, 6), Route, 3, 1, "fwd")
    assert (disp.op, disp.group, disp.algo) == ("all_to_all_v", (4, 6), "direct")
    assert ep.sent_bytes(disp, 0) == 3 * 1024 and ep.sent_bytes(comb, 0) == 1 * 1024
    # one spec per (group, layer, micro-batch, direction): every member meets in it
    assert ep.exchange((4, 6), Route, 3, 1, "fwd")[0] is disp
    bdisp, bcomb = ep.exchange((4, 6), Route, 3, 1, "bwd")
    # backward: the combine's shape first, 2 x 512 bytes of bf16 gradient per token
    # (bwd.combine, first: rank 0 sends the output gradients of the 3 tokens it
    # dispatched; bwd.dispatch: the input gradient of the 1 token it computed back; rank 1
    # the 3 it computed for rank 0 and the 2 it kept)
    assert ep.sent_bytes(bdisp, 0) == 1 * 1024 and ep.sent_bytes(bdisp, 1) == 5 * 1024
    assert ep.sent_bytes(bcomb, 0) == 3 * 1024 and bdisp is not comb
