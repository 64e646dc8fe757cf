"""cuBLAS GEMMs on Hopper, as Transformer Engine's GEMM-profiling guide measured them,
against moesim's pricing of the same GEMMs (issue 21).

    python benchmarks/gemm_published.py          # prints the comparison

Published (NVIDIA/TransformerEngine ``docs/examples/gemm_profiling/gemm_profiling.rst``,
added in commit 1609c890e, 2026-06-01; "Worked Example: 5B Model on H200"): on an
NVIDIA H200 NVL, ``benchmarks/gemm/benchmark_gemm.py --pre-quantize`` (CUDA events, the
GEMM kernel alone, its inputs quantized before the timed loop) times the twelve GEMMs of
one layer of a hidden 4096, intermediate 16384 transformer at M = 31 x 512 = 15,872
tokens: the QKV (N = 12,288), attention-out (4,096), MLP-up (16,384) and MLP-down
(K = 16,384) projections, each in Fprop, Dgrad and Wgrad. It prints the per-pass sums
of four GEMMs each (ms), BF16 and "FP8Current" (per-tensor current scaling, cuBLAS):

    BF16       Fprop 10.632  Dgrad 10.747  Wgrad 10.530
    FP8Current Fprop  5.577  Dgrad  5.661  Wgrad  5.547

The same guide's autocast run gives BF16 10.653 / 10.813 / 10.548 ms (BF16 has nothing
to quantize, so the two runs differ only by run-to-run noise: 0.2-0.6 %).

moesim prices the same GEMMs with the compute model a scenario on ``H200-NVL`` gets by
default (no catalog GEMM table covers the device: the roofline prices them), at ``precision: bf16`` and
``precision: fp8``, without its fixed cost per launch (the figures are GPU time of
back-to-back launches).

Second source, one GEMM per device (stas00/ml-engineering ``compute/accelerator/
README.md`` at commit b9e29720, "Maximum Achievable Matmul FLOPS comparison table", v2:
``mamf-finder.py``, ``torch.mm`` over a brute-force search of shapes, mean of 100
iterations after 50 warm-up ones, the cache reset between them): the best shape found
and its TFLOP/s. BF16: A100 SXM 271.2 at MxNxK 1024x10240x5120 (torch 2.6.0+cu126), H100
SXM 794.5 at 2048x2048x13312 (torch 2.7.0+cu126); FP8 (``float8_e4m3fn``): H100 SXM
1402.6 at 1024x9216x14336. The best of a search, so an upper end for its shape. moesim
prices that GEMM on ``A100`` / ``H100`` with the scenario default (the catalog: its
DeepGEMM tables for FP8 on H100, the roofline for BF16).

Nothing is fitted: the error is (moesim - published) / published.
"""

from __future__ import annotations

import argparse

from moesim.compute.devices import get_device
from moesim.compute.select import compute_model
from moesim.model.kernels.make import gemm_pass

SOURCE = ("TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst (1609c890e), "
          "H200 NVL, --pre-quantize")
DEVICE = "H200-NVL"
TOKENS = 31 * 512                          # M = micro-batch 31 x sequence 512
HIDDEN, FFN = 4096, 16384
#: forward (k, n) of the layer's four projections (the guide's "Forward Summary")
SHAPES = {"qkv": (HIDDEN, 3 * HIDDEN), "attn_out": (HIDDEN, HIDDEN),
          "mlp_up": (HIDDEN, FFN), "mlp_down": (FFN, HIDDEN)}
#: the guide's pre-quantized per-pass sums, ms
PUBLISHED_MS = {
    "bf16": {"fwd": 10.632, "dgrad": 10.747, "wgrad": 10.530},
    "fp8": {"fwd": 5.577, "dgrad": 5.661, "wgrad": 5.547},
}
#: the guide's autocast BF16 run of the same GEMMs (run-to-run noise)
AUTOCAST_BF16_MS = {"fwd": 10.653, "dgrad": 10.813, "wgrad": 10.548}
PASS_NAMES = {"fwd": "Fprop", "dgrad": "Dgrad", "wgrad": "Wgrad"}
MAMF_SOURCE = ("stas00/ml-engineering compute/accelerator/README.md (b9e29720), Maximum "
               "Achievable Matmul FLOPS table v2")
#: (device, dtype, (M, N, K) of torch.mm(MxK, KxN), published TFLOP/s)
MAMF = [("A100", "bf16", (1024, 10240, 5120), 271.2),
        ("H100", "bf16", (2048, 2048, 13312), 794.5),
        ("H100", "fp8", (1024, 9216, 14336), 1402.6)]


