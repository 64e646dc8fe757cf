"""Fusion as a what-if: DeepSeek-V3 and Mixtral with and without ``compute.fusion``.

    python benchmarks/fusion_whatif.py
    python benchmarks/fusion_whatif.py --write-docs      # docs/results/fusion.md
    python benchmarks/fusion_whatif.py --only mixtral-8x7b-ep8

For each scenario: what fusing every pair of ``compute.fusion``
(:mod:`moesim.model.kernels.fusion`) saves per MoE layer and in the LM head, per pass
(HBM bytes and launches, as ``moesim kernels --fusion`` counts them, one micro-batch on
one rank), then the fast engine's step with and without it, under
``compute.memory_kernels`` ``stream`` (the default) and ``fused`` (Megatron-Core / TE
kernels' published rates). DeepSeek-V3's run takes about 80 s of CPU each (four runs).
"""

from __future__ import annotations

import argparse
import sys

from moesim.cli.kernels_cmd import inventory, side_by_side
from moesim.compute.memory_kernels import FUSIONS
from moesim.program import recipe
from moesim.program.inventory import PASSES
from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate

SCENARIOS = ("deepseek-v3-2048", "mixtral-8x7b-ep8")
ALL = "compute.fusion=" + ",".join(FUSIONS)
NONE = "compute.fusion=[]"


def _res(name: str, *sets: str):
    return resolve(load_scenario(name, list(sets)))


def layer_table(name: str, mem: str) -> list[str]:
    """Per pass of the first MoE layer and the LM head: bytes and launches saved."""
    plain, fused = _res(name, NONE, f"compute.memory_kernels={mem}"), \
        _res(name, ALL, f"compute.memory_kernels={mem}")
    spec = plain.model
    layer = next((i for i in range(spec.layers) if spec.is_moe_layer(i)), 0)
    ops = side_by_side(inventory(plain, layer, PASSES)["kernels"],
                       inventory(fused, layer, PASSES)["kernels"])
    out = [f"### MoE layer {layer} ({spec.precision} GEMMs), memory kernels `{mem}`, one "
           "micro-batch on one rank", "",
           "| pass | op | MB saved | launches saved | unfused µs | fused µs | change |",
           "|---|---|---|---|---|---|---|"]
    for r in ops:
        if not (r["bytes_saved"] or r["launches_saved"]) and r["op"] != "memory-bound":
            continue
        ch = r["fused_s"] / r["unfused_s"] - 1 if r["unfused_s"] else 0.0
        out.append(f"| {r['pass']} | {r['op']} | {r['bytes_saved'] / 1e6:.2f} | "
                   f"{r['launches_saved']} | {r['unfused_s'] * 1e6:.1f} | "
                   f"{r['fused_s'] * 1e6:.1f} | {ch:+.1%} |")
    sch = plain.scenario.schedule
    tokens = sch.micro_batch_size * sch.seq_len // max(plain.layout.cp, 1)
    tp = plain.scenario.parallel.tp
    for phase in ("fwd", "bwd"):
        a = recipe.lm_head(plain.model, tokens, tp, phase)
        b = recipe.lm_head(fused.model, tokens, tp, phase)
        ta = sum(plain.compute.time_s(k) for k in a)
        tb = sum(fused.compute.time_s(k) for k in b)
        out.append(f"| {phase} | {phase}.lm_head | "
                   f"{(sum(k.bytes for k in a) - sum(k.bytes for k in b)) / 1e6:.2f} | "
                   f"{sum(k.count for k in a) - sum(k.count for k in b)} | {ta * 1e6:.1f} | "
                   f"{tb * 1e6:.1f} | {tb / ta - 1:+.1%} |")
    return out


def step_table(name: str) -> list[str]:
    out = ["", f"### {name}, fast engine, the step", "",
           "| memory kernels | fusion | step s | compute s (mean rank) | change of the step |",
           "|---|---|---|---|---|"]
    for mem in ("stream", "fused"):
        base = None
        for fus, sets in (("none", NONE), ("all", ALL)):
            s = simulate(name, [sets, f"compute.memory_kernels={mem}"],
                         engine="fast").summary
            step = s["step_time_s"]
            base = step if base is None else base
            out.append(f"| `{mem}` | {fus} | {step:.4f} | {s['breakdown_s']['compute']:.4f} | "
                       f"{step / base - 1:+.2%} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    args = ap.parse_args(argv)
    print(f"# Fusions: all of {', '.join(FUSIONS)} (docs/kernels.md, Fusion as a what-if)")
    for name in args.only:
        print(f"\n## {name}\n")
        for mem in ("stream", "fused"):
            print("\n".join(layer_table(name, mem)))
            print()
        print("\n".join(step_table(name)))
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "fusion", "Fusion as a what-if: DeepSeek-V3 and Mixtral"))
