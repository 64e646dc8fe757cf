"""Quantised and 2:4-sparse kernels and steps against their published figures (issue 41,
items 2 and 3). Writes docs/results/quantisation.md.

    python benchmarks/quant_published.py                # prints the comparison
    python benchmarks/quant_published.py --write-docs   # and writes the page

Kernel figures (one GEMM priced by the compute model a scenario gets with the knob on,
its fixed launch cost left out, as the published GPU times leave it out):

- ``int4`` (W4A16, Marlin): IST-DASLab/marlin README @2f6d7c10: on "a large matrix that
  can be ideally partioned on an NVIDIA A10" at group size 128, "the maximum possible
  3.87x speedup up to batchsizes around 16-32" over FP16. The matrix of that plot
  (the repository's plotting script: N = 72·256, K = 4·N) priced on moesim's A100, the
  Ampere device it has (no A10): the speed-up over the BF16 GEMM at 1, 16 and 32 rows.
- ``fp8`` (per-tensor): NVIDIA/TransformerEngine
  ``docs/examples/gemm_profiling/gemm_profiling.rst`` @1609c890e: the forward GEMMs of a
  hidden 4096, FFN 16384 layer at M = 15,872 tokens on an H200 NVL, summed: BF16 10.632
  ms, FP8 per-tensor current scaling (cuBLAS) 5.577 ms.
- ``fp8-block``: deepseek-ai/DeepGEMM README @327ec92f, "Normal GEMMs for dense models",
  H800: M 64, N 7168, K 16384 at 336 TFLOP/s (moesim's catalog row, priced back).
- ``2:4``: pytorch/tutorials ``advanced_source/semi_structured_sparse.py`` @065c9d23:
  an FP16 Linear 10240 → 3072 on 3072 rows, A100 80GB: dense 0.870 ms, CUTLASS 2:4
  sparse 0.630 ms.

End-to-end figures (a serving step with the knob off and on; moesim's fast engine):

- ``int4``, ``int8`` weight-only, ``fp8`` (per-tensor W8A8) and ``int4`` + ``2:4``:
  torchao's batch-1 decode of Llama-3-8B (``torchao/_models/llama/generate.py``:
  ``torch.compile``d, CUDA graphs), tokens/s: H100 (pytorch/ao
  ``torchao/quantization/README.md`` @fd6e4b1f, Llama-3.1-8B): BF16 126.90, int8wo
  198.85, int4wo-64 241.39, float8dq (PerTensor) 116.40; A100 80GB (the same README's
  Llama-3-8B rows, and ``torchao/sparsity/README.md`` @0021c2f0): BF16 95.64, int8wo
  153.03, int4wo-64 180.80, int4wo-64-sparse-marlin 226.02. moesim: the ``llama-3.1-8b``
  preset (Llama-3-8B's shape) decoding one request with a 256-token cache on one GPU,
  CUDA graphs on. Their INT4 is tinygemm's with a BF16 scale and zero per group of 64
  (0.5 bits of them per weight, against the 0.125 of moesim's Marlin group-128 format).
- ``fp8-block`` and ``int8`` weight-only: Qwen's speed benchmark of Qwen3
  (qwen.readthedocs.io "Speed Benchmark"; QwenLM/Qwen3
  ``docs/source/getting_started/speed_benchmark.md``): Qwen3-0.6B on one H20 with SGLang
  0.4.6.post1, batch 1, input length 1, 2048 tokens generated: BF16 414.17 tokens/s, FP8
  (block-wise 128x128) 458.03, GPTQ-Int8 344.92. moesim: the ``qwen3-0.6b`` preset
  decoding one request at a 1024-token context (the run's mean), CUDA graphs on.
- ``2:4``: the same tutorial's BERT-base (seq 384) inference on A100, eager: batch 16
  19.35 → 15.74 ms (1.23x), batch 64 72.71 → 59.41 ms (1.22x). moesim: a BERT-base-sized
  dense model (12 layers, hidden 768, FFN 3072, non-gated, vocab 28996) as one prefill
  step of 384-token prompts on one A100 (causal attention: moesim's attention kernels
  are causal; BERT's are not).

End-to-end ``fp8`` and ``int8`` W8A8: TensorRT-LLM's quantisation blog
(nvidia.github.io/TensorRT-LLM/blogs/quantization-in-TRT-LLM.html): LLaMA-v2-7B on one
H100, input 1024, output 128, speed-up over FP16 at batch 1 and 8: FP8 1.51x and 1.40x,
INT8 SmoothQuant 1.47x and 1.32x. moesim: a request's time, one prefill and 128 decode
steps at the mean context, CUDA graphs off (the blog does not say).

End-to-end ``mxfp8``: NVIDIA's DeepSeek-V3 pre-training on 256 B200 in MXFP8
(NVIDIA-NeMo/Megatron-Bridge ``docs/performance-summary.md`` @00b7660be: 2139 tokens/s per
GPU), the shipped scenario ``deepseek-v3-256-b200`` (also on published.md).

KV cache (``serve.kv_dtype``): vLLM's log for Qwen3-0.6B on A100 (vllm-project/vllm PR
#24577, 2025-09-10): 69.66 GiB of KV cache hold 652,144 BF16 tokens, and FP8 doubles the
concurrency; moesim's bytes per token divide the same budget.

Calibrated kernel models (moesim/compute/quant_kernels.py; one figure each, marked
"(calibration)" on the page, every other row of the same kernel a check):

- ``nvfp4`` on B200: vLLM's CUTLASS NVFP4 GEMM at N = 6144, K = 4096, 16384 rows
  (vllm-project/vllm PR #20646, "Before" table); checks: its other batches, its
  N = 4096 table at batch 1, FlashInfer issue #1732's M = 1 GEMM.
- ``int4`` / ``int8`` weight-only on H100: Marlin W4A16 at m = 1, N = K = 8192
  (inclusionAI/humming PR #2); check: Marlin W8A16 of the same table.

Held-out kernel figures (none of them is in a moesim table):

- ``fp8-block``: DeepGEMM on an H100 80GB HBM3 timed by vLLM's
  ``benchmark_fp8_block_dense_gemm_table.py`` (vllm-project/vllm PR #13917, 2025-02-26).
- ``mxfp8``: FlashInfer's ``mm_mxfp8`` (CUTLASS, autotuned) on B200
  (flashinfer-ai/flashinfer PR #2464, 2026-02-02).
- ``nvfp4``: FlashInfer's ``mm_fp4`` on B200 at M = 1 (flashinfer-ai/flashinfer issue
  #1732, 2025-09-19) and M = 32 (CuTeDSL, another kernel: vllm-project/vllm PR #42235,
  2026-05-14); cuBLAS's FP4 x FP4 (MXFP4, another kernel and format) on B200
  (deepseek-ai/DeepGEMM PR #348, 2026-06-01).
- ``int8`` W8A8: sgl-kernel's and vLLM's INT8 GEMMs on A100 (sgl-project/sglang PR
  #2752, 2025-01-06; ``sgl-kernel/benchmark/bench_int8_gemm.py``).
- ``int8`` weight-only: vLLM's Marlin W8A16 and PyTorch's FP16 GEMM on an H100 at
  N = K = 8192, m = 1-4 (inclusionAI/humming PR #2, 2026-03-24), TFLOP/s (the table
  whose W4A16 column calibrates Marlin's per-iteration cost).

End-to-end ``nvfp4``: SGLang's DeepSeek-V3 decode on GB200 NVL72 with FP8 MoE and with
NVFP4 MoE + FP8 KV (LMSYS blog, Part II, 2025-09-25), the shipped scenarios
``deepseek-v3-decode-gb200`` and ``deepseek-v3-decode-gb200-nvfp4``.

Not reproduced (the page says what was searched): an FP8 KV cache's throughput under
load. Nothing is fitted: error = (moesim - published) / published.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from moesim.compute.base import Kernel
from moesim.compute.catalog import price
from moesim.compute.devices import DEVICES, get_device
from moesim.compute.select import compute_model


def gemm(m: int, n: int, k: int, name: str = "dense_gemm") -> Kernel:
    """A forward BF16 weight GEMM as the recipe writes it (moesim.model.kernels.make)."""
    return Kernel(name, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m=m, n=n, k=k,
                  kind="gemm", pass_="fwd", kclass="gemm")


def work_s(section: dict, device: str, kernel: Kernel) -> tuple[float, str]:
    """Seconds of ``kernel`` without its launch cost, and what priced it."""
    model = compute_model(section, "benchmarks/quant_published.py", get_device(device))
    p = price(model, kernel)
    launch = getattr(model, "roofline", model).per_launch_s(kernel) * max(kernel.count, 1)
    return p.time_s - launch, p.source


def err(got: float, want: float) -> str:
    return f"{100 * (got - want) / want:+.1f} %"


# ------------------------------------------------------------------ kernel figures
def marlin_rows() -> list[list[str]]:
    n = 72 * 256
    k = 4 * n
    rows = []
    for m in (1, 16, 32):
        dense, _ = work_s({}, "A100", gemm(m, n, k))
        q, src = work_s({"weights": "int4"}, "A100", gemm(m, n, k))
        rows.append(["int4 W4A16 (Marlin)", f"A100 (published: A10), m={m}, n={n}, k={k}",
                     "speed-up over BF16 3.87x", f"{dense / q:.2f}x", err(dense / q, 3.87),
                     src])
    return rows


TE_SHAPES = {"qkv": (4096, 12288), "attn_out": (4096, 4096), "mlp_up": (4096, 16384),
             "mlp_down": (16384, 4096)}


def te_rows() -> list[list[str]]:
    m = 31 * 512
    out = []
    for label, section, want in (("bf16", {}, 10.632), ("fp8 per-tensor",
                                                        {"weights": "fp8"}, 5.577)):
        total, srcs = 0.0, set()
        for k, n in TE_SHAPES.values():
            t, src = work_s(section, "H200-NVL", gemm(m, n, k))
            total += t
            srcs.add(src)
        out.append([label if label == "bf16" else "fp8 (per-tensor)",
                    "H200-NVL, 4 forward GEMMs, M=15872", f"{want:.3f} ms",
                    f"{total * 1e3:.3f} ms", err(total * 1e3, want), "/".join(sorted(srcs))])
    return out


def deepgemm_row() -> list[str]:
    m, n, k = 64, 7168, 16384
    want = 2 * m * n * k / 336e12
    t, src = work_s({"weights": "fp8-block"}, "H800", gemm(m, n, k))
    return ["fp8-block (DeepGEMM; the catalog's own row, not a check)",
            f"H800, m={m}, n={n}, k={k}", f"{want * 1e6:.1f} us",
            f"{t * 1e6:.1f} us", err(t, want), src]


def timed_rows(label: str, section: dict, device: str,
               rows: list[tuple[int, int, int, float]]) -> list[list[str]]:
    """One row per published (m, n, k, seconds) of one kernel on ``device``."""
    out = []
    for m, n, k, want in rows:
        t, src = work_s(section, device, gemm(m, n, k))
        mark = " **(calibration)**" if (label, m) in CALIBRATION else ""
        out.append([label + mark, f"{device}, m={m}, n={n}, k={k}", f"{want * 1e6:.1f} us",
                    f"{t * 1e6:.1f} us", err(t, want), src])
    return out


#: DeepGEMM's block-scaled FP8 GEMM on an H100 80GB HBM3, measured by vLLM's
#: benchmark_fp8_block_dense_gemm_table.py (vllm-project/vllm PR #13917, 2025-02-26,
#: "DeepGEMM Implementation" table, Time (us)): shapes outside moesim's DeepGEMM rows
DEEPGEMM_H100 = [(64, 18432, 7168, 70.4e-6), (128, 18432, 7168, 69.3e-6),
                 (1024, 18432, 7168, 279.0e-6), (64, 7168, 18432, 69.4e-6),
                 (128, 7168, 18432, 71.9e-6), (1024, 4096, 7168, 89.7e-6),
                 (2048, 4096, 7168, 175.1e-6)]
#: FlashInfer's mm_mxfp8 (CUTLASS, autotuned) on B200 (flashinfer-ai/flashinfer PR #2464,
#: 2026-02-02, "achieved tflops"): (m, n, k, TFLOP/s)
MXFP8_B200 = [(1024, 2048, 1024, 789.981), (1024, 4096, 4096, 2014.903),
              (8192, 8192, 4096, 3200.870), (16384, 16384, 16384, 3099.690)]
#: NVFP4 GEMMs on B200. The calibration (moesim.compute.quant_kernels): vLLM's CUTLASS
#: NVFP4 GEMM without the activation quantisation ("nvfp4-noquant"), vllm-project/vllm PR
#: #20646 (2025-07-08, "Before" table of bench_nvfp4_gemm.py, an SM100 GPU), N=6144 K=4096
#: at batch 16384, 3904.33 TFLOP/s. Checks: the same table's other batches and its
#: N=4096 K=4096 table at batch 1 (2.959913); flashinfer-ai/flashinfer issue #1732
#: (2025-09-19; FlashInfer 0.3.1 mm_fp4, CUTLASS backend, do_bench_cudagraph): M=1, N=K=8192
#: reaches 1.78 TB/s of FP4 weight bytes (N·K/2). Other kernels, shown, not checks of the
#: CUTLASS model: vllm-project/vllm PR #42235 (comment of 2026-05-14, "FlashInfer NVFP4
#: GEMM Results", SM100, N=7168, K=2048): M=32 at 290.41 TFLOP/s (CuTeDSL, best); FP4 x FP4
#: in cuBLAS (deepseek-ai/DeepGEMM PR #348, 2026-06-01, "cBLT TFLOPS" column, cublasTest
#: 13.3, MXFP4: E8M0 scales per 32): 4096x4096x7168 at 3939, 8192^3 at 5239
VLLM_20646_N6144 = [(1, 4.439497), (16, 71.160187), (64, 281.971021), (128, 549.526976),
                    (256, 1102.033286), (512, 2187.995534), (1024, 2894.987191),
                    (2048, 3411.463557), (4096, 3645.594842), (8192, 3778.760919),
                    (16384, 3904.329097)]
NVFP4_B200 = {
    "nvfp4 (vLLM's CUTLASS, N=6144 table)": [
        (m, 6144, 4096, 2 * m * 6144 * 4096 / (tf * 1e12)) for m, tf in VLLM_20646_N6144],
    "nvfp4 (vLLM's CUTLASS, N=4096 table)": [(1, 4096, 4096, 2 * 4096 ** 2 / 2.959913e12)],
    "nvfp4 (FlashInfer CUTLASS)": [(1, 8192, 8192, 8192 * 8192 * 0.5 / 1.78e12)],
    "nvfp4 (FlashInfer CuTeDSL; another kernel)": [
        (32, 7168, 2048, 2 * 32 * 7168 * 2048 / 290.41e12)],
    "fp4 (cuBLAS, MXFP4; another kernel and format)": [
        (4096, 4096, 7168, 2 * 4096 * 4096 * 7168 / 3939e12),
        (8192, 8192, 8192, 2 * 8192 ** 3 / 5239e12)],
}
#: the calibration rows of moesim.compute.quant_kernels (label, m): marked on the page
CALIBRATION = {("nvfp4 (vLLM's CUTLASS, N=6144 table)", 16384),
               ("int4 W4A16 (Marlin, vLLM)", 1)}
#: INT8 W8A8 GEMMs on A100 (sgl-project/sglang PR #2752, 2025-01-06,
#: sgl-kernel/benchmark/bench_int8_gemm.py): (m, n, k, provider, its "GB/s" figure), which
#: the script computes as ((2MNK - MN)·1 + 3MN·4)·1e-9 / seconds
INT8_A100 = [(2048, 4096, 8192, "sgl-kernel", 498995.824151),
             (2048, 4096, 8192, "vLLM cutlass_scaled_mm", 459761.520775),
             (1024, 8192, 21760, "sgl-kernel", 507601.549671),
             (2048, 8192, 21760, "sgl-kernel", 501544.442461)]


#: Marlin's weight-only kernels (vLLM's marlin-w4a16 and marlin-w8a16, channelwise scales,
#: FP16 activations) and PyTorch's FP16 GEMM on an H100, N = K = 8192 (inclusionAI/humming
#: PR #2, mgoin, 2026-03-24, "Kernel Benchmarks", TFLOP/s): (m, TFLOP/s). W4A16 at m = 1
#: is the calibration of moesim.compute.quant_kernels; W4A16 at m = 2, 4 stream the same
#: bytes (neighbours of the calibration); W8A16 is the check
MARLIN_W4A16_H100 = [(1, 4.98), (2, 10.02), (4, 19.85)]
MARLIN_W8A16_H100 = [(1, 3.46), (2, 6.87), (4, 13.75)]
TORCH_FP16_H100 = [(1, 2.30), (2, 4.63), (4, 9.26)]


def held_out_rows() -> list[list[str]]:
    rows = timed_rows("fp8-block (DeepGEMM, vLLM's run)", {"weights": "fp8-block"}, "H100",
                      DEEPGEMM_H100)
    rows += timed_rows("mxfp8 (FlashInfer CUTLASS)", {"weights": "mxfp8"}, "B200",
                       [(m, n, k, 2 * m * n * k / (tf * 1e12)) for m, n, k, tf in MXFP8_B200])
    for label, published in NVFP4_B200.items():
        rows += timed_rows(label, {"weights": "nvfp4"}, "B200", published)
    rows += timed_rows("bf16 (torch FP16 GEMM)", {}, "H100",
                       [(m, 8192, 8192, 2 * m * 8192 ** 2 / (tf * 1e12))
                        for m, tf in TORCH_FP16_H100])
    for label, w, table_ in (("int4 W4A16 (Marlin, vLLM)", "int4", MARLIN_W4A16_H100),
                             ("int8 W8A16 (Marlin, vLLM)", "int8", MARLIN_W8A16_H100)):
        rows += timed_rows(label, {"weights": w}, "H100",
                           [(m, 8192, 8192, 2 * m * 8192 ** 2 / (tf * 1e12))
                            for m, tf in table_])
    for m, n, k, who, v in INT8_A100:
        want = ((2 * m * n * k - m * n) + 12 * m * n) / (v * 1e9)
        rows += timed_rows(f"int8 W8A8 ({who})", {"weights": "int8", "activations": "int8"},
                           "A100", [(m, n, k, want)])
    return rows


def sparse_rows() -> list[list[str]]:
    m, n, k = 3072, 3072, 10240
    d, sd = work_s({}, "A100", gemm(m, n, k))
    s, ss = work_s({"sparsity": "2:4"}, "A100", gemm(m, n, k))
    return [["bf16 dense", f"A100, m={m}, n={n}, k={k}", "0.870 ms", f"{d * 1e3:.3f} ms",
             err(d * 1e3, 0.870), sd],
            ["2:4 (CUTLASS)", f"A100, m={m}, n={n}, k={k}", "0.630 ms", f"{s * 1e3:.3f} ms",
             err(s * 1e3, 0.630), ss]]


# -------------------------------------------------------------- end-to-end figures
BERT_BASE = ("{layers: 12, hidden: 768, heads: 12, kv_heads: 12, head_dim: 64, "
             "vocab: 28996, attention: mha, dense_ffn: 3072, n_experts: 0, gated: false}")
TOPOLOGY = {"A100": "hgx-a100", "H100": "dgx-h100", "H20": "dgx-h100"}
#: torchao's batch-1 decode of Llama-3(.1)-8B, tokens/s: (device, technique) -> (moesim
#: --set values, published); the first row of a device is its BF16 baseline
TORCHAO = {
    "H100": [("bf16", [], 126.90), ("int8wo", ["compute.weights=int8"], 198.85),
             ("int4wo-64", ["compute.weights=int4"], 241.39),
             ("float8dq per-tensor", ["compute.weights=fp8"], 116.40)],
    "A100": [("bf16", [], 95.64), ("int8wo", ["compute.weights=int8"], 153.03),
             ("int4wo-64", ["compute.weights=int4"], 180.80),
             ("int4wo-64-sparse-marlin", ["compute.weights=int4", "compute.sparsity=2:4"],
              226.02)],
}


def scenario(folder: Path, name: str, model: str, serve: str, device: str = "A100") -> Path:
    p = folder / f"{name}.yaml"
    p.write_text(f"""name: {name}
