"""DeepSeek's profiled F&B pair, kernel by kernel, in the memory-bound classes
(used by ``benchmarks/memory_kernels_profile.py --kernels``).

For each pass and class (cast, norm, elementwise, permute): the profile's kernels (mean
per layer: launches, µs per launch and per layer, grid × block, the profile's
achieved occupancy, the share of their time beside a DeepEP kernel), then moesim's
kernels of that class in one layer (MB per launch, µs under each value of
``compute.memory_kernels``), then which mechanism the numbers point to (:data:`NOTES`).
Kernels under 10 µs per layer are summed in one row.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

from moesim.program.inventory import layer_ops
from moesim.validation.gpu.classes import (
    _PHASE_RE,
    PASS_OF,
    measured_class,
    pair_model,
    simulated_class,
)
from moesim.validation.gpu.summary import union

CLASSES = ("cast", "norm", "elementwise", "permute")
SMALL_US = 10.0
#: profile kernel (short name, regex) -> what explains its time against moesim's kernel;
#: each from the per-kernel numbers this listing prints (docs/kernels.md, "DeepSeek's
#: kernels")
NOTES = (
    (r"ln_bwd_kernel", "flash-attention ln_bwd, grid 132 (1 CTA/SM): ~98 us alone, ~182 "
     "beside DeepEP (2 waves on the 112 SMs left); deepseek counts the waves (sm_share)"),
    (r"ln_fwd_kernel", "flash-attention ln_fwd with the residual (no add kernel in the "
     "profile), 112 B in flight/thread: bandwidth-bound; ~105 us alone, ~125 beside DeepEP"),
    (r"gatherTopK", "torch.topk (sbtopk), one block of 256 per token, 5 per SM: 7 waves "
     "of 16 radix passes (2 bits of a float each), each ending in barriers; latency, not "
     "bytes: moesim prices its bytes (6 us), no published time per pass"),
    (r"get_fused_mapping|clean_and_count", "4 blocks of 512, 8 B in flight: 42 GB/s; "
     "deepseek reads the received tokens' top-k int64 (TileKernels' get_fused_mapping "
     "cut at its grid sync); the mapping's block scans not priced"),
    (r"swiglu_forward_backward", "4 experts in one launch, 2.0 TB/s on 112 SMs; "
     "Megatron's fused rows 0.5 TB/s (fused: 4 x 332 us)"),
    (r"swiglu_weight_backward", "the routing weights' gradient: expert_act_weight_bwd "
     "under deepseek (FP8 input + BF16 gradient read)"),
    (r"batched_transpose", "FP8 weight transposes; F: the 4 experts' (7168 tiles of "
     "128x128), moved to F under deepseek; B: attention's 5, shared expert's 2"),
    (r"utils::transpose", "the FP8 scales transposed after a per-token cast: "
     "scale_transpose under deepseek"),
    (r"_copy_tensor_kernel", "Triton, 1 program of 128 per token, 31 %: moesim's 336 MB "
     "would need 3.3 TB/s; what it copies is not public: not changed"),
    (r"rotary_kernel", "q (grid x heads) and k launches; deepseek: 2 launches of 135 MB"),
    (r"reduce_fused", "unpermute (F) / permute_bwd (B): one block per received token "
     "(TileKernels' reduce_fused), 112 B in flight: stream-bound; deepseek: a rows in, "
     "received (<= a) out, before the combine"),
    (r"expand_to_fused", "permute (F) / the FP8 gradient dispatch (B): 100 %"),
    (r"cast_back", "42 % occupancy (112 or 896 blocks)"),
)


def short(name: str) -> str:
    s = re.sub(r"^void ", "", name)
    s = re.sub(r"(at::native::|cuda::|dpsk::grouped_gemm::cuda::utils::|layer_norm::"
               r"|\(anonymous namespace\)::)", "", s)
    return s[:46]


def note(name: str) -> str:
    return next((n for pat, n in NOTES if re.search(pat, name)), "")


def occupancies(tr, path: str) -> dict[int, float]:
    """{id of a traced kernel: est. achieved occupancy %} from the raw trace, the i-th
    launch of a name in time order matched with the i-th kernel of that name."""
    with open(path) as f:
        doc = json.load(f)
    raw: dict[str, list] = defaultdict(list)
    for e in sorted((e for e in doc.get("traceEvents", [])
                     if isinstance(e, dict) and e.get("cat") == "kernel"),
                    key=lambda e: float(e["ts"])):
        raw[e["name"]].append((e.get("args") or {}).get("est. achieved occupancy %"))
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for k in tr.kernels:
        i = seen[k.name]
        seen[k.name] += 1
        if i < len(raw.get(k.name, ())) and raw[k.name][i] is not None:
            out[id(k)] = float(raw[k.name][i])
    return out


def measured_kernels(tr, path: str) -> dict:
    """{(pass, class): [(short, launches/layer, µs/launch, µs/layer, blocks, occ %,
    beside-DeepEP share, name)]}"""
    occ = occupancies(tr, path)
    comm = union([(k.start_s, k.start_s + k.dur_s) for k in tr.kernels if k.cls == "comm"])
    layers: dict[str, set] = defaultdict(set)
    by: dict = defaultdict(list)
    for k in tr.kernels:
        m = _PHASE_RE.fullmatch(k.phase.name) if k.phase is not None else None
        if not m:
            continue
        c = measured_class(k.name, k.cls)
        layers[m.group(2)].add(k.phase.index)
        if c in CLASSES:
            by[(m.group(2), c, k.name)].append(k)
    out: dict = defaultdict(list)
    for (p, c, name), ks in by.items():
        n = max(len(layers[p]), 1)
        dur = sum(k.dur_s for k in ks)
        beside = sum(_overlap(k, comm) for k in ks)
        oc = [occ.get(id(k)) for k in ks]
        oc = [o for o in oc if o is not None]
        out[(p, c)].append((short(name), len(ks) / n, dur / len(ks) * 1e6, dur / n * 1e6,
                            max(k.blocks for k in ks), max(oc) if oc else None,
                            beside / dur if dur else 0.0, name))
    for v in out.values():
        v.sort(key=lambda r: -r[3])
    return out


def _overlap(k, comm: list) -> float:
    s, e = k.start_s, k.start_s + k.dur_s
    return sum(max(0.0, min(e, b) - max(s, a)) for a, b in comm)


def simulated_kernels(res_by_impl: dict) -> dict:
    """{(pass, class): {name: (launches, MB, {impl: µs})}} of one MoE layer."""
    out: dict = defaultdict(dict)
    for impl, res in res_by_impl.items():
        model = pair_model(res, res.compute)
        layer = next(i for i in range(res.model.layers) if res.model.is_moe_layer(i))
        for p, pname in PASS_OF.items():
            for o in layer_ops(res, layer, pname):
                for k in o.kernels:
                    c = simulated_class(k)
                    if c not in CLASSES:
                        continue
                    # launches and bytes as the first value listing the kernel has them
                    row = out[(p, c)].setdefault(k.name, [0, 0.0, {}, impl])
                    if impl == row[3]:
                        row[0] += max(k.count, 1)
                        row[1] += k.bytes / 1e6
                    row[2][impl] = row[2].get(impl, 0.0) + model.time_s(k) * 1e6
    return out


def print_listing(tr, path: str, res_by_impl: dict) -> None:
    meas = measured_kernels(tr, path)
    sim = simulated_kernels(res_by_impl)
    impls = list(res_by_impl)
    print("\nper kernel, mean per layer (profile: DeepSeek's train.json; 'EP' = share of "
          "the time beside a DeepEP kernel; occ = the profile's est. achieved occupancy; "
          "moesim's launches and MB as the first value listing the kernel has them):")
    for p in PASS_OF:
        for c in CLASSES:
            rows, simrows = meas.get((p, c), []), sim.get((p, c), {})
            if not rows and not simrows:
                continue
            total = sum(r[3] for r in rows)
            print(f"\n{p} {c}: profile {total:.1f} us per layer")
            small = [r for r in rows if r[3] < SMALL_US]
            for s, n, per, lay, blocks, oc, ep, name in rows:
                if lay < SMALL_US:
                    continue
                occ = f"{oc:.0f}%" if oc is not None else "-"
                print(f"  profile {s:<46} {n:4.1f}x {per:7.1f} us = {lay:7.1f} us  "
                      f"blocks {blocks:>6} occ {occ:>4} EP {ep:4.0%}  {note(name)}")
            if small:
                print(f"  profile {len(small)} kernels under {SMALL_US:g} us per layer"
                      f"{'':<12} = {sum(r[3] for r in small):7.1f} us")
            for name, (n, mb, us, _) in sorted(simrows.items(), key=lambda kv: -max(
                    kv[1][2].values())):
                cells = "  ".join(f"{i} {us.get(i, 0.0):7.1f}" for i in impls)
                print(f"  moesim  {name:<46} {n:4d}x {mb:8.1f} MB in all  {cells}")
            sums = "  ".join(f"{i} {sum(v[2].get(i, 0.0) for v in simrows.values()):7.1f}"
                             for i in impls)
            print(f"  moesim  total{'':<57}{sums}")
