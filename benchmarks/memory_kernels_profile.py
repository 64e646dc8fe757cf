"""DeepSeek's profiled F&B pair, memory-bound kernel classes by ``compute.memory_kernels``.

    python benchmarks/memory_kernels_profile.py PATH/train.json
    python benchmarks/memory_kernels_profile.py PATH/train.json --impls stream,fused --span
    python benchmarks/memory_kernels_profile.py PATH/train.json --span --write-docs
    python benchmarks/memory_kernels_profile.py PATH/train.json --impls deepseek --span \
        --set overlap.gemm_sms=left_by_ep

For each value of ``compute.memory_kernels`` (default: all of stream, eager, fused,
liger) prints the mean kernel time per layer by pass and class, measured against
simulated (:mod:`moesim.validation.gpu.classes`, on the SMs the pair leaves compute,
as ``benchmarks/deepseek_profile.py`` prints it), and with ``--span`` the pair's span and
compute-stream busy time (the exact engine, ~1 min each); then the classes kernel by
kernel, the profile's against moesim's, with what explains each
(``benchmarks/memory_kernels_per_kernel.py``; ``--no-kernels`` leaves it out).

``deepseek`` prices the kernels DeepSeek runs as its own at the rate their occupancy,
block count and bytes in flight per thread allow (gpu-benches' bandwidth by occupancy;
moesim.compute.occupancy), the rest as ``fused``, and here brings
``compute.fusion=residual_norm`` with it (:data:`WITH`: DeepSeek's norm is
flash-attention's layer_norm with the residual add in it; the profile launches no
residual-add kernel). Nothing in it is calibrated on this profile: the occupancies are
read from the profile's launch records, never its durations.

It also prints the calibration of the two classes no published rate covers (cast and
permute on H800), as the split written before fitting says
(docs/studies/memory-kernel-calibration.md): one rate per class from the F pass (the
inventory's bytes of the class in one layer's F / the profile's mean F time per layer,
scaled from the pair's SMs to the device's). Checked on the held-out B and W figures
those rates failed (the study says by how much), so no calibrated table is shipped and
these classes keep the streaming rate under every value.

Under every value but ``stream`` the inventory also lists the reference code's kernels
the base inventory leaves out (moesim.model.kernels.reference: the routing-map kernels,
the FP8 activation caches and their cast-backs, FP8 gradients to the experts), so the
columns compare both the rates and those kernels with ``stream``'s.

The trace (``train.json`` of github.com/deepseek-ai/profile-data) is not shipped: give
its path.
"""

from __future__ import annotations

import argparse
import sys

from moesim.compute.memory_kernels import op_of
from moesim.errors import InputError
from moesim.program.inventory import layer_ops
from moesim.scenario import load_scenario
from moesim.validation.gpu.classes import compare, pair_model, recompute_kernels
from moesim.validation.gpu.pair import measured_streams, simulate_pair
from moesim.validation.gpu.summary import summarize
from moesim.validation.gpu.trace import load_gpu_trace
from moesim.validation.gpu.validate import gpu_validate
from moesim.wiring import resolve

SCENARIO = "scenarios/deepseek-v3-fb-pair.yaml"
MEMORY_CLASSES = ("cast", "norm", "elementwise", "permute")
#: the split (docs/studies/memory-kernel-calibration.md): class -> kernel classes of the
#: inventory (kclass) whose F-pass bytes calibrate it
CALIBRATED = ("cast", "permute")


#: settings a value of compute.memory_kernels brings with it here: DeepSeek's norm is
#: flash-attention's layer_norm with the residual add in it (the profile launches no
#: residual-add kernel; csrc/layer_norm ``ln_fwd_cuda_kernel.cu`` ``has_residual``)
WITH = {"deepseek": ["compute.fusion=residual_norm"]}


#: --set overrides given on the command line, passed with every value's run
EXTRA: list[str] = []


def _resolve(path: str, impl: str):
    return resolve(load_scenario(path, [f"compute.memory_kernels={impl}",
                                        *WITH.get(impl, []), *EXTRA]))


def calibrate(tr, res) -> dict[str, float]:
    """{class: GB/s on the whole device} from the F pass: the inventory's bytes of the
    class's kernels in one layer (kclass, the class the inventory gives them) / the
    profile's mean F time of that class per layer × pair SMs / device SMs."""
    doc = compare(tr, res, res.compute)
    meas = {r["class"]: r["measured_s"] for r in doc["rows"] if r["pass"] == "F"}
    layer = next(i for i in range(res.model.layers) if res.model.is_moe_layer(i))
    nbytes = dict.fromkeys(CALIBRATED, 0.0)
    for o in layer_ops(res, layer, "fwd"):
        for k in o.kernels:
            if k.kind == "memory" and op_of(k) in nbytes:
                nbytes[op_of(k)] += k.bytes
    priced = pair_model(res, res.compute)
    share = getattr(priced, "sms", None)
    full = res.device.sms
    scale = (share / full) if share else 1.0
    return {c: nbytes[c] / (meas[c] * scale) / 1e9 for c in CALIBRATED if meas.get(c)}


