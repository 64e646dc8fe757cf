"""Part 7 of ``rl_moe_trainer.py``: published per-module and per-layer measurements of
Megatron-Core's MoE step, what the Pai-Megatron run's own script turns off, and the
host and the GPU as two clocks (``rl.train.host_dispatch: timeline``) on the Pai layouts
and NeMo RL v0.3's trainer passes. Nothing is fitted: each figure below is a published
measurement or a simulation with it."""

from __future__ import annotations

from pathlib import Path

from results_page import print_table  # this folder

ROOT = Path(__file__).resolve().parents[1]

#: (source, what it measured, the figure, moesim's counterpart)
PUBLISHED = (
    ("NVIDIA/TransformerEngine PR 1191 (2024-09-18)",
     "host time of one Megatron-Core linear module's forward, BF16, TP1",
     "TEColumnParallelLinear 140 us, 115 us after the PR; Megatron's ColumnParallelLinear 74 us",
     "eager: 16.1 us per module call; timeline: 115 us for each of linear_qkv, "
     "linear_proj, linear_fc1, linear_fc2"),
    ("NVIDIA/TransformerEngine issue 2053 (2025-08-11)",
     "host time of one Linear forward, hidden 2,048, 8,192 tokens, BF16, DGX H100 "
     "(Xeon 8480C)", "torch.nn.Linear 13.48 us (the TE row is cut off in the stored thread)",
     "an eager op: 16.1 us (PyTorch's operator benchmark)"),
    ("yanring/Megatron-MoE-ModelZoo issue 7 (2025-08-18)",
     "NVTX ranges of Qwen3-30B-A3B, 8 B200, EP8 TP1 PP1, MBS 1, all-to-all dispatcher, "
     "nsys: medians per instance (6,137 instances: one per MoE layer forward)",
     "MLP 7.22 ms; MOE_DISPATCH 2.62 ms; MOE_EXPERTS_COMP 2.19 ms; MOE_ROUTER_AND_PRE "
     "1.87 ms; nvte_cublas_gemm 13.7 us (645,099 calls); about 150 TFLOP/s per GPU",
     "the stored excerpt does not say whether the ranges are the host's or projected "
     "onto the GPU; not used as a constant (see the table below)"),
    ("NVIDIA-NeMo/Megatron-Bridge PR 5225 (2026-08-01); NVIDIA/Megatron-LM PR 5728",
     "Qwen3-30B-A3B pre-training on 16 H100, BF16, NVIDIA's tuned recipes",
     "244.0 model TFLOP/s/GPU (all-to-all, no overlap) -> 287.3 (overlap); HybridEP "
     "299.4; the H100 BF16 recipe 240.5",
     "context: the recipes' sequence and batch are not in the stored excerpts, so no "
     "scenario is written for them"),
)

#: what the Pai run's script leaves at Megatron's default (alibaba/Pai-Megatron-Patch
#: examples/qwen3/run_mcore_qwen3.sh at 0f5c122, A3B branch; Megatron-LM main 6a6cd478,
#: 2025-06-18, the month of the Megatron-LM-250624 snapshot the script puts on PYTHONPATH)
PAI_SCRIPT = (
    ("moe_permute_fusion", "not passed: False (transformer_config.py)",
     "unfused permute: routing_map.T, masked_select of the token indices and of the probs "
     "(each a host sync: its output size is data-dependent), index_select; unpermute: "
     "zeros + scatter_add_; sort_chunks_by_idxs: split + cat. The same HBM bytes as the "
     "fused kernels to first order; two more host syncs per MoE layer forward"),
    ("moe_router_load_balancing_type", "aux_loss, coefficient 1e-3",
     "switch_load_balancing_loss_func over [tokens, experts] fp32 scores: a few small "
     "kernels per layer (moesim's router_aux_stats)"),
    ("moe_expert_capacity_factor", "1.0 (the issue's run), no pad",
     "cuda_sync_point moves to before_permutation_1; experts at most balanced rows"),
    ("attention backend", "fused (cuDNN) unless FL=true", "Part 4's cuDNN row"),
)


def part7() -> None:
    print()
    print("### Part 7: published per-module and per-layer measurements, and two mechanisms")
    print()
    print_table(("source", "what", "figure", "in moesim"), PUBLISHED)
    print()
    print("What the Pai-Megatron run's script leaves at Megatron's defaults "
          "(alibaba/Pai-Megatron-Patch examples/qwen3/run_mcore_qwen3.sh at 0f5c122; "
          "Megatron-LM 6a6cd478 moe_utils.py permute / unpermute / sort_chunks_by_idxs):")
    print()
    print_table(("setting", "the Pai run", "what Megatron then runs"), PAI_SCRIPT)
    waves()
    nemo_timeline()


