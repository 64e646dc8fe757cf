"""Liger-Kernel's published H100 rows, priced by moesim's kernel catalog with each row held
out.

    python benchmarks/liger_rows.py
    python benchmarks/liger_rows.py --write-docs     # docs/results/memory-kernels.md

The rows (linkedin/Liger-Kernel ``benchmark/data/all_benchmark_data.csv``, "NVIDIA H100
80GB HBM3"): RMSNorm bf16 4096 x 16384 forward (PyTorch, Megatron, Liger), SwiGLU
8192 x 32768 forward (PyTorch, Megatron's fused, Liger), cross-entropy 8192 x 131072
forward and forward + backward (Liger, Megatron's fused). Each is priced as
``moesim kernels`` prices it under ``compute.memory_kernels`` (eager = PyTorch,
fused = Megatron, liger = Liger): the kernel the inventory writes for that shape
(:func:`moesim.model.kernels.make.rmsnorm`, :func:`moesim.model.kernels.moe.activation`,
the LM head's ``loss``), priced by :class:`moesim.compute.catalog.CatalogModel` on an
H100, with the shipped tables less the checked size: the catalog holds the published
rows at that size, so the benchmark removes them (the forward's and, for forward +
backward, the backward's) and the price comes from the other sizes (held at the largest
remaining one, 8192 / 16384 / 65536). moesim's time leaves out its fixed cost per launch
(the rows time back-to-back launches with ``triton.testing.do_bench``). Goal: each within
15 %.
"""

from __future__ import annotations

import dataclasses
import sys

from moesim.compute.catalog import CatalogModel
from moesim.compute.devices import DEVICES
from moesim.compute.select import compute_model, shipped_catalog
from moesim.model.costs import memory_op
from moesim.model.kernels.make import ACT_BYTES, FP32_BYTES, rmsnorm
from moesim.model.kernels.moe import activation

GOAL = 0.15
#: (what, implementation, published ms (CSV y_value_50), kernels by phase)
ROWS = (
    ("RMSNorm 4096x16384 fwd", "eager", 0.1492, (("rmsnorm", 4096, 16384, "fwd"),)),
    ("RMSNorm 4096x16384 fwd", "fused", 0.1493, (("rmsnorm", 4096, 16384, "fwd"),)),
    ("RMSNorm 4096x16384 fwd", "liger", 0.0950, (("rmsnorm", 4096, 16384, "fwd"),)),
    ("SwiGLU 8192x32768 fwd", "eager", 1.4953, (("swiglu", 8192, 32768, "fwd"),)),
    ("SwiGLU 8192x32768 fwd", "fused", 0.8585, (("swiglu", 8192, 32768, "fwd"),)),
    ("SwiGLU 8192x32768 fwd", "liger", 0.5275, (("swiglu", 8192, 32768, "fwd"),)),
    ("cross-entropy 8192x131072 fwd", "liger", 2.9675, (("xent", 8192, 131072, "fwd"),)),
    ("cross-entropy 8192x131072 fwd+bwd", "liger", 7.9588,
     (("xent", 8192, 131072, "fwd"), ("xent", 8192, 131072, "bwd"))),
    ("cross-entropy 8192x131072 fwd", "fused", 11.8098, (("xent", 8192, 131072, "fwd"),)),
    ("cross-entropy 8192x131072 fwd+bwd", "fused", 18.2305,
     (("xent", 8192, 131072, "fwd"), ("xent", 8192, 131072, "bwd"))),
)


def kernel(op: str, rows: int, cols: int, phase: str):
    """The inventory's kernel for ``op`` at rows x cols in ``phase``."""
    if op == "rmsnorm":
        return rmsnorm(rows, cols, phase)
    if op == "swiglu":
        return activation("expert", rows, cols, True, phase)[0]
    # the LM head's loss (moesim.model.costs.lm_head_kernels): bf16 logits in, fp32 out
    return memory_op("loss", rows * cols * (ACT_BYTES + FP32_BYTES), 5.0 * rows * cols, phase)


def held_out(tables, ks) -> tuple:
    """The tables with the points of every kernel's size removed from the memory_op
    tables of its pass."""
    sizes = {(k.pass_, k.bytes) for k in ks}
    out = []
    for t in tables:
        if t.kind == "memory_op" and t.points:
            pts = tuple(p for p in t.points if not any(
                ps in t.passes and abs(p[0] - b) <= 1e-9 * b for ps, b in sizes))
            t = dataclasses.replace(t, points=pts) if pts else t
        out.append(t)
    return tuple(out)


def main() -> int:
    dev = DEVICES["H100"]
    base = compute_model({"precision": "bf16"}, "liger_rows", dev)
    print("Liger-Kernel rows (H100) against moesim's catalog, each size held out "
          "(priced from the other sizes' rows)")
    print(f"{'row':<36}{'impl':<7}{'published ms':>13}{'moesim ms':>11}{'error':>9}  priced by")
    worst = 0.0
    for what, impl, ms, spec in ROWS:
        ks = [kernel(*s) for s in spec]
        model = CatalogModel(base.roofline, held_out(shipped_catalog(), ks),
                             memory_kernels=impl)
        got, how = 0.0, []
        for k in ks:
            p = model.price(k)
            got += p.time_s - model.roofline.per_launch_s(k)
            how.append(p.detail)
        err = (got * 1e3 - ms) / ms
        worst = max(worst, abs(err))
        print(f"{what:<36}{impl:<7}{ms:>13.4f}{got * 1e3:>11.4f}{err:>+9.1%}  "
              + "; ".join(how))
    print(f"largest |error| {worst:.1%} (goal within {GOAL:.0%}): "
          f"{'PASS' if worst <= GOAL else 'MISS'}")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark  # this folder
    sys.exit(run_benchmark(main, "memory-kernels", "Liger-Kernel's rows against moesim's "
                           "memory-bound kernel tables"))