def class_rows(tr, res) -> list[tuple[str, str, float, float]]:
    priced = pair_model(res, res.compute)
    doc = compare(tr, res, priced)
    return [(r["pass"], r["class"], r["measured_s"], r["simulated_s"]) for r in doc["rows"]
            if r["class"] in (*MEMORY_CLASSES, "all compute")]


def span(tr, g, res) -> tuple[float, float, float, float]:
    scn = res.scenario
    tokens = scn.schedule.micro_batch_size * scn.schedule.seq_len
    rank = g["rank"] if g["rank"] is not None else 0
    sim = simulate_pair(res, res.compute, rank)
    doc = gpu_validate(g, res.model, pair_model(res, res.compute), tokens,
                       scn.schedule.seq_len, scn.parallel.ep, sim=sim,
                       streams=measured_streams(tr), recompute=recompute_kernels(res))
    m, s = doc["measured"], doc["simulated"]
    return (m["span_s"], s["span_s"], m["stream_busy_s"]["compute"],
            s["stream_busy_s"]["compute"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="DeepSeek's train.json (github.com/deepseek-ai/profile-data)")
    ap.add_argument("--scenario", default=SCENARIO, help="default: %(default)s")
    ap.add_argument("--impls", default="stream,eager,fused,liger,deepseek",
                    help="values of compute.memory_kernels, comma-separated")
    ap.add_argument("--span", action="store_true", help="also the pair's span (exact engine)")
    ap.add_argument("--no-kernels", action="store_true",
                    help="leave out the classes kernel by kernel (profile against moesim)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a scenario override for every value's run (repeatable)")
    args = ap.parse_args(argv)
    EXTRA[:] = args.set
    if args.set:
        print("with " + " ".join(f"--set {s}" for s in args.set))
    try:
        tr = load_gpu_trace(args.path)
        impls = args.impls.split(",")
        base = _resolve(args.scenario, "stream")
        cal = calibrate(tr, base)
        print("calibration of the split (F pass only; not shipped: "
              "docs/studies/memory-kernel-calibration.md): "
              + ", ".join(f"{c} {v:.0f} GB/s" for c, v in cal.items()))
        resolved = {impl: _resolve(args.scenario, impl) for impl in impls}
        table = {impl: class_rows(tr, res) for impl, res in resolved.items()}
        g = summarize(tr) if args.span else None
        spans = {impl: span(tr, g, _resolve(args.scenario, impl)) for impl in impls} \
            if args.span else {}
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\nmean kernel time per layer by pass and class, ms (error = (simulated - "
          "measured) / measured):")
    head = f"{'pass':<5}{'class':<13}{'measured':>10}" + "".join(
        f"{i:>10}{'error':>9}" for i in impls)
    print(head)
    first = table[impls[0]]
    for n, (p, c, meas, _) in enumerate(first):
        cells = ""
        for impl in impls:
            s = table[impl][n][3]
            cells += f"{s * 1e3:>10.3f}{(s - meas) / meas:>+9.1%}" if meas > 0 else \
                f"{s * 1e3:>10.3f}{'-':>9}"
        print(f"{p:<5}{c:<13}{meas * 1e3:>10.3f}{cells}")
    within = {impl: sum(1 for (p, c, meas, sim) in table[impl]
                        if c != "all compute" and meas > 0 and abs(sim - meas) <= 0.25 * meas)
              for impl in impls}
    classes = sum(1 for r in first if r[1] != "all compute" and r[2] > 0)
    print("classes within 25 %: " + ", ".join(f"{i} {n} of {classes}"
                                               for i, n in within.items()))
    for impl in impls:
        if WITH.get(impl):
            print(f"{impl} runs with {' '.join(WITH[impl])}")
    for impl, (ms, ss, mb, sb) in spans.items():
        print(f"{impl}: span {ss * 1e3:.3f} ms vs {ms * 1e3:.3f} ms measured "
              f"({(ss - ms) / ms:+.1%}); compute streams busy {sb * 1e3:.3f} vs "
              f"{mb * 1e3:.3f} ms ({(sb - mb) / mb:+.1%})")
    if not args.no_kernels:
        from memory_kernels_per_kernel import print_listing  # this folder
        print_listing(tr, args.path, resolved)
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark  # this folder
    raise SystemExit(run_benchmark(main, "memory-kernels-profile",
                                   "DeepSeek's profile: memory-bound kernel classes by "
                                   "compute.memory_kernels"))
