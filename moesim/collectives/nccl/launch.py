"""The cost of one NCCL call beyond its kernel's GPU time, launched eagerly or replayed
from a CUDA graph (``overlap.collective_launch``; pure).

What NCCL does per eager call (NVIDIA/nccl ``src/enqueue.cc`` at commit
5067397c2676d5aed50042fc39e5c8ee96eb0027, reached from ``ncclGroupEnd``):
``ncclLaunchPrepare`` plans the call's tasks onto channels (``scheduleCollTasksToPlan``,
``scheduleP2pTasksToPlan``, ``finishPlan``); ``ncclLaunchKernelBefore_NoUncapturedCuda``
uploads the work items (``uploadWork``: kernel arguments or the host-pinned FIFO);
``ncclLaunchKernel`` calls ``cuLaunchKernelEx``; ``ncclLaunchKernelAfter_NoCuda`` hands
proxy operations to the proxy thread (``hostStreamPlanTask``); ``ncclLaunchFinish``
joins the streams. PyTorch's ProcessGroupNCCL adds its own work per call (events between
the caller's stream and NCCL's, the work object). Captured in a CUDA graph the plan is
built once (``ncclDevWorkStorageTypePersistent``) and a replay runs none of this: the
kernel node starts from the GPU.

The model (docs/studies/collective-launch-calibration.md, the split written first):

- eager, a call as a stream of back-to-back calls sees it: ``max(h, t_gpu + L)``: the
  host issues calls no faster than ``h`` (its host time), the GPU runs them no faster
  than the kernel plus one stream launch, ``L`` = 2.43 µs (te42kyfo/gpu-benches
  ``gpu-small-kernels/h200.txt``, commit c35574e; repeated-stream.svg's fit "a= 2433 ns");
- CUDA graph: ``t_gpu + F``, F the device's graph floor per kernel (1.26 µs on Hopper,
  :data:`moesim.compute.devices.HOPPER_GRAPH_KERNEL_S`).

So a simulated collective priced at ``t`` (NCCL's estimate ``t_est`` of its choice) grows
by ``max(L, h - t_est)`` eagerly and by ``F`` inside a graph (:func:`extra_s`).

``h`` is calibrated, the one constant: the median of sglang's eager all-gather figures
on 8 x H100 (:data:`SGLANG_BENCH_SYMM_US`), held out: reduce-scatter and all-to-all
(``python benchmarks/collective_launch.py`` prints their errors). It holds for the
GH100 devices it was measured on (:data:`CALIBRATED_DEVICES`).
"""

from __future__ import annotations

import statistics

from moesim.units import US

#: one kernel launched from a stream on Hopper (gpu-benches h200.txt, see the module doc)
STREAM_LAUNCH_S = 2.43 * US
KiB = 1024
#: sgl-project/sglang benchmark/kernels/all_reduce/bench_symm.sh at commit 8e17681e, its
#: header table "Results (H100 8-GPU, bf16, 500 iters, graph-loop=100)" (measured by
#: benchmark_symm_mem.py at that commit): per-rank input bytes -> µs per call of
#: (all-gather eager, all-gather symm graph, reduce-scatter eager, reduce-scatter symm
#: graph, all-to-all eager, all-to-all symm graph). Eager: back-to-back torch.distributed
#: calls between two CUDA events / iterations; symm graph: 100 PyNccl calls on NCCL
#: symmetric-memory buffers captured in one CUDA graph, replay time / 100.
SGLANG_BENCH_SYMM_US: dict[int, tuple[float, float, float, float, float, float]] = {
    2 * KiB: (14.57, 2.68, 16.06, 2.82, 18.34, 5.45),
    4 * KiB: (14.58, 2.84, 17.48, 2.86, 17.87, 5.51),
    8 * KiB: (14.42, 3.11, 15.82, 3.00, 17.84, 5.57),
    16 * KiB: (14.03, 4.70, 18.66, 3.01, 17.70, 5.57),
    32 * KiB: (14.37, 5.07, 18.74, 3.25, 17.90, 6.25),
    64 * KiB: (15.94, 5.35, 15.89, 3.41, 24.99, 6.82),
    128 * KiB: (18.14, 6.90, 17.12, 4.24, 21.18, 7.00),
}
#: column of each op's eager and graph figures in :data:`SGLANG_BENCH_SYMM_US`
SGLANG_COLUMNS = {"all_gather": (0, 1), "reduce_scatter": (2, 3), "all_to_all": (4, 5)}
#: the calibration split (docs/studies/collective-launch-calibration.md)
CALIBRATED_ON = "all_gather"
HELD_OUT = ("reduce_scatter", "all_to_all")
#: the host time of one eager NCCL call (PyTorch + NCCL's enqueue path): the median of
#: the all-gather eager figures, the split's calibration (14.57 µs)
CALL_HOST_S = statistics.median(v[SGLANG_COLUMNS[CALIBRATED_ON][0]]
                                for v in SGLANG_BENCH_SYMM_US.values()) * US
#: devices the calibration holds for: H100 (measured) and H800, the same GH100 and host path
CALIBRATED_DEVICES = ("H100", "H800")


def eager_call_s(t_gpu_s: float, host_s: float = CALL_HOST_S,
                 launch_s: float = STREAM_LAUNCH_S) -> float:
    """Seconds per eager call as back-to-back calls see it: ``max(h, t_gpu + L)``."""
    return max(host_s, t_gpu_s + launch_s)


def graph_call_s(t_gpu_s: float, floor_s: float) -> float:
    """Seconds per call replayed from a CUDA graph: the kernel plus the graph floor."""
    return t_gpu_s + floor_s


def extra_s(t_est_s: float, graph_floor_s: float | None, host_s: float = CALL_HOST_S,
            launch_s: float = STREAM_LAUNCH_S) -> float:
    """What a collective whose GPU time NCCL estimates at ``t_est_s`` costs beyond it:
    eagerly (``graph_floor_s`` None) ``max(L, h - t_est)``, inside a CUDA graph the
    floor."""
    if graph_floor_s is not None:
        return float(graph_floor_s)
    return max(launch_s, host_s - t_est_s)
