"""Memory-bound kernels by kind, size and implementation (``compute.memory_kernels``).

Under ``stream`` (the default) every ``memory`` kernel moves its bytes at the device's
published streaming bandwidth (:func:`moesim.compute.catalog_pricing.rate`). Under
``eager`` (PyTorch eager ops), ``fused`` (Megatron-Core / Transformer Engine fused
kernels) or ``liger`` (Liger-Kernel's Triton kernels), a kernel whose kind has a
``memory_op`` table for that implementation moves its bytes at the rate achieved at its
size, as the table's authors measured it:

- the kernel's op is read from its name (:data:`OPS`: ``norm`` → ``rmsnorm``,
  ``*_act`` → ``swiglu``, ``loss`` → ``cross_entropy``, ``rotary_kernel`` → ``rope``, the
  FP8 casts → ``cast``, ``permute``/``unpermute`` → ``permute``); its pass picks the table
  (``fwd``, ``dgrad``);
- a table's rows are published (rows, cols, ms) measurements; with the table's traffic
  model (``bytes_per_element`` × rows × cols + ``bytes_per_row`` × rows, the same bytes
  the kernel inventory counts for that kernel, :mod:`moesim.model.kernels`) each is a
  point (bytes moved, achieved GB/s);
- the kernel's rate is interpolated log-log along bytes per launch between points and
  held at the nearest end outside them (so time stays non-decreasing in bytes); its time
  is its bytes / that rate (the catalog adds the launch cost);
- an implementation without a table for the op takes the next less fused one's
  (:data:`FALLBACK`: liger → fused → eager), and no table at all leaves the stream rate,
  each saying so in the detail.

``deepseek`` (off by default; DeepSeek's own kernels, as its public profile launches
them): a kernel that DeepSeek's training code runs as a kernel of its own
(:data:`moesim.compute.occupancy.DEEPSEEK`) moves its bytes at the streaming rate its
occupancy and block count allow (:func:`moesim.compute.occupancy.rate_gbps`,
gpu-benches' bandwidth by occupancy); every other kernel is priced as under ``fused``.
Under it the inventory also lists the kernels where and as DeepSeek launches them
(:mod:`moesim.model.kernels.deepseek`).

Tables: ``moesim/data/kernels/liger.yaml`` (docs/kernels.md "Memory-bound kernels by
kind and size"). A table may instead give one ``gbps`` for every size (e.g. a rate
calibrated with a written split, docs/studies/memory-kernel-calibration.md).
"""

from __future__ import annotations

import math
from typing import Any

from moesim.compute import occupancy
from moesim.compute.base import Kernel
from moesim.errors import InputError

#: ``compute.memory_kernels``: ``stream`` first
STREAM = "stream"      # every memory kernel at the device's streaming bandwidth
DEEPSEEK = "deepseek"  # DeepSeek's kernels at their occupancy's rate, the rest as fused
IMPLS = (STREAM, "eager", "fused", "liger", DEEPSEEK)
#: the default of ``compute.memory_kernels`` (moesim.compute.select reads it): Megatron-Core's
#: and Transformer Engine's fused kernels, the ones the reference training code runs
#: (Megatron-LM's ``bias_swiglu_impl``, fused RMSNorm and vocab-parallel cross-entropy);
#: ``stream`` keeps every memory kernel at the streaming rate
DEFAULT_IMPL = "fused"
#: an implementation without a table for an op takes the next fused one's rows, never
#: the eager ops' (a fused implementation does not run them): with none, the stream rate
#: (RoPE under ``fused``: Transformer Engine's fused RoPE publishes no rate by size)
FALLBACK = {"liger": ("liger", "fused"), "fused": ("fused",), "eager": ("eager",),
            DEEPSEEK: ("fused",)}
