"""GPU kernel names → classes, from the names the libraries give their kernels.

Classes (``classify`` returns one, plus a communication kind for comm kernels):

- ``gemm``: cuBLAS/cuBLASLt (``sm90_xmma_gemm_*``, ``nvjet_*``, ``ampere_*gemm*``,
  ``cutlass_*gemm*``), CUTLASS ``device_kernel<...GemmKernel>``, torch.compile's Triton
  GEMM templates (``triton_tem_fused_mm*``, ``_addmm``, ``_bmm``), grouped GEMMs
  (``grouped_gemm``, DeepGEMM ``fp8_gemm_kernel``, ``m_grouped_*``); the dtype from the
  name (``fp8``/``e4m3``/``e5m2`` → fp8; ``bf16`` → bf16; ``f16``/``fp16`` → fp16;
  ``tf32``, ``f32``/``sgemm`` → fp32), else ``""``;
- ``attention``: flash attention (``flash::``, ``flash_fwd``, ``FlashAttn``, ``fmha``,
  ``attn_fwd``/``attn_bwd``, cuDNN ``sdpa``);
- ``comm``: NCCL kernels (``ncclKernel_<Coll>_...``, ``ncclDevKernel_<Coll>_...``; kind
  ``nccl:<Coll>``, e.g. ``nccl:AllReduce``, ``nccl:SendRecv``) and DeepEP kernels
  (namespace ``deep_ep::`` or, as DeepSeek's own build spells it, ``dpsk::ep::``): kind
  ``layout`` (``get_dispatch_layout``), ``notify`` (``notify_dispatch``,
  ``cached_notify``, ``notify_combine``), ``dispatch``, ``combine``; the low-latency
  kernels (namespace ``internode_ll``) ``dispatch_ll``, ``combine_ll``, ``clean_ll``;
  the namespaces in between (``legacy``, ``internode``) may be any;
- ``cast``: casts and quantisation (``cast``, ``quant``, ``fp8`` in the name, not its
  argument list, of a kernel that is no GEMM and not torch's own, e.g.
  ``per_token_cast_to_fp8``);
- ``norm``: layer/RMS norms (``layer_norm``, ``rms_norm``, ``rmsnorm``, ``ln_fwd``);
- ``elementwise``: elementwise and other memory-bound torch/CUDA kernels (every
  ``at::native::`` kernel that is no GEMM or attention: elementwise, reduce, copy, fill,
  scatter/gather, index, top-k; and by name ``transpose``, ``copy``,
  ``rotary``, ``softmax``, ``topk``, ``swiglu``/``silu``/``gelu``; torch.compile's
  Triton pointwise/reduction kernels ``triton_poi_*``, ``triton_red_*``, ``triton_per_*``);
- ``memcpy``, ``memset``: the copy and set events (Kineto cats ``gpu_memcpy``, ``gpu_memset``);
- ``other``: anything else; :mod:`moesim.validation.gpu.summary` lists these names.

The rules come from the kernel names in the libraries' sources: NCCL
``src/device/generate.py`` (``ncclDevKernel_<Func>_<RedOp>_<Type>_<Algo>_<Proto>``),
DeepEP ``csrc/kernels/legacy/{layout,intranode,internode,internode_ll}.cu`` (namespace
``deep_ep::legacy::<file>``; ``deep_ep::<file>`` in earlier releases), and from the
names in DeepSeek's published profile (``dpsk::ep::``, ``dpsk::grouped_gemm::``,
``flash::``, ``layer_norm::``).
"""

from __future__ import annotations

import re

CLASSES = ("gemm", "attention", "comm", "cast", "norm", "elementwise", "memcpy", "memset",
           "other")
COMPUTE_CLASSES = tuple(c for c in CLASSES if c != "comm")

_NCCL_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_DEEPEP_RE = re.compile(r"(?:deep_ep|dpsk::ep)((?:::\w+)+)")
_GEMM_RE = re.compile(r"gemm|GemmKernel|nvjet|gemv|matmul|triton_tem_fused_(?:add|b)?mm",
                      re.IGNORECASE)
