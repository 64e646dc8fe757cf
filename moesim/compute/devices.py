"""Accelerator catalog: peak FLOP/s, HBM size and bandwidth, kernel launch overhead.

SI units: FLOP/s, bytes, bytes/s, seconds. Figures from the NVIDIA H100/H200/A100/H20
datasheets, the DGX B200 datasheet and GB200 NVL72 page for Blackwell and, for the H800,
the DeepSeek-V3 report (docs/sources.md lists them). Dense (non-sparse) tensor-core peaks:
where a datasheet gives only the 2:4-sparse figure, half of it.

``hbm_bytes`` is the memory the card reports (``nvidia-smi``'s total, in MiB), not the
datasheet's rounded "80 GB": an H100 SXM reports 81,559 MiB = 85.52e9 bytes = 79.6 GiB.
Every fraction of device memory (a KV-cache share, vLLM's ``gpu_memory_utilization``)
applies to this figure, as vLLM applies it to ``torch.cuda.mem_get_info``'s total.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.errors import InputError
from moesim.units import GB, TB, US, MiB

# Kernel launch overhead has no published figure here: a CUDA kernel launch costs a few µs of
# host/driver latency; 4 µs is our assumption, meant to be replaced by a calibration.
GPU_LAUNCH_OVERHEAD_S = 4 * US
# What a kernel replayed from a CUDA graph still costs on the GPU beyond its work, on
# Hopper: te42kyfo/gpu-benches gpu-small-kernels/h200_graph.txt (commit c35574e,
# 2024-06-21; main.cu: 10,000 back-to-back "scale" kernels captured in one graph, bandwidth =
# 2 x 8 bytes x size / time per kernel): at the smallest size, 4096 doubles (65,536 bytes
# moved), the best block size reaches 52 GB/s, so each kernel takes 65,536 / 52e9 =
# 1.26 µs, of which moving 64 KiB at the same file's large-size rate is ~0.02 µs. Measured
# on an H200; H100 and H800 have the same GH100 SMs (whitepaper, datasheets below). The same
# benchmark launched from a stream, without a graph, gives 2.43 µs (h200.txt, 27 GB/s;
# the repository's fit in repeated-stream.svg: "a= 2433 ns"), above which moesim's 4 µs
# assumption stays for eager launches (the host's PyTorch dispatch adds to it).
HOPPER_GRAPH_KERNEL_S = 65536 / 52e9

# Device memory as nvidia-smi reports it ("Memory-Usage ... / TOTAL MiB"); the datasheets
# state 80 GB (H100, H800, A100 80GB) and 141 GB (H200, H200 NVL).
# H100 SXM5 80GB ("NVIDIA H100 80GB HBM3"): 81,559 MiB (nvidia-smi in NVIDIA/nccl issue #1264
# and huggingface/text-generation-inference issue #2572; modal-labs/modal-client PR #2797
# lists "H100: 81559MiB (85.52 GB)").
H100_SXM_MIB = 81559
# H200 SXM ("NVIDIA H200"): 143,771 MiB (nvidia-smi in sgl-project/sglang issue #3196).
H200_MIB = 143771
# H200 NVL: the same 141 GB of HBM3e as H200 SXM (NVIDIA H200 datasheet); its nvidia-smi
# total, 143,771 MiB, is the H200 SXM's (seen in public nvidia-smi output of a 600 W
# "NVIDIA H200 NVL"; no issue thread to cite was found, so this rests on the equal stacks).
H200_NVL_MIB = 143771
# H800 SXM: the H100 SXM board with cut NVLink (DeepSeek-V3 report §3.2.2), the same 80 GB
# of HBM3; no nvidia-smi output was found to cite, so it is taken equal to H100 SXM's.
H800_MIB = H100_SXM_MIB
# A100 SXM4 80GB: 81,920 MiB (modal-labs/modal-client PR #2797: "A100 80GB: 81920MiB
# (85.89 GB)"; the A800-SXM4-80GB, the same board, reports 81920MiB in dexmal/dexbotic #41).
A100_80GB_MIB = 81920
# H20 (96 GB HBM3): 97,871 MiB (nvidia-smi of an "NVIDIA H20" in the test README of the ACE
# FHE compiler's CGO'25 artifact, docker image opencc/ace:20250524); GH200 with 96 GB of
# HBM3 reports the same 97871MiB in public nvidia-smi output.
H20_MIB = 97871
# B200 (HGX/DGX B200, "NVIDIA B200", 1000 W): 183,359 MiB (nvidia-smi of 8 x B200 in
# NVIDIA/TensorRT-LLM issue #10278); the DGX B200 datasheet states 1,440 GB for 8 GPUs.
B200_MIB = 183359
# GB200 (per Blackwell GPU of a GB200 superchip): no nvidia-smi output was found to cite, so
# the datasheet figure: "up to 372 GB HBM3e" per superchip of 2 GPUs (NVIDIA GB200 NVL72
# page, specifications) = 186 GB per GPU, in 10^9 bytes.
GB200_HBM_BYTES = 372 / 2 * GB


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    name: str
    peak_bf16_flops: float          # FLOP/s, dense bf16 tensor-core peak
    hbm_bytes: float                # bytes of device memory as the card reports it (nvidia-smi)
    hbm_Bps: float                  # bytes/s, peak HBM bandwidth
    peak_fp8_flops: float = 0.0     # FLOP/s, dense fp8 peak (0: none)
    peak_fp4_flops: float = 0.0     # FLOP/s, dense fp4 (NVFP4/MXFP4) peak (0: the device has none)
    peak_int8_ops: float = 0.0      # op/s, dense int8 tensor-core peak (0: none known)
    launch_overhead_s: float = GPU_LAUNCH_OVERHEAD_S   # seconds per kernel launch
    graph_kernel_s: float = 0.0     # seconds per kernel replayed from a CUDA graph (0: none known)
    sms: int = 0                    # streaming multiprocessors (0: compute is not shared)
    calibrated_from: str = ""       # where measured figures came from, if measured
    notes: str = ""


DEVICES: dict[str, DeviceSpec] = {
    # H100 SXM: 989 TFLOP/s bf16 dense, 80 GB (81,559 MiB reported, above), 3.35 TB/s
    # (NVIDIA H100 datasheet, dense = half the sparsity figure); fp8 dense 1979 TFLOP/s
    # (same datasheet, 2× bf16).
    # 132 SMs on H100 SXM5 (NVIDIA H100 Tensor Core GPU Architecture whitepaper).
    # INT8 3,958 TOPS with sparsity (same datasheet, H100 SXM) = 1,979 dense. No FP4.
    "H100": DeviceSpec("H100", 989e12, H100_SXM_MIB * MiB, 3.35 * TB, peak_fp8_flops=1979e12,
                       peak_int8_ops=1979e12, sms=132,
                       graph_kernel_s=HOPPER_GRAPH_KERNEL_S,
                       notes="SXM5; NVLink 900 GB/s bidirectional"),
    # H200 SXM: 989 TFLOP/s bf16, 141 GB (143,771 MiB reported), 4.8 TB/s (NVIDIA H200
    # datasheet).
    # H200 is the same GH100 configuration as H100 SXM5 with HBM3e: 132 SMs (NVIDIA H200
    # Tensor Core GPU datasheet: "based on the NVIDIA Hopper architecture"; whitepaper above).
    # INT8 3,958 TOPS with sparsity (H200 datasheet, H200 SXM) = 1,979 dense.
    "H200": DeviceSpec("H200", 989e12, H200_MIB * MiB, 4.8 * TB, peak_fp8_flops=1979e12,
                       peak_int8_ops=1979e12, sms=132,
                       graph_kernel_s=HOPPER_GRAPH_KERNEL_S,
                       notes="SXM; NVLink 900 GB/s bidirectional"),
    # H200 NVL (PCIe card, up to 600 W): 1,671 TFLOP/s bf16 and 3,341 fp8 with sparsity,
    # 141 GB (143,771 MiB reported), 4.8 TB/s (NVIDIA H200 datasheet, H200 NVL column;
    # dense = half). The same
    # GH100 die as H200 SXM (132 SMs) at a lower power limit. NVLink bridges of 2 or 4
    # GPUs (900 GB/s bidirectional, same datasheet). INT8 3,341 TOPS with sparsity (same
    # column) = 1,670.5 dense.
    "H200-NVL": DeviceSpec("H200-NVL", 835.5e12, H200_NVL_MIB * MiB, 4.8 * TB,
                           peak_fp8_flops=1670.5e12, peak_int8_ops=1670.5e12,
                           sms=132, graph_kernel_s=HOPPER_GRAPH_KERNEL_S,
                           notes="PCIe, 600 W; NVLink bridge 900 GB/s bidirectional"),
    # H800 SXM: ~989 TFLOP/s, 80 GB (81,559 MiB, as H100 SXM), ~3.35 TB/s (as H100 SXM;
    # DeepSeek-V3 report §3.2.2:
    # same compute as H100, NVLink cut to 400 GB/s bidirectional).
    # 132 SMs: DeepSeek-V3 report §3.2.2 ("20 SMs out of the 132 SMs of an H800").
    # INT8: H100 SXM's 1,979 dense TOPS (the same GH100 compute, as the figures above).
    "H800": DeviceSpec("H800", 989e12, H800_MIB * MiB, 3.35 * TB, peak_fp8_flops=1979e12,
                       peak_int8_ops=1979e12, sms=132,
                       graph_kernel_s=HOPPER_GRAPH_KERNEL_S,
                       notes="SXM; NVLink 400 GB/s bidirectional"),
    # A100 SXM 80GB: 312 TFLOP/s bf16, 80 GB (81,920 MiB reported), 2.04 TB/s (NVIDIA A100
    # datasheet); no fp8. INT8 624 TOPS dense (1,248 with sparsity; same datasheet).
    # 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper).
    "A100": DeviceSpec("A100", 312e12, A100_80GB_MIB * MiB, 2.04 * TB, peak_int8_ops=624e12,
                       sms=108,
                       notes="SXM4 80GB; NVLink 600 GB/s bidirectional"),
    # H20 (HGX H20, the Hopper part for China, 400 W): 148 TFLOP/s bf16 and 296 fp8 dense,
    # 96 GB HBM3 (97,871 MiB reported, above), 4.0 TB/s, NVLink 900 GB/s bidirectional
    # (NVIDIA HGX H20 specifications; no NVIDIA-hosted page was found to cite, the same
    # figures on huggingface.co/hardware/h20: "96GB, 148 TFLOPS, 400W"). SMs unpublished by
    # NVIDIA: 0 (compute not shared with communication kernels). INT8 296 TOPS dense (the
    # same specifications: "INT8 ... 296 TOPS", equal to its fp8 figure).
    "H20": DeviceSpec("H20", 148e12, H20_MIB * MiB, 4.0 * TB, peak_fp8_flops=296e12,
                      peak_int8_ops=296e12,
                      graph_kernel_s=HOPPER_GRAPH_KERNEL_S,
                      notes="SXM, 400 W; NVLink 900 GB/s bidirectional"),
    # B200 (HGX/DGX B200, 1000 W). NVIDIA DGX B200 datasheet: 8 GPUs, "72 petaFLOPS training
    # and 144 petaFLOPS inference" (FP8 and FP4, with sparsity), 1,440 GB HBM3e, "64 TB/s HBM3e
    # bandwidth", NVLink 5 "14.4 TB/s aggregate" (1.8 TB/s bidirectional per GPU). NVIDIA HGX
    # B200 specifications (8 GPUs, with sparsity): FP16/BF16 36 PFLOPS, INT8 72 POPS. Per GPU,
    # dense = half the sparse figure: BF16 2.25, FP8 4.5, FP4 9 PFLOP/s, INT8 4.5 POP/s;
    # HBM 8 TB/s; memory 183,359 MiB as reported (above). SMs: NVIDIA's Blackwell
    # architecture technical brief gives no SM count, so 0 (compute is not shared with
    # communication kernels); CUDA's device query reports 148 (pytorch/ao PR #4002), not an
    # NVIDIA-published figure. CUDA-graph replay cost on Blackwell: unpublished (0).
    "B200": DeviceSpec("B200", 2.25e15, B200_MIB * MiB, 8.0 * TB, peak_fp8_flops=4.5e15,
                       peak_fp4_flops=9.0e15, peak_int8_ops=4.5e15,
                       notes="SXM (HGX/DGX B200), 1000 W; NVLink 5 1.8 TB/s bidirectional; "
                             "SM count unpublished by NVIDIA (0)"),
    # GB200 (one Blackwell GPU of a GB200 Grace Blackwell superchip, NVL72 rack). NVIDIA GB200
    # NVL72 page, specifications per GB200 superchip (1 Grace + 2 Blackwell GPUs, with
    # sparsity): FP4 40 PFLOPS, FP8/FP6 20 PFLOPS, INT8 20 POPS, FP16/BF16 10 PFLOPS, "up to
    # 372 GB HBM3e | 16 TB/s", NVLink 3.6 TB/s. Per GPU, dense = half the sparse figure, half
    # the superchip: BF16 2.5, FP8 5, FP4 10 PFLOP/s, INT8 5 POP/s; HBM 186 GB (datasheet,
    # no nvidia-smi figure found), 8 TB/s; NVLink 5 1.8 TB/s bidirectional. SMs: 0, as B200.
    "GB200": DeviceSpec("GB200", 2.5e15, GB200_HBM_BYTES, 8.0 * TB, peak_fp8_flops=5.0e15,
                        peak_fp4_flops=10.0e15, peak_int8_ops=5.0e15,
                        notes="Blackwell GPU of a GB200 superchip (NVL72); NVLink 5 1.8 TB/s "
                              "bidirectional; HBM is the datasheet's GB, not nvidia-smi's; "
                              "SM count unpublished by NVIDIA (0)"),
    # CPU: a placeholder to be calibrated (moesim calibrate) before its times are trusted.
    # Defaults measured by moesim's author on the dev machine (AMD EPYC, 1 thread,
    # torch 2.13 CPU, 2026-11-29): bf16 1024³ matmul 2.0e11 FLOP/s (fp32: 8.3e10),
    # numpy copy 24 GB/s read+write; 64 GB nominal memory; ~10 µs per op dispatch (assumed).
    "cpu": DeviceSpec("cpu", 2.0e11, 64 * GB, 24 * GB, launch_overhead_s=10 * US,
                      calibrated_from="measured once, 1 thread, shared dev machine; recalibrate",
                      notes="placeholder meant to be calibrated from recorded traces"),
}


def get_device(name: str, source: str = "<device>", field: str = "device") -> DeviceSpec:
    """Look up a device by name (case-insensitive); InputError lists the valid ones."""
    if isinstance(name, str):
        for key, spec in DEVICES.items():
            if key.lower() == name.lower():
                return spec
    raise InputError(source, field, f"one of {', '.join(DEVICES)}", name)