#: ops a memory_op table may name
OP_NAMES = ("rmsnorm", "swiglu", "cross_entropy", "cast", "permute", "rope")
#: kernel base names (no ``recompute.`` prefix, no ``_bwd`` suffix) -> op
OPS = {
    "norm": "rmsnorm",
    "expert_act": "swiglu", "shared_act": "swiglu", "dense_act": "swiglu",
    "loss": "cross_entropy",
    "per_token_cast_to_fp8": "cast", "per_channel_cast_and_transpose": "cast",
    "batched_transpose": "cast",
    "permute": "permute", "unpermute": "permute",
    "rotary_kernel": "rope",
    # fused kernels (compute.fusion, moesim.model.kernels.fusion): their memory-bound part
    "add_norm": "rmsnorm", "norm_cast": "rmsnorm", "add_norm_cast": "rmsnorm",
    "norm_add": "rmsnorm", "permute_cast": "permute", "loss_chunked": "cross_entropy",
}
MEMORY_COLUMNS = ("rows", "cols", "ms")
#: ``compute.fusion``: the fusions a scenario may name (moesim.model.kernels.fusion); the
#: default is none, the kernels as the inventory lists them
FUSIONS = ("residual_norm", "norm_cast", "act_cast", "permute_cast", "ce_chunked")


def op_of(kernel: Kernel) -> str:
    """The memory op of ``kernel`` by its name (an FP8 SwiGLU with the cast fused in is
    a SwiGLU), else ``cast`` or ``permute`` by its class; "" when none."""
    name = kernel.name.removeprefix("recompute.")
    op = OPS.get(name.removesuffix("_bwd"), "")
    return op or (kernel.kclass if kernel.kclass in ("cast", "permute") else "")


def _bad(file: str, field: str, expected: str, got: Any) -> InputError:
    return InputError(file, field, expected, got)


def _num(v: Any, file: str, field: str, zero: bool = False) -> float:
    ok = (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
          and (v >= 0 if zero else v > 0))
    if not ok:
        raise _bad(file, field, "a non-negative number" if zero else "a positive number", v)
    return float(v)


def parse_table(t: dict, file: str, at: str) -> dict:
    """The ``memory_op`` fields of table ``t``: ``op``, ``impls`` and either ``gbps`` or
    ``columns: [rows, cols, ms]``, ``rows`` and the traffic model (``bytes_per_element``,
    ``bytes_per_row``, default 0) → {op, impls, gbps, points}; points (bytes, GB/s) by
    bytes, time non-decreasing in bytes. InputError naming the field otherwise."""
    op = t.get("op")
    if op not in OP_NAMES:
        raise _bad(file, f"{at}.op", f"one of {', '.join(OP_NAMES)}", op)
    impls = t.get("impls")
    table_impls = IMPLS[1:4]
    if (not isinstance(impls, list) or not impls
            or any(i not in table_impls for i in impls)):
        raise _bad(file, f"{at}.impls", f"a non-empty list of {', '.join(table_impls)}",
                   impls)
    out: dict[str, Any] = {"op": op, "impls": tuple(impls)}
    if "gbps" in t:
        if "rows" in t or "columns" in t:
            raise _bad(file, f"{at}.gbps", "gbps or rows, not both", t["gbps"])
        out["gbps"] = _num(t["gbps"], file, f"{at}.gbps")
        return out
    if t.get("columns") != list(MEMORY_COLUMNS):
        raise _bad(file, f"{at}.columns", "[rows, cols, ms]", t.get("columns"))
    bpe = _num(t.get("bytes_per_element"), file, f"{at}.bytes_per_element")
    bpr = _num(t.get("bytes_per_row", 0), file, f"{at}.bytes_per_row", zero=True)
    rows = t.get("rows")
    if not isinstance(rows, list) or not rows:
        raise _bad(file, f"{at}.rows", "a non-empty list of [rows, cols, ms]", rows)
    pts = []
    for i, r in enumerate(rows):
        where = f"{at}.rows[{i}]"
        if not isinstance(r, list) or len(r) != 3:
            raise _bad(file, where, "a list of 3 numbers (rows, cols, ms)", r)
        n, c, ms = (_num(v, file, f"{where}.{col}") for v, col in zip(r, MEMORY_COLUMNS,
                                                                        strict=True))
        nbytes = bpe * n * c + bpr * n
        pts.append((nbytes, nbytes / (ms * 1e-3) / 1e9))
    pts.sort()
    for (a, ra), (b, rb) in zip(pts, pts[1:], strict=False):
        if a == b:
            raise _bad(file, f"{at}.rows", "one row per size", f"two rows of {a:g} bytes")
        if rb / ra > b / a:
            raise _bad(file, f"{at}.rows", "time non-decreasing in bytes",
                       f"{a / ra * 1e-6:.4g} ms at {a:g} bytes, {b / rb * 1e-6:.4g} ms at "
                       f"{b:g} bytes")
    out["points"] = tuple(pts)
    return out


