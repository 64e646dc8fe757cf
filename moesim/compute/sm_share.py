"""Kernels on fewer SMs than the device has: the wave quantisation of tiled GEMMs.

Published kernel rates (DeepGEMM's tables, FlashAttention's figures) are measured on the
whole GPU. In an overlapped DualPipe pair the communication kernels hold some SMs
(DeepEP's normal kernels: 20 of an H800's 132, DeepSeek-V3 report arXiv:2412.19437
§3.2.2), and DeepSeek's FP8 GEMMs are launched on the SMs left: every one of them in
DeepSeek's public training profile (github.com/deepseek-ai/profile-data train.json)
runs a grid of 112 = 132 - 20 blocks, and DeepGEMM exposes that choice as
``deep_gemm.set_num_sms`` (README at commit a6d97a1c, "Utilities").

A persistent GEMM walks its output tiles over the SMs it has: the busiest SM computes
``ceil(tiles / sms)`` of them (one "wave" per tile), so on ``sms`` of the device's ``S``
SMs a GEMM published at time ``t(S)`` takes

    t(sms) = t(S) · ceil(tiles / sms) / ceil(tiles / S)

(the launch overhead not scaled): DeepGEMM counts waves the same way when it picks its
tiles (deep_gemm/jit_kernels/gemm.py ``get_best_configs`` at a6d97a1c:
``ceil(ceil(m / bm) · ceil(n / bn) · groups / num_sms)``). Tiles are BLOCK_M × BLOCK_N =
128 × 128 of the kernel's output (BLOCK_M is 128 there for m > 64; 128 is the largest
of its BLOCK_N candidates 16-128; the tile each real launch picked is not published):
forward Y (m × n), input gradient dX (m × k), weight gradient dW (k × n); a grouped
launch's groups each have their own tiles. For a large GEMM the ratio tends to S / sms;
a GEMM of fewer tiles than SMs loses nothing; between, the ratio steps.

Under ``compute.memory_kernels: deepseek`` a memory-bound kernel whose launch DeepSeek's
profile records (grid and blocks resident per SM, :data:`moesim.compute.occupancy.DEEPSEEK`)
is counted in waves the same way, each wave at the bandwidth its SMs reach
(:func:`moesim.compute.occupancy.wave_ratio`): flash-attention's ``ln_bwd_kernel``, a
persistent grid of one block on each of the 132 SMs, runs in two waves on 112 (2×, the
profile's ~98 µs alone against ~182 µs beside DeepEP); its ``ln_fwd_kernel`` (three
blocks on each) keeps the HBM busy in the first wave and has 60 blocks left for a second
(~1.26×; the profile: ~1.19×); a kernel launched on 112 blocks loses nothing.

Every other kernel (attention, memory-bound kernels) runs at ``sms / S`` of its rate, as
both engines slow compute that shares its GPU with communication kernels
(:mod:`moesim.engine.exact.execute`).
"""

from __future__ import annotations

import math
from typing import Any

from moesim.compute import memory_kernels
from moesim.compute.base import Kernel, per_launch_s

#: Output tile of the GEMM kernels (see the module docstring).
BLOCK_M = 128
BLOCK_N = 128
GEMM_KINDS = ("gemm", "grouped_gemm", "kgrouped_gemm")
GROUPED_KINDS = ("grouped_gemm", "kgrouped_gemm")


def gemm_tiles(k: Kernel) -> tuple[int, int]:
    """(output tiles of one launch, launches) of a GEMM kernel: ``count`` launches,
    except a grouped kind, whose ``count`` experts share one launch."""
    count = max(k.count, 1)
    groups = max(k.groups, 1)
    if k.pass_ == "wgrad":
        rows, cols, per = k.k, k.n, groups          # dW (k × n) per group
    elif k.pass_ == "dgrad":
        rows, cols, per = math.ceil(k.m / groups), k.k, groups
    else:
        rows, cols, per = math.ceil(k.m / groups), k.n, groups
    tiles = per * math.ceil(rows / BLOCK_M) * math.ceil(cols / BLOCK_N)
    if k.kind in GROUPED_KINDS:
        return tiles * count, 1
    return tiles, count


def waves(tiles: int, sms: int) -> int:
    """Tiles on the busiest of ``sms`` SMs."""
    return math.ceil(tiles / sms)


def sm_ratio(k: Kernel, sms: int, total: int) -> float:
    """How much longer ``k`` takes on ``sms`` of ``total`` SMs than on all of them."""
    if sms >= total or total <= 0:
        return 1.0
    if sms <= 0:
        return math.inf
    if k.kind in GEMM_KINDS and k.m > 0 and k.n > 0 and k.k > 0:
        tiles, _ = gemm_tiles(k)
        return waves(tiles, sms) / waves(tiles, total)
    return total / sms


class OnSms:
    """``model``'s kernel times on ``sms`` of the device's SMs (a ComputeModel)."""

    def __init__(self, model: Any, sms: int) -> None:
        self.model = model
        self.sms = int(sms)
        dev = getattr(model, "device", None)
        self.total = int(getattr(dev, "sms", 0) or 0)
        self.launch_overhead_s = float(getattr(model, "launch_overhead_s", 0.0) or 0.0)
        self.graph_kernel_s = float(getattr(model, "graph_kernel_s", 0.0) or 0.0)
        self.name = f"{getattr(model, 'name', type(model).__name__)} on {self.sms} SMs"

    def time_s(self, k: Kernel) -> float:
        t = self.model.time_s(k)
        r = sm_ratio(k, self.sms, self.total)
        if r != 1.0:
            r = memory_kernels.wave_ratio(self.model, k, self.sms) or r
        if r == 1.0:
            return t
        per = per_launch_s(k, self.launch_overhead_s, self.graph_kernel_s)
        fixed = min(max(k.count, 1) * per, t)
        return fixed + (t - fixed) * r


def pair_sms(res: Any) -> int | None:
    """SMs a scenario's compute kernels keep in an overlapped DualPipe(V) pair, where one
    micro-batch's expert-parallel kernels run under the other's compute for nearly the
    whole pair: the device's SMs less those the EP backend's kernels hold. None when the
    scenario overlaps no SM-holding communication that way (or the device has no SM
    count)."""
    scn = res.scenario
    total = int(getattr(res.device, "sms", 0) or 0)
    if total <= 0 or scn.schedule.kind not in ("dualpipe", "dualpipev"):
        return None
    held = scn.parallel.ep_backend.held_sms(scn.overlap.nccl_sms)
    if held <= 0 or held >= total:
        return None
    return total - held