#: CTA tiles a Hopper BF16 cuBLAS GEMM commonly runs (one CTA per SM at a time)
TILES = ((128, 128), (128, 256))
#: Transformer Engine's GroupedLinear runs its per-expert GEMMs round-robin on this many
#: compute streams (NVIDIA/TransformerEngine ecaa1af5, 2025-05,
#: transformer_engine/common/include/transformer_engine/gemm.h ``num_streams = 4``;
#: common/gemm/cublaslt_gemm.cu ``nvte_multi_stream_cublas_gemm``)
TE_STREAMS = 4


def waves() -> None:
    """Wave quantisation of the expert GEMMs (output tiles over 132 SMs), one GEMM alone
    and four in flight as TE's multi-stream grouped GEMM runs them."""
    import math

    shapes = (("Pai TP1 PP2 EP8 (16 local experts)", 4096),
              ("Pai TP1 PP4 EP4 (32 local experts)", 2048),
              ("NeMo RL v0.3 training row (TP2 SP, EP8)", 1024),
              ("NeMo RL v0.3 log-prob row (16k tokens)", 4096))
    sms = 132
    print()
    print("Wave quantisation of the expert GEMMs (forward shapes; output tiles over the "
          "132 SMs of an H100/H800; efficiency = tiles / (waves x 132)), one GEMM alone and "
          f"{TE_STREAMS} in flight as Transformer Engine's GroupedLinear issues them:")
    print()
    print("| layout | GEMM (m x n) | tile | tiles | waves alone | efficiency alone | "
          f"efficiency, {TE_STREAMS} in flight |")
    print("|---|---|---|---:|---:|---:|---:|")
    for label, m in shapes:
        for n in (1536, 2048):
            for tm, tn in TILES:
                t = math.ceil(m / tm) * math.ceil(n / tn)
                w = math.ceil(t / sms)
                w4 = math.ceil(TE_STREAMS * t / sms)
                print(f"| {label} | {m} x {n} | {tm}x{tn} | {t} | {w} | "
                      f"{t / (w * sms):.0%} | {TE_STREAMS * t / (w4 * sms):.0%} |")
    print()
    print("With four GEMMs in flight the tail wave costs at most a quarter of the tiles' "
          "time (73 % at worst, one shape and tile); the roofline already prices these "
          "GEMMs at 46-63 % of the BF16 peak (Part 3), and closing the Pai gap with them "
          "alone would take 2.6-3.0 x slower expert GEMMs: wave quantisation is not it.")


def _row(c, row: int, ep: int):
    from moesim.program import host_dispatch as hd
    from moesim.rl.host_timeline import part_gpu_s
    from moesim.wiring import resolve

    c._row_s(row, None)
    spec = resolve(c.scn).model
    gp = c.memo[("layers", row, None)] / spec.layers
    gpu, local, tp = part_gpu_s(c.scn, row, gp, ep)
    layers = sum(1 for i in range(spec.layers) if spec.is_moe_layer(i))
    return {
        "gpu": gp, "host": hd.layer_host_s(local, tp), "host_te": hd.layer_host_s(local, tp, True),
        "eager": hd.pass_extra_s(layers, gp, hd.layer_host_s(local, tp)),
        "eager_te": hd.pass_extra_s(layers, gp, hd.layer_host_s(local, tp, True)),
        "tl": max(0.0, hd.timeline_extra_s(gpu, local, tp, layers, te=False)),
        "tl_te": max(0.0, hd.timeline_extra_s(gpu, local, tp, layers, te=True)),
    }


