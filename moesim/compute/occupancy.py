"""The bandwidth a memory-bound kernel reaches at its occupancy, and DeepSeek's kernels'
launch geometry (``compute.memory_kernels: deepseek``).

A streaming kernel's bandwidth is the bytes its threads keep in flight over the memory
latency (Little's law) until there are enough of them to saturate HBM; a kernel with few
resident threads (few thread blocks, or blocks held to one or two per SM by their
registers) cannot reach the device's streaming rate. gpu-benches measures this curve
(te42kyfo/gpu-benches, ``gpu-stream/h200.txt`` and README "gpu-stream", commit
1c36d509ee717dca9215c27135fa1e611bb03ed1): the ``scale`` kernel (``A[i] = c * B[i]``,
one 8-byte load and one store per thread), two blocks per SM (a shared-memory spoiler),
block size 32 to 1024, on the 132 SMs of an H200: 240 GB/s at 3.1 % occupancy, 1,120 at
18.8 %, 1,864 at 37.5 %, 2,844 at 75 %, 3,165 at 100 % (:data:`STREAM_BY_OCCUPANCY`).

Model (:func:`rate_gbps`): at occupancy ``o`` (resident threads per SM / 2,048) each SM
moves ``curve(o) / 132`` GB/s, the curve interpolated linearly between its points (the
curve is linear in occupancy at low occupancy, as Little's law makes it); a kernel on
``n`` SMs (``min(blocks, SMs)``) reaches ``min(stream, n · curve(o) / 132)``, ``stream``
its device's streaming rate. The per-SM figure is the H200's: at one occupancy the bytes
in flight per SM and the memory latency are those of the GH100 SM every Hopper part
shares, so at low occupancy the absolute bandwidth carries to H100 and H800; near full
occupancy the device's own streaming rate caps it. gpu-stream's threads keep one 8-byte
load in flight each: a kernel whose threads keep more in flight (several 16-byte vector
loads per thread, as a row-wise norm does) reaches more at the same occupancy, so this
is the slowest such a kernel can be, not its rate.

DeepSeek's kernels (:data:`DEEPSEEK`): the occupancy and block count of the kernel
DeepSeek's training code launches for each inventory kernel, as DeepSeek's public profile
records them at launch (github.com/deepseek-ai/profile-data ``train.json``, each kernel's
``grid``, ``block`` and ``est. achieved occupancy %``): a property of the implementation
and its launch, read from the profile, never its durations.
"""

from __future__ import annotations

from dataclasses import dataclass

#: gpu-benches ``gpu-stream/h200.txt`` (commit 1c36d509): occupancy %, ``scale`` GB/s
#: on the H200's 132 SMs
STREAM_BY_OCCUPANCY = (
    (3.0, 240), (6.2, 463), (9.4, 654), (12.5, 852), (15.6, 977), (18.8, 1120),
    (21.9, 1250), (25.0, 1395), (28.1, 1506), (31.2, 1632), (34.4, 1746), (37.5, 1864),
    (40.6, 1964), (43.8, 2064), (46.9, 2157), (50.0, 2263), (53.1, 2334), (56.2, 2417),
    (59.4, 2495), (62.5, 2572), (65.6, 2645), (68.8, 2715), (71.9, 2780), (75.0, 2844),
    (78.1, 2896), (81.2, 2948), (84.4, 2997), (87.5, 3042), (90.6, 3079), (93.8, 3112),
    (96.9, 3139), (100.0, 3165))
#: the SMs the curve was measured on (H200)
CURVE_SMS = 132


@dataclass(frozen=True)
class Launch:
    """How DeepSeek's training code launches the kernel an inventory kernel stands for:
    its name in the profile, occupancy % of the SMs it runs on, thread blocks (0: at
    least as many as the device has SMs), and the bytes each thread keeps in flight
    (gpu-stream's 8 where the kernel's source is not public: the slowest it can be)."""

    profiled: str
    occupancy: float
    blocks: int = 0
    inflight: float = 8.0
    #: thread blocks resident per SM at ``occupancy`` (0: not known) and, for a grid
    #: sized to the device (``blocks`` 0), the blocks launched per SM: what
    #: :func:`wave_ratio` needs
    per_sm: int = 0
    grid_per_sm: int = 0

    @property
    def effective(self) -> float:
        """The occupancy of gpu-stream's threads with the same bytes in flight per SM
        (Little's law: bandwidth ∝ bytes in flight)."""
        return self.occupancy * self.inflight / GPU_STREAM_INFLIGHT


