"""Megatron-Core MoE pre-training on H100 as NVIDIA published or measured it: the rows of
``benchmarks/published_table.py`` for Qwen3-30B-A3B, Qwen3-235B-A22B and DeepSeek-V3 in
BF16 (sources beside each constant; the runs are ``published_table.RUNS``)."""

from __future__ import annotations

#: Megatron-Bridge's measured BF16 DeepSeek-V3 on 1024 H100: examples/model_verification_
#: cards/deepseek-v3/card.yaml (pretrain_performance.H100, last verified with NeMo 26.08.rc5,
#: Bridge 79308d0d): TP2 PP8 VP4 EP64, GBS 16384, MBS 1, steps 41-50 averaged
DSV3_H100_BF16 = {"step_s": 61.75613, "tokens": 1061.206, "tflops": 276.030}

#: Megatron-Bridge's published Qwen3 MoE pre-training on DGX-H100: (run, figure, source,
#: tokens/s per GPU, model TFLOP/s per GPU), from docs/performance-summary-archive.md
QWEN3_H100 = (
    ("qwen3-30b-a3b-16-h100", "Qwen3-30B-A3B, 16 H100 FP8-CS (EP16, HybridEP)",
     "Megatron-Bridge performance summary (NeMo 26.04.01, DGX-H100)", 8960.0, 206.0),
    ("qwen3-235b-256-h100-fp8", "Qwen3-235B-A22B, 256 H100 FP8-CS (TP2 PP8 VP4 EP32)",
     "Megatron-Bridge performance summary (NeMo 25.11, DGX-H100)", 1575.0, 233.0),
)


#: Megatron-Bridge's measured BF16 run of the same Qwen3-30B-A3B layout (16 H100, EP16,
#: HybridEP, MBS 1, GBS 1024, no EP overlap; CUDA graphs of the router and preprocessing):
#: skills/nemo-mbridge-perf-moe-comm-overlap/card.yaml at 7ded17da (PR 5094): step
#: 24,713.8 ms, 244.039 TFLOP/s per GPU; rank 0's Nsight profile: communication kernels
#: concurrent with GEMM/attention 9.079 ms = 0.11 % of the communication time, the union of
#: GPU-active intervals 22,820.667 ms
QWEN3_30B_BF16_MEASURED = {"step_s": 24.7138, "tflops": 244.039, "overlapped_comm_s": 9.079e-3,
                           "overlapped_share": 0.0011, "gpu_active_s": 22.820667}
#: the same card, EP overlap on (overlap_moe_expert_parallel_comm, delayed wgrad off): step
#: 20,992.030 ms, 287.305 TFLOP/s per GPU; profile: 3,958.997 ms of communication concurrent
#: with GEMM/attention = 36.55 % of it, GPU-active union 21,221.363 ms (longer than the timed
#: step: the profiled iteration is not the timed one, so step - union is an estimate)
QWEN3_30B_BF16_OVERLAP = {"step_s": 20.99203, "tflops": 287.305, "overlapped_comm_s": 3.958997,
                          "overlapped_share": 0.3655, "gpu_active_s": 21.221363}


#: the same layout measured with Megatron's all-to-all dispatcher (NCCL), BF16, CUDA
#: graphs off: eager 41.36 s (docs/training/cuda-graphs.md, PR 3868: iterations 5-8),
#: and with EP overlap 31.31 s (docs/training/communication-overlap.md: iterations 3-8,
#: moe_permute_fusion false; 41.25 s without the overlap in that run); Megatron-Bridge
#: 302976773
QWEN3_30B_A2A_S = (41.36, 31.31)


def tflops_per_gpu(d: dict) -> float:
    """Model TFLOP/s per GPU of a ``moesim run --json`` output: the step's model FLOPs (no
    recomputation) / step time / GPUs."""
    return d["model_flops"] / d["step_time_s"] / d["world"] / 1e12


def qwen3_30b_bf16_parts(m: dict = QWEN3_30B_BF16_MEASURED) -> dict:
    """A measured BF16 step's parts as the card's profile gives them, derived: the
    communication kernels' time = the time they overlap compute / the overlapped share;
    exposed = the rest of it; compute = the GPU-active union less the exposed
    communication; the timed step less the profiled union (an estimate of the GPU's idle
    time: the profiled iteration is not the timed one, and with the overlap on the union
    is the longer)."""
    comm = m["overlapped_comm_s"] / m["overlapped_share"]
    exposed = comm - m["overlapped_comm_s"]
    return {"communication kernels": comm, "exposed communication": exposed,
            "compute": m["gpu_active_s"] - exposed,
            "timed step less the profiled GPU-active union": m["step_s"] - m["gpu_active_s"]}