seed: 0
cluster: {{topology: {TOPOLOGY[device]}, nodes: 1, params: {{gpus_per_node: 1}},
          device: {device}, network: flow}}
model: {model}
routing: {{kind: uniform}}
compute: {{kind: catalog}}
engine: {{mode: fast}}
serve: {serve}
""")
    return p


def step_s(path: Path, sets: list[str]) -> float:
    from moesim.serve.run import resolve_serve, simulate_serve
    res, cfg = resolve_serve(path, sets)
    return float(simulate_serve(res, cfg, spans=False).summary["step_time_s"])


def torchao_rows(folder: Path) -> list[list[str]]:
    rows = []
    for dev, techniques in TORCHAO.items():
        p = scenario(folder, f"llama3-8b-{dev}", "{preset: llama-3.1-8b}",
                     "{phase: decode, batch_per_gpu: 1, prompt: 256, context: 256, "
                     "cuda_graphs: true}", dev)
        base_s, base_pub = None, None
        for label, sets, pub in techniques:
            t = step_s(p, sets)
            base_s, base_pub = (t, pub) if base_s is None else (base_s, base_pub)
            got = 1 / t
            speed = f" = {got * base_s:.2f}x" if sets else ""
            pspeed = f" = {pub / base_pub:.2f}x" if sets else ""
            rows.append([label, f"Llama-3-8B decode, batch 1, {dev}",
                         f"{pub:.1f} tok/s{pspeed}", f"{got:.1f} tok/s{speed}",
                         err(got, pub) + (f" (speed-up {err(got * base_s, pub / base_pub)})"
                                          if sets else "")])
    return rows


#: Qwen's speed benchmark of Qwen3 (qwen.readthedocs.io "Speed Benchmark", the source
#: docs/source/getting_started/speed_benchmark.md of QwenLM/Qwen3): Qwen3-0.6B on one H20
#: 96GB with SGLang 0.4.6.post1, batch 1, input length 1, 2048 generated tokens, tokens/s
#: = (prompt + generated) / time: BF16 414.17, FP8 (Qwen3-*-FP8: block-wise 128x128
#: fine-grained FP8) 458.03, GPTQ-Int8 (weight-only) 344.92. moesim: the qwen3-0.6b preset
#: decoding one request at the mean context of the run (1024), CUDA graphs on (SGLang's
#: default at batch 1); tokens/s = 1 / step
QWEN_H20 = [("bf16", [], 414.17), ("fp8-block (Qwen3-FP8)", ["compute.weights=fp8-block"],
                                    458.03),
            ("int8 weight-only (GPTQ-Int8)", ["compute.weights=int8"], 344.92)]


def qwen_rows(folder: Path) -> list[list[str]]:
    p = scenario(folder, "qwen3-0.6b-h20", "{preset: qwen3-0.6b}",
                 "{phase: decode, batch_per_gpu: 1, prompt: 1, context: 1024, "
                 "cuda_graphs: true}", "H20")
    rows, base_s, base_pub = [], None, None
    for label, sets, pub in QWEN_H20:
        t = step_s(p, sets)
        if base_s is None:
            base_s, base_pub = t, pub
        sp = f" = {base_s / t:.2f}x" if sets else ""
        psp = f" = {pub / base_pub:.2f}x" if sets else ""
        rows.append([label, "Qwen3-0.6B decode, batch 1, H20 (SGLang)",
                     f"{pub:.1f} tok/s{psp}", f"{1 / t:.1f} tok/s{sp}",
                     err(1 / t, pub) + (f" (speed-up {err(base_s / t, pub / base_pub)})"
                                        if sets else "")])
    return rows


#: SGLang's DeepSeek-V3 decode on GB200 NVL72, output tokens/s per GPU (LMSYS blog
#: "Deploying DeepSeek on GB200 NVL72 with PD and Large Scale EP (Part II)", 2025-09-25):
#: BF16 attention and FP8 MoE 9,087; FP8 KV cache and NVFP4 MoE 13,386. moesim: the
#: shipped scenarios of these two runs (their headers give what each stands for)
SGLANG_GB200 = (("deepseek-v3-decode-gb200", 9087.0), ("deepseek-v3-decode-gb200-nvfp4",
                                                        13386.0))


def gb200_rows() -> list[list[str]]:
    from moesim.serve.run import resolve_serve, simulate_serve
    root = Path(__file__).resolve().parent.parent / "scenarios"
    got = []
    for name, _ in SGLANG_GB200:
        res, cfg = resolve_serve(root / f"{name}.yaml", [])
        got.append(float(simulate_serve(res, cfg, spans=False)
                         .summary["tokens_per_s_per_gpu"]))
    (_, b_pub), (_, q_pub) = SGLANG_GB200
    return [["fp8 MoE, BF16 KV (SGLang)", "DeepSeek-V3 decode, GB200 NVL72, tok/s per GPU",
             f"{b_pub:,.0f}", f"{got[0]:,.0f}", err(got[0], b_pub)],
            ["nvfp4 MoE, FP8 KV (SGLang)", "DeepSeek-V3 decode, GB200 NVL72, tok/s per GPU",
             f"{q_pub:,.0f} = {q_pub / b_pub:.2f}x", f"{got[1]:,.0f} = {got[1] / got[0]:.2f}x",
             err(got[1], q_pub) + f" (speed-up {err(got[1] / got[0], q_pub / b_pub)})"]]


#: TensorRT-LLM's quantisation blog (nvidia.github.io/TensorRT-LLM/blogs/
#: quantization-in-TRT-LLM.html, "Performance"): LLaMA-v2-7B on one H100 80GB, input 1024,
#: output 128, TP 1, speed-up over FP16: FP8 1.51x at batch 1, 1.40x at batch 8; INT8
#: SmoothQuant (W8A8) 1.47x and 1.32x. LLaMA-v2-7B (huggingface.co/meta-llama/Llama-2-7b-hf
#: config.json): 32 layers, hidden 4096, 32 heads of 128 (MHA), FFN 11008, vocab 32000
LLAMA2_7B = ("{layers: 32, hidden: 4096, heads: 32, kv_heads: 32, head_dim: 128, "
             "vocab: 32000, attention: mha, dense_ffn: 11008, n_experts: 0, gated: true}")
TRTLLM_H100 = [("fp8 (per-tensor)", ["compute.weights=fp8"], {1: 1.51, 8: 1.40}),
               ("int8 W8A8 (SmoothQuant)", ["compute.weights=int8", "compute.activations=int8"],
                {1: 1.47, 8: 1.32})]


def trtllm_rows(folder: Path) -> list[list[str]]:
    """A request's time: one prefill of ``batch`` 1024-token prompts and 128 decode steps
    at the mean context (1088), CUDA graphs off (the blog does not say)."""
    rows = []
    for b in (1, 8):
        pre = scenario(folder, f"llama2-7b-prefill-b{b}", LLAMA2_7B,
                       f"{{phase: prefill, batch_per_gpu: {b}, prompt: 1024}}", "H100")
        dec = scenario(folder, f"llama2-7b-decode-b{b}", LLAMA2_7B,
                       f"{{phase: decode, batch_per_gpu: {b}, prompt: 1024, context: 1088}}",
                       "H100")
        base = step_s(pre, []) + 128 * step_s(dec, [])
        for label, sets, pub in TRTLLM_H100:
            t = step_s(pre, sets) + 128 * step_s(dec, sets)
            rows.append([label, f"LLaMA-v2-7B, H100, batch {b}, 1024 in / 128 out "
                         "(TensorRT-LLM)", f"{pub[b]:.2f}x over FP16",
                         f"{base * 1e3:.0f} -> {t * 1e3:.0f} ms = {base / t:.2f}x",
                         f"speed-up {err(base / t, pub[b])}"])
    return rows


#: NVIDIA's DeepSeek-V3 pre-training on 256 B200 in MXFP8 ("FP8-MX"), tokens/s per GPU
#: (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md @00b7660be, NeMo 25.11,
#: "System: DGX-B200"): 2139. moesim: the shipped scenario deepseek-v3-256-b200 (its header
#: gives every setting): forward weight GEMMs in MXFP8 (compute.weights: mxfp8), dgrad and
#: wgrad in FP8 through compute.precision: fp8 (the FP8 training recipe, with its casts)
MEGATRON_B200_MXFP8 = 2139.0


def mxfp8_train_row() -> list[str]:
    import json
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-m", "moesim", "run",
                        "scenarios/deepseek-v3-256-b200.yaml", "--no-files", "--json",
                        "--quiet"], capture_output=True, text=True, cwd=root, check=True)
    d = json.loads(p.stdout)
    got = d["tokens_per_s"] / d["world"]
    return ["mxfp8 (Megatron-Bridge FP8-MX)", "DeepSeek-V3 pre-training, 256 B200, tok/s per GPU",
            f"{MEGATRON_B200_MXFP8:,.0f}", f"{got:,.0f}", err(got, MEGATRON_B200_MXFP8)]


def e2e_rows(folder: Path) -> list[list[str]]:
    rows = (torchao_rows(folder) + qwen_rows(folder) + trtllm_rows(folder)
            + gb200_rows() + [mxfp8_train_row()])
    for b, (wd, ws) in ((16, (19.35, 15.74)), (64, (72.71, 59.41))):
        p = scenario(folder, f"bert-base-b{b}", BERT_BASE,
                     f"{{phase: prefill, batch_per_gpu: {b}, prompt: 384}}")
        d = step_s(p, [])
        s = step_s(p, ["compute.sparsity=2:4"])
        rows.append(["2:4 (PyTorch semi-structured)", f"BERT-base, A100, batch {b}, seq 384",
                     f"{wd} -> {ws} ms = {wd / ws:.2f}x",
                     f"{d * 1e3:.3f} -> {s * 1e3:.3f} ms = {d / s:.2f}x",
                     f"speed-up {err(d / s, wd / ws)}"])
    return rows


# ------------------------------------------------------------------------ KV cache
#: vLLM's log for Qwen3-0.6B on A100 with the FlashInfer backend, BF16 KV: "Available KV
#: cache memory: 69.66 GiB", "GPU KV cache size: 652,144 tokens"; FP8 KV: "the available
#: concurrency doubles" (vllm-project/vllm PR #24577, mgoin's comment of 2025-09-10)
VLLM_KV_GIB, VLLM_KV_TOKENS = 69.66, 652_144


def kv_rows() -> list[list[str]]:
    from moesim.model.presets import PRESETS
    from moesim.serve.kv import kv_bytes_per_token
    spec = PRESETS["qwen3-0.6b"]
    rows = []
    for dtype, nbytes in (("bf16", 2), ("fp8", 1)):
        tokens = VLLM_KV_GIB * 2 ** 30 / kv_bytes_per_token(spec, nbytes)
        want = VLLM_KV_TOKENS * (1 if nbytes == 2 else 2)
        rows.append([f"serve.kv_dtype: {dtype}", "Qwen3-0.6B, A100, 69.66 GiB of KV cache",
                     f"{want:,} tokens" + (" (2x BF16's)" if nbytes == 1 else ""),
                     f"{tokens:,.0f} tokens ({kv_bytes_per_token(spec, nbytes):,} B each)",
                     err(tokens, want)])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    t0 = time.perf_counter()
    kernels = [*marlin_rows(), *te_rows(), deepgemm_row(), *sparse_rows(),
               *held_out_rows()]
    kv = kv_rows()
    with tempfile.TemporaryDirectory() as tmp:
        steps = e2e_rows(Path(tmp))
    blackwell = sorted(n for n, d in DEVICES.items() if d.peak_fp4_flops > 0)
    int8 = sorted(n for n, d in DEVICES.items() if d.peak_int8_ops > 0)
    from moesim.compute.quant_kernels import MARLIN_ITER, NVFP4_CUTLASS
    h100, b200 = DEVICES["H100"], DEVICES["B200"]
    marlin_c = MARLIN_ITER["H100"].per_iteration_s(
        compute_model({}, "benchmarks/quant_published.py", h100).roofline.hbm_Bps, h100.sms)
    print(PAGE_TEXT.format(
        eta=NVFP4_CUTLASS["B200"].eta(b200.peak_fp4_flops), marlin_c=marlin_c * 1e6,
        kernels=table(["mode", "kernel", "published", "moesim", "error", "priced by"],
                      kernels),
        steps=table(["mode", "step", "published", "moesim", "error"], steps),
        kv=table(["mode", "cache", "published", "moesim", "error"], kv),
        blackwell=", ".join(blackwell) or "none", int8=", ".join(int8) or "none"))
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    return 0


PAGE_TEXT = """Sources and what each figure is: the docstring of
`benchmarks/quant_published.py`; the knobs: [../quantisation.md](../quantisation.md).
Error = (moesim − published) / published; nothing is fitted.

