"""DualPipe's lone chunks of DeepSeek-V3 on 2048 GPUs, phase by phase, against DeepSeek's
profile (issue 38): used by ``deepseek_settings.py --profile``.

A lone chunk is a forward, or a backward (B + W), of one stage's 4 MoE layers that runs
without the other micro-batch of an F&B pair beside it (DualPipe's warm-up and cool-down,
deepseek-ai/DualPipe ``dualpipe/dualpipe.py`` steps 1-3 and 5-8). In moesim's trace (the
fast engine's ``trace.json``) its dispatch and combine run on the compute stream, where a
pair's run on the ``ep`` stream; each chunk's weight-gradient ops are its own wherever
zero-bubble scheduling moved them.

DeepSeek's profile (github.com/deepseek-ai/profile-data ``train.json``) holds one F&B pair
and no lone chunk: a lone chunk there is composed from the kernels launched under each
phase annotation of the pair, all 4 layers summed, the DeepEP kernels split into the data
kernel (``dispatch`` / ``combine``), the count exchange and barrier (``notify_dispatch``,
``cached_notify``) and the layout kernel, as ``moesim.validation.gpu.summary`` counts them.
"""

from __future__ import annotations

import json

#: moesim's ops -> the profile's phase annotation they run under (DeepSeek's ``attn(F)``
#: holds the router; ``mlp(B)`` the experts' recompute and the unpermute's backward;
#: ``attn(B)`` the recomputed norms and MLA up-projections)
PHASE_OF = {
    "fwd.attn": "attn(F)", "fwd.router": "attn(F)", "fwd.dispatch": "dispatch(F)",
    "fwd.experts": "mlp(F)", "fwd.unpermute": "mlp(F)", "fwd.combine": "combine(F)",
    "bwd.combine": "combine(B)", "bwd.unpermute": "mlp(B)", "bwd.recompute_experts": "mlp(B)",
    "bwd.experts": "mlp(B)", "bwd.dispatch": "dispatch(B)", "bwd.recompute": "attn(B)",
    "bwd.router": "attn(B)", "bwd.attn": "attn(B)", "bwd.w_mlp": "mlp(W)",
    "bwd.w_experts": "mlp(W)", "bwd.w_attn": "attn(W)",
}
F_PHASES = ("attn(F)", "dispatch(F)", "mlp(F)", "combine(F)")
BW_PHASES = ("combine(B)", "mlp(B)", "dispatch(B)", "attn(B)", "mlp(W)", "attn(W)")
EP_CATS = ("ep_dispatch", "ep_combine")