#: bytes a gpu-stream ``scale`` thread keeps in flight (one 8-byte double load)
GPU_STREAM_INFLIGHT = 8.0
#: inventory kernel base name (no ``recompute.`` prefix) -> DeepSeek's launch, from the
#: profile's launch records (``train.json``; grid x block, est. achieved occupancy %).
#: The casts (``per_token_cast_to_fp8``, ``per_channel_cast_and_transpose``,
#: ``batched_transpose``), ``expand_to_fused_with_scales``, ``rotary_kernel`` and the
#: head-layout copy run at 100 % in their large launches and are not listed. Nor is
#: Triton's ``_copy_tensor_kernel`` (31 %): the inventory's bytes for it (336 MB) would
#: take 3.3 TB/s in its profiled 103 µs, above the streaming rate, so the inventory's
#: kernel is not the same work and its occupancy would not say how long it takes.
DEEPSEEK = {
    # flash-attention's layer_norm (Dao-AILab/flash-attention csrc/layer_norm,
    # ln_fwd_cuda_kernel.cu at 50c7b6b4: a persistent grid of SMs x the CTAs per SM
    # cudaOccupancyMaxActiveBlocksPerMultiprocessor allows; hidden 4096/5120 register
    # CTAS_PER_ROW 1, WARPS_M 1, WARPS_N 4, BYTES_PER_LDG 16). The profile's
    # ln_fwd_kernel: grid 396 = 132 x 3, 128 threads (19 %); at 7168 each thread
    # loads 7168 x 2 B / (128 x 16 B) = 7 vectors of 16 B of the row: 112 B in flight
    "norm": Launch("layer_norm::ln_fwd_kernel", 19.0, 0, 112.0, 3, 3),
    "add_norm": Launch("layer_norm::ln_fwd_kernel (with the residual)", 19.0, 0, 224.0,
                       3, 3),
    # ln_bwd_kernel: grid 132 x 256 (one CTA per SM, 13 %); each thread loads at least
    # one 16-byte vector of each of dz and x per row: 32 B in flight at the least
    # (its launcher in csrc/layer_norm at 50c7b6b4: the same persistent grid, SMs x CTAs
    # per SM, each CTA walking rows in a stride of the grid)
    "norm_bwd": Launch("layer_norm::ln_bwd_kernel", 13.0, 0, 32.0, 1, 1),
    "norm_add_bwd": Launch("layer_norm::ln_bwd_kernel (with the residual)", 13.0, 0,
                           32.0, 1, 1),
    # DeepSeek's own kernels (source not public): gpu-stream's 8 B per thread
    # cuda::swiglu_forward_backward_with_weight_impl, grid ~17,000 x 128 (77 registers)
    "expert_act_bwd": Launch("cuda::swiglu_forward_backward_with_weight_impl", 38.0),
    # cuda::swiglu_weight_backward_with_weight_impl, grid 53,000-64,000 x 128 (the routing
    # weights' gradient, moesim.model.kernels.deepseek)
    "expert_act_weight_bwd": Launch("cuda::swiglu_weight_backward_with_weight_impl", 75.0),
    # cuda::swiglu_backward, grid 112 x 1024 (one block per SM of the 112 DeepEP leaves).
    # The profile's occupancy (42 %) is its warps per SM averaged over all 132 SMs
    # (27.15 = 112 x 32 / 132): each of the 112 SMs that runs a block holds 32 of 64
    # warps, 50 %, the occupancy on the SMs the kernel runs on (as the 4-block kernels'
    # 25 % below)
    "shared_act_bwd": Launch("cuda::swiglu_backward", 50.0, 112, per_sm=1),
    # cuda::reduce_fused_impl<__nv_bfloat16>(int4 const* x, float const* weights,
    # int const* token_topk_to_pos, int4* out, ...), grid = the tokens DeepEP delivered
    # (26,592-34,144) x 128 threads, 75 % (F: unpermute; B: the permutation's gradient).
    # Its public successor, deepseek-ai/TileKernels tile_kernels/moe/reduce_fused_kernel.py
    # at a06642db (the same arguments): one block of 128 threads per token, each thread
    # summing its hidden / 128 elements of each of the token's rows into a register
    # fragment, the row loaded as independent 16-byte vectors: at hidden 7,168, 56 BF16
    # = 112 B in flight per thread (as flash-attention's ln_fwd)
    "unpermute": Launch("cuda::reduce_fused_impl", 75.0, 0, 112.0),
    "permute_bwd": Launch("cuda::reduce_fused_impl", 75.0, 0, 112.0),
    # cuda::cast_back_impl, grid 112 x 1024: 50 % on its 112 SMs (as swiglu_backward);
    # per_token_cast_back_special_fmt_impl 896 x 128, 6.8 blocks on each of 132 SMs: 42 %
    "cast_back": Launch("cuda::cast_back_impl", 50.0, 112, per_sm=1),
    "per_token_cast_back_special_fmt": Launch("cuda::per_token_cast_back_special_fmt_impl",
                                              42.0),
    # the routing-map kernels: 4 blocks of 512 threads (25 % of each of 4 SMs), each
    # thread one int64 top-k index in flight (``long const*``; TileKernels'
    # get_fused_mapping_kernel.py at 1001fca4 loads one index per lane per step):
    # gpu-stream's 8 B
    "get_fused_mapping": Launch("cuda::get_fused_mapping<512>", 25.0, 4, per_sm=1),
    "clean_and_count_expert": Launch("cuda::clean_and_count_expert<512>", 25.0, 4,
                                     per_sm=1),
}