## Kernels

{kernels}

"priced by": `catalog` where the price rests on a published figure (a DeepGEMM row,
Marlin's published INT4 regime, the two calibrated kernel models below), `roofline`
where the roofline gave it (the dense BF16 GEMMs on A100, H100 and H200 NVL, FP8
per-tensor on H200 NVL, the dense part of a 2:4 GEMM, which the published A100 speed-up
then divides): as the step summary's kernel-pricing count shows them. The A100 Marlin
rows are a ratio of two moesim prices; on A100 the BF16 GEMM at 32 rows is priced
compute-bound by the roofline's small-GEMM curve, so the ratio passes the byte ratio.

The split of the two calibrated kernel models (`moesim/compute/quant_kernels.py`): one
calibration figure each, each model used only for its kernel class on its device. The
published tables were read before the split was written, so it is not blind: the tile
and cluster shapes come from the kernel's source, not from the figures, but how many
16-SM clusters fit in 148 SMs is not published (GPCs); floor(148/16) = 9 is taken, and 8
would put the few-row NVFP4 rows at -22 to -25 %.
- NVFP4 on B200, CUTLASS SM100 GEMM (tile waves of 4x4-CTA clusters, 512x1024 output
  tiles, 9 clusters of 16 of the 148 SMs): calibrated on vLLM PR #20646's N=6144,
  K=4096 GEMM at 16384 rows (eta = {eta:.3f} of the FP4 peak in the K loop). Checks: the
  other ten batches of that table, its N=4096 table at batch 1, FlashInfer issue #1732's
  M=1 GEMM. The CuTeDSL kernel and cuBLAS's MXFP4 GEMM are other kernels, shown priced
  by the same model, not counted as checks. GB200 has no NVFP4 figure of its own here:
  it keeps the roofline (the model is B200's).
- INT4/INT8 weight-only on H100, Marlin (a per-iteration cost c in series with the
  weight stream at the roofline's HBM rate): calibrated on humming PR #2's Marlin
  W4A16 at m=1 (c = {marlin_c:.3f} us). Checks: Marlin W8A16 at m=1, 2, 4 of the same
  table (twice the bytes per iteration). W4A16 at m=2, 4 stream the same bytes as the
  calibration and are shown, not counted. moesim prices its own formats (group-128 scales,
  4.125 and 8.125 bits) where the published runs are channelwise, +1.5 % of bytes at most.
  A100, H800, H200 have no figure of Marlin's per-iteration cost: they keep the formula
  without it.

The held-out rows (below the 2:4 ones) had no figure of theirs in a moesim table.
fp8-block: DeepGEMM on an H100 as vLLM's benchmark timed it a day after DeepGEMM's
first release, against moesim's DeepGEMM rates (H800, the README of six weeks later,
whose 4096-row rates are up to 24 % above the first release's); the shapes with
N = 18432 are near, the K = 18432 and the N = 4096, M = 1024-2048 ones are 27-41 % fast
(vLLM's table also has outliers: 141 us at M = 128 for the shape that takes 89.7 us at
M = 1024). mxfp8 runs on the roofline at B200's FP8 peak with the efficiency curve every
roofline GEMM gets: the large MXFP8 GEMMs land within 8 %; MXFP8 at 1024x2048x1024 is a
kernel of a few microseconds, latency-bound, which the roofline does not price.
nvfp4: the CUTLASS tile-wave model, calibrated at 16384 rows, gives one wave for up to
512 rows: the published floor of about 11 us from 1 to 512 rows that a bytes-only price
(2 us) missed, 15-19 % fast there; 2-8 % on the larger batches. The CuTeDSL kernel at
M = 32 is 48 % slow: another kernel, autotuned, whose tiles the CUTLASS model (one
512x1024 cluster tile for every shape) does not know; cuBLAS's MXFP4
GEMM reaches 0.58 of the peak at 8192^3 where the CUTLASS model sustains {eta:.2f},
37 % slow.
INT8 W8A8 on A100 (the roofline at the INT8 peak, 624 TOPS) is 4-22 % slow.
INT8 weight-only (Marlin W8A16 on H100, a decode GEMV of 8192 x 8192): the published
kernel streams its 67 MB in 38.8 us; with the per-iteration cost calibrated on W4A16,
32 iterations of {marlin_c:.3f} us plus the bytes at 2.68 TB/s give 39.9 us. PyTorch's
FP16 GEMM beside it (the roofline, no per-iteration cost) is 14 % fast.

## Steps

{steps}

The GB200 rows are the shipped scenarios `deepseek-v3-decode-gb200` and
`deepseek-v3-decode-gb200-nvfp4` (also on [published.md](published.md)): the blog's
reduced-precision run changes the KV cache to FP8 and the batch (1117 by moesim's
KV-full rule for the BF16 cache, the blog's 1408 for FP8) with NVFP4 experts, and
moesim prices every weight GEMM in NVFP4 where the blog keeps some attention projections
in FP8; the speed-up is the blog's comparison, of all three changes together.
The LLaMA-v2-7B rows (TensorRT-LLM's blog) are a request's whole time; FP8 per-tensor and
INT8 W8A8 both halve the weight bytes of the decode steps and double the math of the
prefill, so moesim gives them nearly the same speed-up where TensorRT-LLM's INT8
SmoothQuant is a little slower than its FP8 (its per-token activation quantisation and
the dequantising epilogue, which moesim does not price).
The MXFP8 row is the shipped scenario `deepseek-v3-256-b200` (also on
[published.md](published.md)): Megatron-Bridge's recipe runs every GEMM, forward and
backward, in MXFP8; moesim prices the forward weight GEMMs with `compute.weights: mxfp8`
and dgrad and wgrad with `compute.precision: fp8` (FP8 tensor cores, the B200's rate for
MXFP8 too, with the FP8 recipe's casts). The same model's BF16 run on 256 GB200 is 42 %
fast on published.md too, so the +68 % is not the format's pricing alone; Megatron-Bridge
publishes no BF16 run on DGX-B200 to take a speed-up from.
The absolute BERT times are not comparable: the published ones are PyTorch eager with
its host overhead, moesim's are the GPU work of one step; the check is the speed-up.
The torchao rows are batch-1 decode steps, bound by the weight bytes. torchao's tables
give the bandwidth each reached: BF16 1435 GB/s on A100 and 1905 GB/s on H100 (moesim:
80 % of the HBM peak, 1632 and 2680 GB/s), INT4 (tinygemm) 763 and 1019 GB/s, about
half of BF16's. moesim prices INT4 and INT8 weight-only as Marlin: on H100 with Marlin's
per-iteration cost (the kernel rows above), which brings int8wo to the published tokens/s
and int4wo to +11 %; on A100, which has no figure of that cost, streaming the bytes as
fast as BF16 does, hence +30 % and +92 % there. The speed-ups on H100 are now below the
published ones because moesim's BF16 step is 29 % fast (the roofline's 2.68 TB/s, the
FP16 GEMM rows above).
The FP8 per-tensor row is slower than BF16 in torchao, which quantises each activation
on the fly (an amax reduction and a cast per GEMM) and runs a one-row FP8 GEMM that is
not bound by its weight bytes; moesim prices neither and gives the byte ratio.

The Qwen3-0.6B rows (Qwen's speed benchmark, SGLang on an H20) are a 0.6B model at
batch 1: 414 tokens/s is 2.4 ms a token, where the weights (1.2 GB, the tied embedding
read once as the LM head) take 0.3 ms at the H20's 4 TB/s peak and moesim's whole step,
its launches included, 0.9 ms. What SGLang spends beyond the GPU work of the step (its
scheduler loop and sampling on the host) is not in moesim's step, hence +165 % on BF16;
the check is the speed-up. Block FP8 halves the
weight bytes and its speed-up lands near; GPTQ-Int8 is slower than BF16 in SGLang (its
own note says its GPTQ kernels need work), where moesim prices INT8 weight-only as
Marlin-class, streaming its bytes as fast as BF16 does.

## KV cache

{kv}

The tokens a KV budget holds, from moesim's bytes per token (the serving memory table's
KV line); vLLM rounds its cache to whole blocks of 16 tokens. An FP8 KV cache halves
the bytes per token and the bytes decode attention reads.

## Not reproduced

The MXFP8 speed-ups over BF16 published by PyTorch are not priced here. Searched
(GitHub issues and pull requests of vLLM, SGLang, FlashInfer, TensorRT-LLM, CUTLASS,
DeepGEMM, pytorch/ao; NVIDIA, PyTorch and vLLM blogs) and found: MXFP8 training on
B200 with torchao and TorchTitan, Llama3-70B, 1.22-1.28x over BF16 (pytorch.org blog
"Accelerating 2K scale pre-training up to 1.28x with TorchAO, MXFP8 and TorchTitan on
Crusoe B200 Cluster"), and Llama4 Scout on GB200, 1.3x
(PyTorch blog "MXFP8 Training for MoEs"): moesim would price them as the MXFP8 row above
(`compute.weights: mxfp8` with `compute.precision: fp8` for the backward GEMMs), but the
blogs give the parallelism (HSDP2, context parallel 2, 4-188 nodes) and not the sequence
length, local batch or activation checkpointing a step needs. INT8 W8A8 serving
figures under load (vLLM PR #1508: Llama-13B on one A100, input 640, output 100, QPS 14,
FP16 574 -> W8A8 per-token 741 tokens/s; SGLang PR #2881: Meta-Llama-3-8B W8A8 at 8
requests/s on ShareGPT) need a traffic run of the same arrivals, not done here.
NVFP4 at concurrency 1 (Llama-3.3-70B on 4 GB200 at TP 4, sgl-project/sglang issue
#28224) is not priced: a serving TP group holds at least `tp` requests.
Devices with an FP4 peak at this run: {blackwell}; with an INT8 peak: {int8}. An FP8
KV cache's serving throughput under load (SGLang PR #1204: Llama-2-13B on A100, 7.04 ->
8.30 req/s) needs a load run of the same traffic, not done here. No
A100 figure of an INT8 weight-only GEMM was found (searched: vLLM's and TensorRT-LLM's
kernel benchmarks, FasterTransformer's fpA_intB GEMM, Marlin-family READMEs; TensorRT-LLM
issue #740 gives W8A8 : W8A16 = 1800 : 1100 for one shape in a user's framework, no GPU
named). torchao's INT4 rows
(tinygemm) stay priced as Marlin: no published per-shape figure of tinygemm's kernel was
found (pytorch/ao issues and READMEs give only whole-decode tokens/s and bandwidth), so
no `tinygemm` kernel choice is priced."""


if __name__ == "__main__":
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results_page import run_benchmark  # this folder
    sys.exit(run_benchmark(main, "quantisation", "Quantisation and 2:4 sparsity against "
                           "published figures"))