def qwen3_h100_figures(run) -> list[dict]:
    """Tokens/s and TFLOP/s per GPU of the Qwen3 MoE rows, with the step's parts."""
    out = []
    for name, figure, src, tokens, tflops in QWEN3_H100:
        d = run(name)
        if d is None:
            continue
        b = d["breakdown_s"]
        parts = {"compute": b["compute"],
                 "ep_dispatch+combine": b["ep_dispatch"] + b["ep_combine"],
                 "bubble": b.get("bubble", 0.0)}
        step_tokens = d["tokens_per_s"] * d["step_time_s"]      # GBS x sequence
        out.append({"figure": f"{figure}: tokens/s per GPU", "unit": "tokens/s",
                    "published": tokens, "moesim": d["tokens_per_s"] / d["world"],
                    "source": src})
        out.append({"figure": f"{figure}: step (published: GBS x sequence / GPUs / "
                    "tokens/s per GPU)", "unit": "s",
                    "published": step_tokens / d["world"] / tokens,
                    "moesim": d["step_time_s"], "source": src, "parts": parts})
        out.append({"figure": f"{figure}: TFLOP/s per GPU", "unit": "TFLOP/s",
                    "published": tflops, "moesim": tflops_per_gpu(d), "source": src})
    src = "Megatron-Bridge PR 5094 (MoE overlap card, measured)"
    for name, label, measured, ep_part, tflops_row in (
            ("qwen3-30b-a3b-16-h100-bf16", "no EP overlap", QWEN3_30B_BF16_MEASURED,
             "ep_dispatch+combine", True),
            ("qwen3-30b-a3b-16-h100-bf16-overlap", "EP overlap", QWEN3_30B_BF16_OVERLAP,
             "exposed ep_dispatch+combine", False)):
        d = run(name)
        if d is None:
            continue
        b = d["breakdown_s"]
        out.append({"figure": f"Qwen3-30B-A3B, 16 H100 BF16 (EP16, HybridEP, {label}): step",
                    "unit": "s", "published": measured["step_s"],
                    "moesim": d["step_time_s"], "source": src,
                    "parts": {"compute": b["compute"],
                              ep_part: b["ep_dispatch"] + b["ep_combine"],
                              "stall and idle": b.get("stall", 0.0) + b.get("idle", 0.0)},
                    "measured_parts": qwen3_30b_bf16_parts(measured)})
        if tflops_row:
            out.append({"figure": "Qwen3-30B-A3B, 16 H100 BF16: TFLOP/s per GPU",
                        "unit": "TFLOP/s", "published": measured["tflops"],
                        "moesim": tflops_per_gpu(d), "source": src})
    for name, figure, published in (
            ("qwen3-30b-a3b-16-h100-bf16-a2a", "the all-to-all dispatcher (NCCL), no EP "
             "overlap, eager", QWEN3_30B_A2A_S[0]),
            ("qwen3-30b-a3b-16-h100-bf16-a2a-overlap", "the all-to-all dispatcher, EP "
             "overlap (permute fusion off in the measured run)", QWEN3_30B_A2A_S[1])):
        d = run(name)
        if d is not None:
            b = d["breakdown_s"]
            out.append({"figure": f"Qwen3-30B-A3B, 16 H100 BF16, {figure}: step", "unit": "s",
                        "published": published, "moesim": d["step_time_s"],
                        "source": "Megatron-Bridge docs/training (measured)",
                        "parts": {"compute": b["compute"], "ep_dispatch+combine":
                                  b["ep_dispatch"] + b["ep_combine"]}})
    return out


def _deepseek_bf16(run) -> list[dict]:
    d = run("deepseek-v3-1024-h100-bf16")
    if d is None:
        return []
    src = "Megatron-Bridge DeepSeek-V3 model card (H100 BF16, measured)"
    b = d["breakdown_s"]
    return [{"figure": "DeepSeek-V3, 1024 H100 BF16 (GBS 16384, HybridEP): tokens/s per GPU",
             "unit": "tokens/s", "published": DSV3_H100_BF16["tokens"],
             "moesim": d["tokens_per_s"] / d["world"], "source": src},
            {"figure": "DeepSeek-V3, 1024 H100 BF16: step", "unit": "s",
             "published": DSV3_H100_BF16["step_s"], "moesim": d["step_time_s"], "source": src,
             "parts": {"compute": b["compute"],
                       "ep_dispatch+combine": b["ep_dispatch"] + b["ep_combine"],
                       "bubble": b.get("bubble", 0.0)}}]


def figures(run) -> list[dict]:
    """Every row of this module; ``run(name)``: the saved or fresh JSON output of the
    named run of ``published_table.RUNS`` (None when left out)."""
    return _deepseek_bf16(run) + qwen3_h100_figures(run)