def nemo_timeline() -> None:
    """The two clocks on NeMo RL v0.3's trainer passes (forward of one row)."""
    from moesim.rl.engine_costs import EngineTrainerCosts, gpus_per_node
    from moesim.rl.run import resolve_rl

    setup = resolve_rl(ROOT / "scenarios" / "grpo-qwen3-30b-a3b-nemo-v03.yaml",
                       ("rl.train.sort_chunks=true",))
    tr = setup.scenario.rl.train
    c = EngineTrainerCosts(setup.scenario, 64, gpus_per_node(setup), tp=2, pp=1, ep=8,
                           seq_len=setup.seq_len, zero=1)
    print()
    print("The host and the GPU as two clocks (moesim.program.host_dispatch "
          "timeline_pass_s) on NeMo RL v0.3's Qwen3-30B-A3B passes (TP2 EP8, 16 local "
          "experts, sort_chunks on), seconds per forward pass of one row over 48 MoE "
          "layers:")
    print()
    print("| pass | tokens per row | GPU us per layer (simulated) | host us per layer "
          "(eager) | with TE modules at 115 us | max(G, H) adds | max(G, H), TE prices | "
          "two clocks | two clocks, TE prices |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for what, row in (("training micro-batch", setup.seq_len),
                      ("log-prob micro-batch", tr.logprob_mb_tokens or setup.seq_len)):
        r = _row(c, row, 8)
        print(f"| {what} | {row:,} | {r['gpu'] * 1e6:,.0f} | {r['host'] * 1e6:,.0f} | "
              f"{r['host_te'] * 1e6:,.0f} | {r['eager']:.4f} | {r['eager_te']:.4f} | "
              f"{r['tl']:.4f} | {r['tl_te']:.4f} |")
    # what-if, not a constant: the ModelZoo issue's MLP range median taken as one MoE
    # layer's forward host time (a B200 system's CPU, 4,096 tokens a GPU)
    zoo = 7.22e-3
    rows = {"training micro-batch": 64, "log-prob micro-batch": 32}
    adds = []
    for what, row in (("training micro-batch", setup.seq_len),
                      ("log-prob micro-batch", tr.logprob_mb_tokens or setup.seq_len)):
        c._row_s(row, None)
        gp = c.memo[("layers", row, None)] / 48
        adds.append((what, rows[what] * 48 * max(0.0, zoo - gp)))
    print()
    print("A what-if, not a constant: were Megatron-MoE-ModelZoo issue 7's MLP range "
          f"median ({zoo * 1e3:.2f} ms, 8 B200, 4,096 tokens a GPU) the host's time for one "
          "MoE layer's forward, max(G, H) would add " + "; ".join(
              f"{s:.1f} s over the {rows[w]} {w}es of a step" for w, s in adds)
          + ": the training phase still short of the published 50 s.")
    print()
    print("Two clocks: after Megatron's per-layer host sync (cuda_sync_point "
          "before_ep_alltoall) every later kernel starts only once the host has issued "
          "it, so the host's time to reach a kernel and the GPU's work from it add up "
          "(max over kernels of h_j + g_j..) where max(G, H) lets them overlap anywhere in "
          "the layer. On these passes the GPU work after the sync (the dispatch, the "
          "experts, the combine) covers the host's issue of the layer's tail, so the sync "
          "adds little; Transformer Engine's module calls at their published 115 us make "
          "the training micro-batch's forward host-bound, the 16k-token log-prob rows "
          "stay GPU-bound.")


def pai_timeline(found) -> None:
    """The two clocks on the Pai layouts (TP1, moesim run's step): seconds per step the
    forward passes on the 1F1B path would gain, the all-to-all per call from the
    simulated critical path."""
    from moesim.collectives.nccl.launch import CALL_HOST_S
    from moesim.program import host_dispatch as hd
    from moesim.program.inventory import layer_ops

    syncs: list[tuple[str, float]] = []
    print()
    print("The same two clocks on the Pai layouts (TP1; the all-to-all per call from the "
          "simulated critical path; forward passes on the 1F1B path: m + pp - 1 per stage):")
    print()
    print("| layout | GPU us per layer forward | host us (eager / TE prices) | "
          "two clocks add, s per step | with TE prices, s per step |")
    print("|---|---:|---:|---:|---:|")
    for label, pp, m, _sets, _step, _pub, res, _ks, _per, crit in found:
        layers = sum(res.model.is_moe_layer(i) for i in range(res.model.layers)) // pp
        call = (crit.get("ep_dispatch", 0.0) + crit.get("ep_combine", 0.0)) / (
            4 * layers * (m + pp - 1))
        gpu: dict[str, float] = {}
        for o in layer_ops(res, 0, "fwd"):
            for k in o.kernels:
                p = hd.part_of(o.op, k.name)
                gpu[p] = gpu.get(p, 0.0) + float(res.compute.time_s(k))
        gpu["dispatch all-to-alls"] = gpu.get("dispatch all-to-alls", 0.0) + call
        gpu["combine all-to-all and unpermute"] = gpu.get(
            "combine all-to-all and unpermute", 0.0) + call
        local = res.model.n_experts // res.scenario.parallel.ep
        slots = m + pp - 1
        tl = slots * max(0.0, hd.timeline_extra_s(gpu, local, 1, layers, te=False))
        te = slots * max(0.0, hd.timeline_extra_s(gpu, local, 1, layers, te=True))
        print(f"| {label} | {sum(gpu.values()) * 1e6:,.0f} | "
              f"{hd.layer_host_s(local, 1) * 1e6:,.0f} / "
              f"{hd.layer_host_s(local, 1, True) * 1e6:,.0f} | {tl:.3f} | {te:.3f} |")
        syncs.append((label, 2 * layers * slots * (CALL_HOST_S + res.compute.launch_overhead_s)))
    print()
    print("The Pai run's unfused permutation (no --moe-permute-fusion) moves the same HBM "
          "bytes as the fused kernels to first order; its two masked_select calls per MoE "
          "layer forward each sync the host, bounded as Part 4 bounds the dispatcher's "
          "sync (one host call and one launch each): " + "; ".join(
              f"{lab} {s:.3f} s per step" for lab, s in syncs) + ".")