def gpu_s(model, kern) -> float:
    """moesim's time for ``kern`` without its fixed cost per launch: the published
    figures time back-to-back launches on the GPU (CUDA events), the host ahead."""
    launch = getattr(model, "roofline", model).per_launch_s(kern)
    return model.time_s(kern) - max(kern.count, 1) * launch


def _priced_by(model, kern) -> str:
    """"catalog" or "roofline": what prices ``kern`` in ``model``."""
    price = getattr(model, "price", None)
    return price(kern).source if price is not None else "roofline"


def pass_kernels(pass_: str, fp8: bool) -> list:
    """The four GEMMs of one pass, as moesim's kernel inventory writes a Linear's GEMM."""
    return [gemm_pass(name, TOKENS, n, k, pass_, fp8=fp8, dtype="" if fp8 else "bf16")
            for name, (k, n) in SHAPES.items()]


def pass_flops(pass_: str) -> float:
    return sum(kern.flops for kern in pass_kernels(pass_, False))


def rows(device: str = DEVICE) -> list[dict]:
    """[{dtype, pass, published_ms, moesim_ms, error, published_tflops, priced_by}]."""
    dev = get_device(device)
    out = []
    for dtype, published in PUBLISHED_MS.items():
        model = compute_model({"precision": dtype}, "gemm_published", dev)
        for pass_, ms in published.items():
            kernels = pass_kernels(pass_, dtype == "fp8")
            sim = sum(gpu_s(model, kern) for kern in kernels) * 1e3
            flops = sum(kern.flops for kern in kernels)
            how = {_priced_by(model, kern) for kern in kernels}
            out.append({"dtype": dtype, "pass": pass_, "published_ms": ms, "moesim_ms": sim,
                        "error": (sim - ms) / ms, "published_tflops": flops / ms / 1e9,
                        "priced_by": "+".join(sorted(how))})
    return out


def mamf_rows() -> list[dict]:
    """[{device, dtype, shape, published_tflops, moesim_tflops, error, priced_by}]: the
    MAMF table's best GEMM of each device, priced by the scenario default on it."""
    out = []
    for device, dtype, (m, n, k), tflops in MAMF:
        model = compute_model({"precision": dtype}, "gemm_published", get_device(device))
        kern = gemm_pass("mamf", m, n, k, "fwd", fp8=dtype == "fp8",
                         dtype="" if dtype == "fp8" else "bf16")
        how = _priced_by(model, kern)
        sim = kern.flops / gpu_s(model, kern) / 1e12
        out.append({"device": device, "dtype": dtype, "shape": (m, n, k),
                    "published_tflops": tflops, "moesim_tflops": sim,
                    "error": (sim - tflops) / tflops, "priced_by": how})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.parse_args(argv)
    dev = get_device(DEVICE)
    print(f"{SOURCE}; moesim on {dev.name}: bf16 {dev.peak_bf16_flops / 1e12:.1f}, "
          f"fp8 {dev.peak_fp8_flops / 1e12:.1f} TFLOP/s dense peak")
    print("dtype  pass   published_ms  moesim_ms   error  published_TFLOP/s  of_peak")
    for r in rows():
        peak = dev.peak_fp8_flops if r["dtype"] == "fp8" else dev.peak_bf16_flops
        print(f"{r['dtype']:5s}  {PASS_NAMES[r['pass']]:5s}  {r['published_ms']:12.3f}  "
              f"{r['moesim_ms']:9.3f}  {r['error']:+6.1%}  {r['published_tflops']:17.1f}  "
              f"{r['published_tflops'] * 1e12 / peak:7.1%}")
    noise = [abs(AUTOCAST_BF16_MS[p] - PUBLISHED_MS["bf16"][p]) / PUBLISHED_MS["bf16"][p]
             for p in AUTOCAST_BF16_MS]
    print(f"run-to-run (BF16 autocast vs pre-quantized): {min(noise):.1%} - {max(noise):.1%}")
    print(f"\n{MAMF_SOURCE}: the best GEMM found per device, TFLOP/s")
    print("device dtype  MxNxK               published  moesim   error  priced by")
    for r in mamf_rows():
        shape = "x".join(str(x) for x in r["shape"])
        print(f"{r['device']:6s} {r['dtype']:5s}  {shape:18s}  {r['published_tflops']:9.1f}  "
              f"{r['moesim_tflops']:6.1f}  {r['error']:+6.1%}  {r['priced_by']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