_ATTN_RE = re.compile(r"flash::|flash_fwd|flash_bwd|FlashAttn|fmha|attn_fwd|attn_bwd|sdpa",
                      re.IGNORECASE)
_CAST_RE = re.compile(r"cast|quant|fp8|float8|e4m3|e5m2", re.IGNORECASE)
_NORM_RE = re.compile(r"layer_?norm|rms_?norm|ln_fwd|ln_bwd|group_?norm|batch_?norm",
                      re.IGNORECASE)
_ELEM_RE = re.compile(r"at::native::|triton_(?:poi|red|per)_|elementwise|reduce|copy|fill|scatter|gather|index|"
                      r"transpose|rotary|rope|softmax|topk|sort|swiglu|silu|gelu|relu|"
                      r"sigmoid|arange|tensormap|DistributionNormal|distribution",
                      re.IGNORECASE)
# torch's own kernels (their template arguments name LoadWithCast, FillFunctor, ...)
_TORCH_RE = re.compile(r"at::native::|_ZN2at6native")
# names of helper kernels inside a GEMM library's namespace that are no GEMM
_GEMM_HELPER_RE = re.compile(r"transpose|tensormap|fill_|layout|scale", re.IGNORECASE)


def gemm_dtype(name: str) -> str:
    """``fp8``, ``bf16``, ``fp16``, ``fp32`` from a GEMM kernel's name, else ``""``."""
    low = name.lower()
    if re.search(r"fp8|e4m3|e5m2|f8f8|float8", low):
        return "fp8"
    if "bf16" in low or "bfloat16" in low:
        return "bf16"
    if re.search(r"fp16|f16|hgemm|half|_h[sh]{2}_", low):
        return "fp16"
    if re.search(r"tf32|f32|sgemm|float", low):
        return "fp32"
    return ""


def _deepep_kind(path: str) -> str:
    """``::legacy::internode_ll::dispatch`` → ``dispatch_ll``: the last name is the
    kernel, a namespace ending in ``_ll`` marks the low-latency kernels."""
    *ns, fn = path.strip(":").split("::")
    ll = any(n.endswith("_ll") for n in ns)
    if "layout" in fn:
        return "layout"
    if "notify" in fn:
        return "notify"
    if "clean" in fn:
        return "clean_ll" if ll else "notify"
    for kind in ("dispatch", "combine"):
        if kind in fn:
            return f"{kind}_ll" if ll else kind
    return "deepep_other"


def classify(name: str, cat: str = "kernel") -> tuple[str, str]:
    """(class, communication kind) of one GPU event; the kind is ``""`` unless the
    class is ``comm``."""
    if cat == "gpu_memcpy":
        return "memcpy", ""
    if cat == "gpu_memset":
        return "memset", ""
    m = _NCCL_RE.search(name)
    if m:
        return "comm", f"nccl:{m.group(1)}"
    m = _DEEPEP_RE.search(name)
    if m:
        return "comm", _deepep_kind(m.group(1))
    if _ATTN_RE.search(name):
        return "attention", ""
    if _GEMM_RE.search(name) and not _GEMM_HELPER_RE.search(_function_part(name)):
        return "gemm", ""
    head = name.split("(", 1)[0]      # the arguments' types say nothing of the kind
    if _TORCH_RE.search(head):
        return "elementwise", ""
    if _CAST_RE.search(head):
        return "cast", ""
    if _NORM_RE.search(name):
        return "norm", ""
    if _ELEM_RE.search(name):
        return "elementwise", ""
    return "other", ""


def _function_part(name: str) -> str:
    """The kernel's own name without its namespace and template/arguments
    (``void a::b::transpose<512>(int)`` → ``transpose``), so a GEMM library's helper
    kernels (its transposes, tensor-map fills) are told from its GEMMs."""
    head = name.split("(", 1)[0].split("<", 1)[0]
    return head.rsplit("::", 1)[-1].removeprefix("void ").strip()