def sim_lone(trace_path: str, stage: int, gpus_per_stage: int) -> dict:
    """Mean lone forward and lone backward (B + W) chunk of the first traced GPU of
    pipeline rank ``stage``: per phase, seconds of compute, of DeepEP kernel and of
    waiting for the EP group (``stall`` before a dispatch or combine)."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    ranks = sorted({e["args"]["rank"] for e in events if e.get("ph") == "X"
                    and e.get("args", {}).get("rank", -1) // gpus_per_stage == stage})
    rank = ranks[0]
    mine = [e for e in events if e.get("ph") == "X" and e["args"].get("rank") == rank
            and e["args"].get("op") in PHASE_OF]
    layers = sorted({e["args"]["layer"] for e in mine})
    first = set(layers[: len(layers) // 2])       # the rank's two stages' layers
    chunks: dict[tuple, list] = {}
    for e in mine:
        a = e["args"]
        chunks.setdefault((a["microbatch"], a["phase"], a["layer"] in first), []).append(e)
    out = {"rank": rank, "F": {}, "BW": {}, "n": {"F": 0, "BW": 0}}
    for (_mb, phase, _st), es in chunks.items():
        lone = any(e["cat"] in EP_CATS and e["args"].get("stream") == "compute" for e in es)
        if not lone:
            continue
        which = "F" if phase == "fwd" else "BW"
        out["n"][which] += 1
        for e in es:
            ph = PHASE_OF[e["args"]["op"]]
            kind = ("kernel" if e["cat"] in EP_CATS else "wait" if e["cat"] == "stall"
                    else "compute")
            slot = out[which].setdefault(ph, {"compute": 0.0, "kernel": 0.0, "wait": 0.0})
            slot[kind] += e["dur"] * 1e-6
    for which in ("F", "BW"):
        n = max(out["n"][which], 1)
        for slot in out[which].values():
            for k in slot:
                slot[k] /= n
    return out


def profile_lone(g: dict) -> dict:
    """Per phase annotation of the profile's pair (``summarize`` output ``g``), all layers
    summed: GPU busy time, and of it the DeepEP data kernels, the notify kernels (count
    exchange and barrier) with the layout kernel, and everything else (seconds)."""
    out: dict[str, dict] = {}
    for row in g["phases"]:
        comm = row.get("comm", {})
        slot = out.setdefault(row["phase"], {"busy": 0.0, "kernel": 0.0, "notify": 0.0})
        slot["busy"] += row["gpu_busy_s"]
        slot["kernel"] += comm.get("dispatch", 0.0) + comm.get("combine", 0.0)
        slot["notify"] += comm.get("notify", 0.0) + comm.get("layout", 0.0)
    return out


def print_table(sim: dict, prof: dict) -> None:
    """The lone chunks phase by phase, profile against moesim (ms per chunk)."""
    print(f"\nLone chunks phase by phase (ms per chunk of 4 MoE layers): moesim's mean over "
          f"pipeline rank 7's lone chunks (GPU {sim['rank']}: {sim['n']['F']} forward, "
          f"{sim['n']['BW']} backward), against the profile's kernels under each phase of its "
          "pair (busy time; DeepEP's data kernel and its notify/layout kernels apart):\n")
    print("| chunk | phase | profile: busy | profile: DeepEP data kernel | profile: notify + "
          "layout | moesim: total | moesim: compute | moesim: DeepEP kernel | moesim: wait "
          "for the EP group | difference |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for which, phases in (("F", F_PHASES), ("B + W", BW_PHASES)):
        tot_p = tot_s = 0.0
        for ph in phases:
            p = prof.get(ph, {"busy": 0.0, "kernel": 0.0, "notify": 0.0})
            s = sim["F" if which == "F" else "BW"].get(ph, {"compute": 0.0, "kernel": 0.0,
                                                           "wait": 0.0})
            t = s["compute"] + s["kernel"] + s["wait"]
            tot_p, tot_s = tot_p + p["busy"], tot_s + t
            diff = f"{t / p['busy'] - 1:+.1%}" if p["busy"] else "-"
            print(f"| {which} | {ph} | {p['busy'] * 1e3:.1f} | {p['kernel'] * 1e3:.1f} | "
                  f"{p['notify'] * 1e3:.1f} | {t * 1e3:.1f} | {s['compute'] * 1e3:.1f} | "
                  f"{s['kernel'] * 1e3:.1f} | {s['wait'] * 1e3:.1f} | {diff} |")
        print(f"| {which} | all | {tot_p * 1e3:.1f} | | | {tot_s * 1e3:.1f} | | | | "
              f"{tot_s / tot_p - 1:+.1%} |")


#: DeepEP's published normal kernels at EP64 on H800 (deepseek-ai/DeepEP docs/legacy.md,
#: formerly the README, "Normal kernels with NVLink and RDMA forwarding": 4096 tokens,
#: hidden 7168, top-8 of 256 in 4 groups, FP8 dispatch, BF16 combine): RDMA GB/s as its
#: tests count them (bytes a rank sends over RDMA, its own node's share included)
PUBLISHED_GBPS = {"ep_dispatch": 51.0, "ep_combine": 50.0}
LAYERS = 4   # MoE layers in one of the profile's chunks (profile-data README)
#: the chunk's DeepEP calls: (phase, chunk, DeepEP op, dtype in the shipped scenario)
CALLS = (("dispatch(F)", "F", "ep_dispatch", "fp8"), ("combine(F)", "F", "ep_combine", "bf16"),
         ("combine(B)", "BW", "ep_dispatch", "fp8"), ("dispatch(B)", "BW", "ep_combine", "bf16"))


def alone() -> dict:
    """One DeepEP call at the scenario's shape alone on EP64 (8 dgx-h800 nodes, 20 SMs,
    uniform routing on at most 4 nodes): moesim's time and DeepEP's published rate at
    moesim's RDMA bytes per rank (:func:`moesim.ep.simulate_ep`), seconds."""
    from moesim.ep.simulate import simulate_ep
    from moesim.gating.section import routing_from_dict
    from moesim.topology import load_topology
    topo = load_topology("dgx-h800", nodes=8)
    cfg = routing_from_dict({"max_nodes": 4}, "deepseek_lone")
    out = {}
    for op, dtype in (("ep_dispatch", "fp8"), ("ep_combine", "bf16")):
        r = simulate_ep(topo, op, "deepep", tokens=4096, hidden=7168, experts=256, top_k=8,
                        dtype=dtype, routing=cfg, sms=20)
        out[op] = {"moesim": r["total_s"],
                   "published": r["rdma_bytes_per_rank"] / (PUBLISHED_GBPS[op] * 1e9)}
    return out


