"""CP, SP and ETP in the programs and the memory model, worked by hand (toy model:
hidden 512, 8 heads of 64, 8 KV heads, 8 experts top-2 of FFN 1024 SwiGLU)."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.memory.model import memory_per_rank, rank_params
from moesim.model import costs
from moesim.model.params import ffn_params
from moesim.model.presets import PRESETS
from moesim.program.build import build_step
from moesim.program.cp import kv_block_bytes, kv_exchange_bytes
from moesim.scenario import load_scenario
from moesim.wiring import resolve
from tests._util import two_gpu_scenario

TOY = PRESETS["toy"]


def plan(tmp_path, **par):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = two_gpu_scenario(tmp_path, parallel={"tp": 1, "pp": 1, "ep": 1, **par},
                            schedule={"microbatches": 2, "seq_len": 512})
    res = resolve(load_scenario(path))
    return res, build_step(res)


def ops(prog, name):
    return [o for o in prog if o.name == name]


def test_cp_kv_exchange_bytes_by_hand(tmp_path):
    # cp 2, seq 512: 256 tokens per rank; K and V: 2 x 8 heads x 64 x 2 bytes = 2048 B/token
    assert kv_block_bytes(TOY, 256, 1) == 256 * 2048
    res, p = plan(tmp_path, cp=2)
    assert res.layout.cp_groups == ((0, 1),) and res.layout.dp == 1
    for rank in (0, 1):
        fwd, bwd = ops(p.programs[rank], "fwd.cp_kv"), ops(p.programs[rank], "bwd.cp_kv")
        assert len(fwd) == len(bwd) == 2      # 1 layer x 2 micro-batches
        # forward: cp-1 = 1 block; backward: K, V and dK, dV
        assert all(o.nbytes == 256 * 2048 for o in fwd)
        assert all(o.nbytes == 2 * 256 * 2048 for o in bwd)
        # as a ring all-gather of cp blocks: each rank sends (cp-1)/cp of nbytes
        assert fwd[0].coll.op == "all_gather" and fwd[0].coll.nbytes == 2 * 256 * 2048
        assert fwd[0].stream == "cp"
    assert kv_exchange_bytes(TOY, 256, 1, 4, "fwd") == 3 * 256 * 2048
    # tokens of the step: 512 per sequence x 2 micro-batches x dp 1 (cp shares them)
    assert p.tokens_per_step == 1024


def test_cp_attention_flops_are_the_causal_share_of_balanced_chunks():
    # cp 2: 4 chunks of s/4, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2; causal
    # query-key pairs of chunk c = c full blocks + half the diagonal block
    s, cp = 512, 2
    b = s // (2 * cp)
    pairs = {r: sum((c + 0.5) * b * b for c in (r, 2 * cp - 1 - r)) for r in range(cp)}
    assert pairs[0] == pairs[1] == s * s / 2 / cp
    whole = [k for k in costs.attention_kernels(TOY, s, s) if k.name == "attention"][0]
    part = [k for k in costs.attention_kernels(TOY, s // cp, s) if k.name == "attention"][0]
    assert part.flops == whole.flops / cp
    # 2 FLOP x (QK^T and PV: 2 x head_dim) x heads per pair
    assert part.flops == pairs[0] * 2 * 8 * 2 * 64


def test_sp_replaces_all_reduce_by_reduce_scatter_and_all_gather(tmp_path):
    # tp 2, 512 tokens x hidden 512 x 2 bytes = 524288 bytes per TP collective
    _, off = plan(tmp_path / "a", tp=2)
    _, on = plan(tmp_path / "b", tp=2, sequence_parallel=True)
    ar = [o for o in off.programs[0] if o.kind == "tp"]
    sp = [o for o in on.programs[0] if o.kind == "tp"]
    assert {o.coll.op for o in ar} == {"all_reduce"} and len(ar) == 2 * 2 * 2
    # an MoE layer: reduce-scatter after attention, all-gather before the next attention
    assert sorted(o.coll.op for o in sp) == ["all_gather"] * 4 + ["reduce_scatter"] * 4
    assert all(o.coll.nbytes == 512 * 512 * 2 for o in ar + sp)
    # ring bytes each rank sends: all-reduce 2(n-1)/n S, RS and AG (n-1)/n S each
    sent_ar = sum(2 * (2 - 1) / 2 * o.coll.nbytes for o in ar)
    sent_sp = sum((2 - 1) / 2 * o.coll.nbytes for o in sp)
    assert sent_sp == sent_ar / 2            # an MoE layer needs half


def test_etp_gathers_tokens_and_keeps_expert_flops(tmp_path):
    # tp 2, etp 2, ep 1: every rank holds all 8 experts at width 1024 / 2
    res, p = plan(tmp_path / "a", tp=2, etp=2, sequence_parallel=True)
    assert res.layout.etp_groups == ((0, 1),) and res.layout.edp == 1
    _, q = plan(tmp_path / "b", tp=2, sequence_parallel=True)   # etp 1: edp 2
    for rank in (0, 1):
        e = ops(p.programs[rank], "fwd.experts")
        e1 = ops(q.programs[rank], "fwd.experts")
        # 512 tokens / tp 2 = 256 routed per rank, top-2: 512 assignments; gathered 1024
        assert sum(e[0].expert_tokens) == 1024 and sum(e1[0].expert_tokens) == 512
        # 3 GEMMs of 2·n·h·w FLOP plus SwiGLU's 5 FLOP per element of n x w
        assert e[0].flops == 2 * 3 * 1024 * 512 * 512 + 5 * 1024 * 512
        assert e1[0].flops == 2 * 3 * 512 * 512 * 1024 + 5 * 512 * 1024 == e[0].flops
        g, sc = ops(p.programs[rank], "fwd.etp_gather"), ops(p.programs[rank], "fwd.etp_scatter")
        assert [o.coll.op for o in g + sc] == ["all_gather"] * 2 + ["reduce_scatter"] * 2
        assert g[0].coll.nbytes == 1024 * 512 * 2
    assert p.model_flops == pytest.approx(q.model_flops)


def test_params_per_rank_with_etp_and_cp_sum_to_count_times_replication():
    # world 8 = tp2 cp2 dp2; etp2 ep2 -> edp 2. One MoE layer of the toy model.
    tp, cp, dp, ep, etp = 2, 2, 2, 2, 2
    dense, expert = rank_params(TOY, [0], tp=tp, ep=ep, first=False, last=False, etp=etp)
    assert expert == 8 // ep * ffn_params(TOY, 1024) / etp == 4 * 3 * 512 * 1024 / 2
    edp = tp * cp * dp // (etp * ep)
    assert 8 * expert == 8 * ffn_params(TOY, 1024) * edp     # each shard on edp ranks
    whole, _ = rank_params(TOY, [0], tp=1, ep=1, first=False, last=False)
    # dense: attention split over tp, replicated over cp x dp; norms and router on all 8
    from moesim.model.params import attention_params, layer_norm_params, router_params
    att = attention_params(TOY)
    rep = layer_norm_params(TOY) + router_params(TOY) + att.replicated
    assert 8 * dense == att.tp_split * cp * dp + 8 * rep
    assert whole == att.tp_split + rep
    # the memory model's rank (pp 1: embedding and LM head too)
    dense, expert = rank_params(TOY, [0], tp=tp, ep=ep, first=True, last=True, etp=etp)
    m = memory_per_rank(TOY, micro_batch_tokens=512, seq_len=512, tp=tp, cp=cp, dp=dp,
                        ep=ep, etp=etp, zero=1, layers=[0])
    assert m.expert_params == expert and m.dense_params == dense
    # ZeRO-1: fp32 state of dense params over dp x cp = 4, experts over edp = 2
    assert m.optimizer == 12 * (dense / 4 + expert / 2)
    assert m.weights == 2 * (dense + expert)


def test_cp_halves_activations_of_one_rank():
    a = memory_per_rank(TOY, micro_batch_tokens=1024, seq_len=1024, layers=[0])
    b = memory_per_rank(TOY, micro_batch_tokens=1024, seq_len=1024, cp=2, dp=1, layers=[0])
    # 512 tokens per rank, every term linear in this rank's tokens (scores: 5·a·s·T/cp)
    assert b.activations == pytest.approx(a.activations / 2)


def test_sp_off_keeps_10_th_whole_on_every_tp_rank():
    on = memory_per_rank(TOY, micro_batch_tokens=512, seq_len=512, tp=2, layers=[0])
    off = memory_per_rank(TOY, micro_batch_tokens=512, seq_len=512, tp=2, layers=[0],
                          sequence_parallel=False)
    # Korthikanti Eq. 1 vs Eq. 2: 10·T·h·(1 - 1/t) more bytes per layer
    assert off.activations - on.activations == pytest.approx(10 * 512 * 512 * 0.5)


@pytest.mark.parametrize("par, field", [
    ({"cp": 2, "ep": 1}, "schedule.seq_len"),          # seq 510 not a multiple of 4
    ({"ep": 4}, "parallel.ep"),                        # 4 > tp*cp*dp = 2
    ({"tp": 2, "etp": 4}, "parallel.etp"),
])
def test_bad_folding_is_one_line(tmp_path, par, field):
    path = two_gpu_scenario(tmp_path, parallel={"tp": 1, "pp": 1, "ep": 1, **par},
                            schedule={"seq_len": 510})
    with pytest.raises(InputError) as e:
        build_step(resolve(load_scenario(path)))
    assert e.value.field == field


def test_folded_ep_run_conserves_tokens(tmp_path):
    # tp 2, ep 2 folded over the TP pair (dp 1): each rank routes 256 of 512 tokens
    res, p = plan(tmp_path, tp=2, ep=2, sequence_parallel=True)
    assert res.layout.ep_groups == ((0, 1),) and res.layout.dp == 1
    assert (p.expert_tokens.sum(axis=1) == 512 * 2 * 2).all()   # x top-2 x 2 micro-batches
    assert np.all(p.expert_kept == p.expert_tokens)


@pytest.mark.parametrize("over", [
    ["parallel.zero=3", "parallel.pp=1"],                     # ZeRO-3 gathers over IB
    ["parallel.cp=2", "schedule.seq_len=8192"],
    ["parallel.tp=2", "parallel.sequence_parallel=true"],
    ["parallel.tp=2", "parallel.etp=2", "parallel.sequence_parallel=true", "parallel.ep=4",
     "routing.kind=uniform"],
])
def test_fast_path_follows_the_exact_engine(over):
    # measured: step -0.26 %, -0.04 %, -0.09 %, +0.25 %; zero and tp within 0.05 ms
    from moesim.wiring import simulate
    out = {}
    for mode in ("exact", "fast"):
        scn = load_scenario("mixtral-8x7b-ep8", over + [f"engine.mode={mode}", "model.layers=4",
                                                        "schedule.microbatches=2"])
        out[mode] = simulate(resolve(scn)).summary
    a, b = out["exact"], out["fast"]
    assert b["step_time_s"] == pytest.approx(a["step_time_s"], rel=0.01)
    for k in ("zero", "tp", "compute"):
        assert b["breakdown_s"][k] == pytest.approx(a["breakdown_s"][k], abs=5e-5)
    names = {s["name"] for s in b["shortcuts"]}
    assert "zero3_gathers_not_modeled" not in names


def test_new_parallel_fields_echo_only_when_set():
    # shipped scenarios' summary.json stays byte-identical: defaults are left out
    d = resolve(load_scenario("toy-cpu")).scenario.to_dict()["parallel"]
    assert not {"cp", "etp", "sequence_parallel"} & set(d)
    d = resolve(load_scenario("toy-cpu", ["parallel.etp=2", "parallel.ep=1", "parallel.tp=2",
                                          "cluster.params.gpus_per_node=4"])
                ).scenario.to_dict()["parallel"]
    assert d["etp"] == 2 and "cp" not in d
