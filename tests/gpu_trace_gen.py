"""Writes small synthetic GPU Kineto traces with known kernels on known streams.

The layout follows what torch.profiler (Kineto) writes for a CUDA run: CPU events
(``cpu_op``, ``user_annotation``, ``cuda_runtime``) on pid ``CPU_PID``, GPU events
(``kernel``, ``gpu_memcpy``, ``gpu_memset``) on pid = device, tid = stream, linked by
``args.correlation`` and by an ``ac2g`` flow (``s`` at the launch, ``f`` at the kernel).
Times are given in µs, as in the files.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

CPU_PID = 100
MAIN_TID = 100
#: a timestamp origin like a real trace's (epoch µs), so rebasing is exercised
T0_US = 1_740_000_000_000_000


class GpuTraceBuilder:
    def __init__(self, device_name: str = "NVIDIA H800", num_sms: int = 132, rank: int = 0,
                 world: int = 8):
        self.events: list[dict] = []
        self.corr = 1000
        self.props = {"id": 0, "name": device_name, "numSms": num_sms}
        self.rank, self.world = rank, world

    def _x(self, cat: str, name: str, pid: int, tid: int, ts: float, dur: float,
           args: dict | None = None) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0_US + ts,
              "dur": dur, "args": args or {}}
        self.events.append(ev)
        return ev

    def annotation(self, name: str, start: float, dur: float, tid: int = MAIN_TID) -> None:
        self._x("user_annotation", name, CPU_PID, tid, start, dur)

    def op(self, name: str, start: float, dur: float, tid: int = MAIN_TID,
           dims: list | None = None, types: list | None = None) -> None:
        args = {}
        if dims is not None:
            args["Input Dims"] = dims
        if types is not None:
            args["Input type"] = types
        self._x("cpu_op", name, CPU_PID, tid, start, dur, args)

    def kernel(self, name: str, stream: int, start: float, dur: float,
               launch: float | None = None, tid: int = MAIN_TID, grid: tuple = (1, 1, 1),
               link: str = "runtime", cat: str = "kernel", nbytes: int | None = None,
               device: int = 0) -> int:
        """A GPU event launched at ``launch`` (µs; default ``start`` − 5) from thread
        ``tid``; ``link``: ``runtime`` (a cudaLaunchKernel event and an ac2g flow),
        ``flow`` (the flow only) or ``none``. Returns its correlation id."""
        self.corr += 1
        c = self.corr
        t_l = start - 5 if launch is None else launch
        args = {"device": device, "stream": stream, "correlation": c}
        if cat == "kernel":
            args["grid"] = list(grid)
            args["block"] = [128, 1, 1]
        if nbytes is not None:
            args["bytes"] = nbytes
        self._x(cat, name, device, stream, start, dur, args)
        if link == "runtime":
            self._x("cuda_runtime", "cudaLaunchKernel", CPU_PID, tid, t_l, 1,
                    {"correlation": c})
        if link in ("runtime", "flow"):
            self.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": c,
                                "pid": CPU_PID, "tid": tid, "ts": T0_US + t_l})
            self.events.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": c, "bp": "e",
                                "pid": device, "tid": stream, "ts": T0_US + start})
        return c

    def doc(self) -> dict:
        return {"schemaVersion": 1, "deviceProperties": [self.props],
                "distributedInfo": {"backend": "nccl", "rank": self.rank,
                                    "world_size": self.world},
                "traceEvents": list(self.events)}

    def write(self, path: Path, gz: bool = False) -> Path:
        raw = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(raw) if gz else raw)
        return path


# kernel names as the libraries spell them (see moesim.validation.gpu.kernel_names)
GEMM_BF16 = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
             "execute_segment_k_off_kernel__5x_cublas")
GEMM_FP8 = ("void cutlass::device_kernel<deep_gemm::fp8_gemm_kernel<128u, 128u>>"
            "(deep_gemm::Params)")
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add"
               "<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add"
               "<c10::BFloat16>, at::detail::Array<char*, 3>)")
FLASH = "void flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128, 128>>(Flash_fwd_params)"
DEEPEP_DISPATCH = "void deep_ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*)"
DEEPEP_COMBINE = "void deep_ep::internode::combine<false, 8, __nv_bfloat16>(int4*, float*)"
NCCL_A2A = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
UNKNOWN = "my_mystery_kernel(int)"
