"""GEMMs pinned to the SMs the communication kernels leave, for a whole step.

SGLang's prefill two-batch overlap (TBO) runs the forward pass of both micro-batches
inside ``deep_gemm_wrapper.configure_deep_gemm_num_sms(operations_strategy.
deep_gemm_num_sms)`` (sgl-project/sglang, python/sglang/srt/two_batch_overlap.py
``_model_forward_tbo``, commit bd2b1925), and for a prefill (``ForwardMode.EXTEND``) that
number is the device's SMs less DeepEP's (python/sglang/srt/operations_strategy.py
``_compute_moe_deepseek_blog_prefill`` at commit 1e90555b: ``total_num_sms -
DeepEPConfig.get_instance().num_sms``; ``DeepEPConfig.num_sms`` is DeepEP's
``Buffer.num_sms``, 20, unless a config says otherwise): every DeepGEMM launch of the
step, whether or not an all-to-all is in flight, walks its tiles over 112 of an H100's
132 SMs. The decode strategy (``_compute_moe_deepseek_blog_decode``) sets
``deep_gemm_num_sms=None``: all SMs.

DeepGEMM is an FP8 GEMM library (deepseek-ai/DeepGEMM README at a6d97a1c: "clean and
efficient FP8 General Matrix Multiplications"), so the pinned kernels are the FP8 GEMMs
(:data:`moesim.compute.sm_share.GEMM_KINDS` whose ``dtype``, or the scenario's precision
when unset, is ``fp8``); BF16 GEMMs (the router, an unquantised LM head) run on cuBLAS
over the whole GPU, as every other kernel does. A pinned GEMM is priced by wave
quantisation on the SMs left (:func:`moesim.compute.sm_share.sm_ratio`, through
:class:`moesim.compute.sm_share.OnSms`), and the engines do not slow it again while a
communication kernel holds SMs: it never had them (:func:`pinned_s` gives the part of a
kernel list's time that is pinned; ``Op.pinned_s`` carries it to the engines).

Training (``overlap.gemm_sms: left_by_ep``, DualPipe(V) steps: :func:`step_gemms`):
DeepSeek's public training profile (github.com/deepseek-ai/profile-data, ``train.json``)
launches every FP8 GEMM of its DualPipe forward+backward pair, the ``fp8_ptp128c``,
``fp8_dptp128c_acc`` and ``m_grouped_fp8`` kernels of its in-house CUTLASS library,
forward, input-gradient and weight-gradient alike, on a grid of 112 = 132 - 20 blocks
(grids [112, 1, 1], [2, 56, 1], [1, 112, 1]), the 20 being DeepEP's
(DeepSeek-V3 report, arXiv:2412.19437, §3.2.2). The SM count is a process-wide setting
(DeepGEMM's ``deep_gemm.set_num_sms``, README at a6d97a1c, "Utilities"; SGLang sets it
once around the whole forward), so moesim takes it for the chunks that run alone too
(DualPipe's warm-up and cool-down): the profile holds one overlapped pair only, so that
part is a reading of the setting, not a measurement.
"""

from __future__ import annotations

from typing import Any

from moesim.compute.base import Kernel
from moesim.compute.sm_share import GEMM_KINDS, OnSms
from moesim.schedule.dualpipe import KINDS as DUAL_KINDS

#: ``serve.gemm_sms``: ``all``, every kernel on the whole GPU (slowed only while a
#: communication kernel holds SMs); ``left_by_ep``, the FP8 GEMMs on the SMs the EP
#: backend's kernels leave, for the whole step (SGLang's prefill TBO)
GEMM_SMS = ("all", "left_by_ep")


def is_pinned(k: Kernel, precision: str) -> bool:
    """Whether ``k`` is a DeepGEMM launch: an FP8 GEMM (``dtype`` or, unset, the
    scenario's ``precision``)."""
    return k.kind in GEMM_KINDS and (k.dtype or precision) == "fp8"


class PinnedGemms:
    """``model``'s kernel times with the FP8 GEMMs on ``sms`` of the device's ``total``
    SMs (a ComputeModel). ``launch_s`` / ``graph_s``: the fixed cost per launch (host,
    CUDA graph), not scaled by the SM ratio (as :class:`OnSms`)."""

    def __init__(self, model: Any, sms: int, total: int, precision: str,
                 launch_s: float = 0.0, graph_s: float = 0.0) -> None:
        self.model = model
        self.precision = precision
        self.sms, self.total = int(sms), int(total)
        self._on = OnSms(model, sms)
        self._on.total = self.total
        self._on.launch_overhead_s = float(launch_s)
        self._on.graph_kernel_s = float(graph_s)
        self.name = f"{getattr(model, 'name', type(model).__name__)},fp8 GEMMs on {sms} SMs"
        self._memo: dict[int, tuple[tuple, float]] = {}

    def __getattr__(self, attr: str) -> Any:     # e.g. ``device``
        model = self.__dict__.get("model")
        if model is None or attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(model, attr)

    def time_s(self, k: Kernel) -> float:
        if is_pinned(k, self.precision):
            return self._on.time_s(k)
        return self.model.time_s(k)

    def pinned_s(self, kernels: tuple, memo: bool = True) -> float:
        """Seconds of ``kernels`` that run pinned: the sum of the pinned kernels' times,
        in list order (``memo``: memoized per tuple, for the tuples ops share)."""
        hit = self._memo.get(id(kernels)) if memo else None
        if hit is not None and hit[0] is kernels:
            return hit[1]
        p = 0.0
        for k in kernels:
            if is_pinned(k, self.precision):
                p += self._on.time_s(k)
        if memo:
            self._memo[id(kernels)] = (kernels, p)   # the tuple kept: its id stays its own
        return p


def step_gemms(res: Any, model: Any = None) -> PinnedGemms | None:
    """``overlap.gemm_sms: left_by_ep`` of a training scenario ``res`` (resolved): its
    compute model (``model``, default ``res.compute``) with the FP8 GEMMs on the SMs the
    EP backend's kernels leave, for the whole step; None when the knob is off or those
    kernels hold no SMs (or all of them, or the device has no SM count), or the schedule
    is not DualPipe(V) (``schedule.kind: dualpipe | dualpipev``: the step DeepSeek
    profiled; elsewhere the knob changes nothing, so a what-if that swaps the schedule
    keeps working)."""
    scn = res.scenario
    if (getattr(scn.overlap, "gemm_sms", "all") != "left_by_ep"
            or scn.schedule.kind not in DUAL_KINDS):
        return None
    total = int(getattr(res.device, "sms", 0) or 0)
    held = scn.parallel.ep_backend.held_sms(scn.overlap.nccl_sms)
    if total <= 0 or not 0 < held < total:
        return None
    inner = res.compute
    return PinnedGemms(inner if model is None else model, total - held, total,
                       scn.compute.precision,
                       float(getattr(inner, "launch_overhead_s", 0.0) or 0.0),
                       float(getattr(inner, "graph_kernel_s", 0.0) or 0.0))


def pinned_model(model: Any) -> PinnedGemms | None:
    """``model`` when it pins GEMMs (a :class:`PinnedGemms`), else None."""
    return model if isinstance(model, PinnedGemms) else None