def rate_at(points: tuple, nbytes: float) -> tuple[float, str]:
    """GB/s at ``nbytes`` per launch: a point's own, log-log between points, the nearest
    end's held outside them."""
    if nbytes <= points[0][0]:
        return points[0][1], "exact" if nbytes == points[0][0] else "held below"
    if nbytes >= points[-1][0]:
        return points[-1][1], "exact" if nbytes == points[-1][0] else "held above"
    for (a, ra), (b, rb) in zip(points, points[1:], strict=False):
        if nbytes == a:
            return ra, "exact"
        if a < nbytes < b:
            w = math.log(nbytes / a) / math.log(b / a)
            return math.exp(math.log(ra) + w * math.log(rb / ra)), "interpolated"
    return points[-1][1], "exact"


def price(model: Any, kernel: Kernel, stream: Any) -> tuple[float, str] | str:
    """A ``memory`` kernel under ``model.memory_kernels``: its op's table for the
    implementation (or the next one's), else ``stream(model, kernel)``."""
    impl = getattr(model, "memory_kernels", DEFAULT_IMPL)
    if impl == STREAM:
        return stream(model, kernel)
    if impl == DEEPSEEK:
        got = by_occupancy(model, kernel, stream)
        if got is not None:
            return got
    op = op_of(kernel)
    pass_ = kernel.pass_ or "fwd"
    tables = [t for t in model.tables_for(kernel)
              if t.kind == "memory_op" and t.op == op and pass_ in t.passes] if op else []
    for cand in FALLBACK[impl]:
        t = next((t for t in tables if cand in t.impls), None)
        if t is None:
            continue
        per = kernel.bytes / max(kernel.count, 1)
        gbps, how = (t.gbps, "one rate") if t.gbps else rate_at(t.points, per)
        note = "" if cand == impl else f" (no {impl} table: {cand}'s)"
        return kernel.bytes / (gbps * 1e9), (f"{t.id} {per / 1e6:.4g} MB: {how} "
                                             f"{gbps:.4g} GB/s{note}")
    got = stream(model, kernel)
    if isinstance(got, str):
        return got
    why = f"no {op} {pass_} table" if op else "no memory_op for this kernel"
    return got[0], f"{got[1]} ({why}: stream)"


def by_occupancy(model: Any, kernel: Kernel, stream: Any) -> tuple[float, str] | None:
    """A kernel DeepSeek launches as its own (:data:`occupancy.DEEPSEEK`): its bytes at
    the rate its occupancy and blocks allow, at most the streaming rate; None for any
    other kernel (or where the stream rate does not price it)."""
    launch = occupancy.DEEPSEEK.get(kernel.name.removeprefix("recompute."))
    if launch is None:
        return None
    got = stream(model, kernel)
    if isinstance(got, str) or got[0] <= 0:
        return None
    stream_gbps = kernel.bytes / got[0] / 1e9
    gbps = occupancy.rate_gbps(launch.effective, launch.blocks,
                               int(getattr(model.device, "sms", 0) or 0), stream_gbps)
    blocks = f", {launch.blocks} blocks" if launch.blocks else ""
    return kernel.bytes / (gbps * 1e9), (f"{launch.profiled} at {launch.occupancy:g} % "
                                         f"occupancy{blocks}, {launch.inflight:g} B in "
                                         f"flight per thread: {gbps:.4g} GB/s (stream "
                                         f"{stream_gbps:.4g}; gpu-benches gpu-stream)")


def wave_ratio(model: Any, kernel: Kernel, sms: int) -> float | None:
    """Under ``deepseek``: how much longer a kernel of :data:`occupancy.DEEPSEEK` whose
    grid and blocks per SM are known takes on ``sms`` of its device's SMs, wave by wave
    (:func:`occupancy.wave_ratio`); None for any other kernel or setting."""
    if getattr(model, "memory_kernels", "") != DEEPSEEK or kernel.kind != "memory":
        return None
    launch = occupancy.DEEPSEEK.get(kernel.name.removeprefix("recompute."))
    tables_for = getattr(model, "tables_for", None)
    if launch is None or launch.per_sm <= 0 or tables_for is None:
        return None
    stream = [t for t in tables_for(kernel) if t.kind == "memory"]
    if not stream:
        return None
    return occupancy.wave_ratio(launch, sms, int(getattr(model.device, "sms", 0) or 0),
                                stream[0].gbps)