def kernel_table(sim: dict, prof: dict, ref: dict) -> None:
    """Each DeepEP call of a chunk (ms per layer): alone at DeepEP's published rate and in
    moesim (``ref``, :func:`alone`), in moesim's lone chunks, and inside the profile's
    pair (data kernel, notify)."""
    print(f"\nDeepEP's calls one by one (ms per MoE layer): alone, at DeepEP's published EP64 "
          f"rate ({PUBLISHED_GBPS['ep_dispatch']:.0f} GB/s dispatch, "
          f"{PUBLISHED_GBPS['ep_combine']:.0f} GB/s combine, RDMA, docs/legacy.md) over the RDMA "
          "bytes moesim plans, and moesim's collective on 20 SMs; in moesim's lone chunks; "
          "inside the profile's pair:\n")
    print("| phase | DeepEP op, dtype | alone: DeepEP published | alone: moesim | lone chunk: "
          "moesim kernel | lone chunk: moesim wait | pair, profile: data kernel | pair, profile: "
          "notify + layout | profile data kernel / published |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ph, which, op, dtype in CALLS:
        s = sim[which].get(ph, {"kernel": 0.0, "wait": 0.0})
        p = prof.get(ph, {"kernel": 0.0, "notify": 0.0})
        pub = ref[op]["published"]
        print(f"| {ph} | {op}, {dtype} | {pub * 1e3:.2f} | {ref[op]['moesim'] * 1e3:.2f} | "
              f"{s['kernel'] / LAYERS * 1e3:.2f} | {s['wait'] / LAYERS * 1e3:.2f} | "
              f"{p['kernel'] / LAYERS * 1e3:.2f} | {p['notify'] / LAYERS * 1e3:.2f} | "
              f"{p['kernel'] / LAYERS / pub:.2f}x |")


def lone_at_published(prof: dict, ref: dict) -> tuple[float, float]:
    """A lone forward and a lone backward (B + W) chunk composed from the profile with its
    DeepEP calls (data kernel, notify and layout) replaced by DeepEP's published rate
    alone: the profile's other kernels under each phase kept (seconds)."""
    out = []
    for phases in (F_PHASES, BW_PHASES):
        t = 0.0
        for ph in phases:
            p = prof.get(ph, {"busy": 0.0, "kernel": 0.0, "notify": 0.0})
            t += p["busy"] - p["kernel"] - p["notify"]
        t += sum(LAYERS * ref[op]["published"] for ph, _w, op, _d in CALLS if ph in phases)
        out.append(t)
    return out[0], out[1]