def curve_gbps(occupancy: float) -> float:
    """gpu-stream's ``scale`` GB/s on 132 H200 SMs at ``occupancy`` %: linear between
    points, zero-based below the first (Little's law: bandwidth ∝ threads in flight),
    the last point's above it."""
    pts = STREAM_BY_OCCUPANCY
    if occupancy <= pts[0][0]:
        return pts[0][1] * max(occupancy, 0.0) / pts[0][0]
    for (a, ra), (b, rb) in zip(pts, pts[1:], strict=False):
        if occupancy <= b:
            return ra + (rb - ra) * (occupancy - a) / (b - a)
    return pts[-1][1]


def rate_gbps(occupancy: float, blocks: int, device_sms: int, stream_gbps: float) -> float:
    """GB/s a streaming kernel reaches at ``occupancy`` % on ``min(blocks, device_sms)``
    SMs (``blocks`` 0: all of them), at most ``stream_gbps``."""
    sms = min(blocks, device_sms) if blocks > 0 else device_sms
    return min(stream_gbps, sms * curve_gbps(occupancy) / CURVE_SMS)


def wave_s(launch: Launch, grid: int, sms: int, stream_gbps: float) -> float:
    """Seconds per byte of a launch of ``grid`` equal blocks on ``sms`` SMs: waves of at
    most ``sms · per_sm`` resident blocks, each spread over ``min(blocks, sms)`` SMs and
    moving its share of the bytes at ``min(stream, SMs used · curve(blocks per SM's
    occupancy) / 132)`` (:func:`rate_gbps`'s rule, wave by wave: a last wave of few
    blocks has few SMs' bandwidth)."""
    per_block = launch.effective / max(launch.per_sm, 1)
    cap = sms * max(launch.per_sm, 1)
    left, t = grid, 0.0
    while left > 0:
        b = min(left, cap)
        used = min(b, sms)
        gbps = min(stream_gbps, used * curve_gbps(per_block * b / used) / CURVE_SMS)
        t += (b / grid) / (gbps * 1e9)
        left -= b
    return t


def wave_ratio(launch: Launch, sms: int, device_sms: int, stream_gbps: float
               ) -> float | None:
    """How much longer ``launch`` takes on ``sms`` of the device's ``device_sms`` SMs than
    on all of them (:func:`wave_s` on each); None when its grid or its blocks per SM are
    not known."""
    grid = launch.blocks or launch.grid_per_sm * device_sms
    if launch.per_sm <= 0 or grid <= 0 or sms <= 0 or device_sms <= 0:
        return None
    return wave_s(launch, grid, sms, stream_gbps) / wave_s(launch, grid, device_sms,
                                                           stream_gbps)
