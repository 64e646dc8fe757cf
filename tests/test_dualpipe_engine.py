"""DualPipe / DualPipeV and Megatron's a2a-overlapped 1F1B in the exact engine.

A toy scenario (the toy model with every layer dense, one GPU per stage, no data or
expert parallelism, PCIe links so fast and latency-free that a pipeline message takes
~1e-12 s, no launch overhead) isolates the schedule: every micro-batch runs F, B and W
once per stage on the rank the order names; DualPipe, 1F1B and GPipe do the same compute;
and the step equals the stage-time evaluator's (moesim.schedule.evaluate) given the
F, B and W durations the engine used, up to the embedding and LM head, which only the
first and last stages run (a fixed-order schedule's makespan grows by at most the time
added, so the evaluator's step <= the engine's <= it + that time).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from moesim.compute.base import Kernel
from moesim.compute.devices import get_device
from moesim.compute.roofline import RooflineModel
from moesim.errors import InputError
from moesim.memory.model import memory_per_rank
from moesim.memory.report import StageMemory
from moesim.model import costs
from moesim.model.presets import DEEPSEEK_V3, MIXTRAL_8X7B, TOY
from moesim.schedule.dualpipe import make_dual_order
from moesim.schedule.evaluate import Durations, evaluate
from moesim.wiring import resolve_path, simulate

TOY_YAML = """\
name: dualpipe-toy
seed: 0
cluster:
  topology: pcie-8gpu
  params: {{gpus_per_node: {gpus}, pcie_switches_per_cpu: 1, cpus: 1,
           pcie_GBps: {gbps}, pcie_latency_us: 0.0}}
  device: H100
  network: analytical
model: {{preset: toy, layers: {layers}, first_dense_layers: {dense}, vocab: 8}}
routing: {{kind: uniform}}
parallel: {{tp: 1, pp: {pp}, ep: {ep}}}
schedule: {{kind: {kind}, microbatches: {m}, micro_batch_size: 1, seq_len: 256}}
compute: {{kind: roofline, launch_overhead_us: 0}}
overlap: {{dp_overlap: true, kind: {overlap}}}
"""


def _scenario(tmp_path: Path, kind: str, pp: int, m: int, stages: int | None = None,
              gpus: int | None = None, dense: bool = True, ep: int = 1,
              overlap: str = "none") -> Path:
    stages = stages or pp
    layers = 2 * stages
    p = tmp_path / f"{kind}-{pp}-{m}-{ep}-{overlap}.yaml"
    p.write_text(TOY_YAML.format(gpus=gpus or pp, gbps=1e9, layers=layers,
                                 dense=layers if dense else 0, pp=pp, ep=ep, kind=kind, m=m,
                                 overlap=overlap))
    return p


def _run(path: Path, *over: str):
    return simulate(path, list(over), record_series=False)


def _pipeline_end(r) -> float:
    return max(s.end_s for s in r.spans if s.kind == "compute" and s.phase != "opt")


# ---------------------------------------------------------------- B/W split (pure)

def test_split_backward_by_hand():
    # X(4, 2)·W(2, 3): forward 2·4·3·2 = 48 FLOP; the backward is dX (48 FLOP, one
    # launch, B) and dW (48 FLOP, one launch, W, accumulated into the FP32 main gradient)
    bwd = costs.gemm("dense_gemm", 4, 3, 2, "bwd")
    b, w = costs.split_backward(bwd)
    assert [x.name for x in b] == ["dense_gemm_dgrad"] and [x.name for x in w] == \
        ["dense_gemm_wgrad"]
    assert b[0].flops == w[0].flops == 48.0 and b[0].count == w[0].count == 1
    assert b[0].bytes == 2 * (4 * 3 + 3 * 2 + 4 * 2)           # read dY, W; write dX
    assert w[0].bytes == 2 * (2 * 4 + 4 * 3) + 8 * 2 * 3       # read X, dY; FP32 dW r+w
    # core attention and elementwise ops have no weights: all B
    att = Kernel("attention_bwd", 10.0, 4.0, m=4, pass_="dgrad")
    norm = costs.memory_op("norm", 8.0, 2.0, "bwd", count=4)
    assert costs.split_backward([att, norm]) == ([att, norm], [])
    with pytest.raises(ValueError):
        costs.split_backward([costs.gemm("dense_gemm", 4, 3, 2, "fwd")])


@pytest.mark.parametrize("spec", [TOY, MIXTRAL_8X7B, DEEPSEEK_V3], ids=lambda s: s.name)
def test_b_plus_w_is_the_full_backward(spec):
    t, tp = 512, 2 if spec.heads % 2 == 0 else 1
    kinds = {
        "attention": [*costs.norm_kernels(spec, t, tp, "bwd"),
                      *costs.attention_kernels(spec, t, 4096, tp, "bwd")],
        "router": costs.router_kernels(spec, t, "bwd"),
        "expert": costs.expert_kernels(spec, 77, "bwd"),
        "shared": costs.shared_expert_kernels(spec, t, tp, "bwd"),
        "dense": costs.dense_ffn_kernels(spec, t, tp, "bwd"),
        "permute": [*costs.permute_kernels(spec, t, "bwd"),
                    *costs.unpermute_kernels(spec, t, "bwd")],
        "embedding": costs.embedding_kernels(spec, t, tp, "bwd"),
        "lm_head": costs.lm_head_kernels(spec, t, tp, "bwd"),
    }
    model = RooflineModel(get_device("H100"))
    for name, ks in kinds.items():
        b, w = costs.split_backward(ks)
        for attr in ("flops", "bytes", "count"):
            assert sum(getattr(k, attr) for k in b + w) == sum(getattr(k, attr) for k in ks), \
                (name, attr)
        assert sum(map(model.time_s, b + w)) == pytest.approx(sum(map(model.time_s, ks)),
                                                              rel=1e-12)
        # W is exactly the weight GEMMs' wgrad, as many FLOPs as their dgrad
        dg = [k for k in ks if k.pass_ == "dgrad" and k.n and k.k]
        assert sum(k.flops for k in w) == sum(k.flops for k in dg)
        assert all(k.pass_ == "wgrad" for k in w) and all(k.pass_ == "dgrad" for k in b)
    assert costs.backward_part(kinds["dense"], "W") == costs.split_backward(kinds["dense"])[1]


# ---------------------------------------------------------------- the order, executed

def test_every_microbatch_runs_f_b_w_once_per_stage(tmp_path):
    P, N = 4, 8
    r = _run(_scenario(tmp_path, "dualpipe", P, N))
    o = make_dual_order("dualpipe", P, N)
    got = Counter((s.name, s.microbatch, s.layer, s.rank) for s in r.spans
                  if s.kind == "compute" and s.layer >= 0)
    want = Counter()
    for mb in range(N):
        for stage in range(P):
            rank = o.rank(mb, stage)          # one GPU per stage: pipeline rank = rank
            for layer in (2 * stage, 2 * stage + 1):
                for name in ("fwd.attn", "fwd.ffn", "bwd.ffn", "bwd.attn", "bwd.w_mlp",
                             "bwd.w_attn"):
                    want[(name, mb, layer, rank)] += 1
    assert got == want
    # embedding and LM head once per micro-batch, on the rank its direction starts/ends
    for name, stage in (("fwd.embedding", 0), ("fwd.lm_head", P - 1), ("bwd.lm_head", P - 1),
                        ("bwd.w_lm_head", P - 1)):
        ranks = sorted((s.microbatch, s.rank) for s in r.spans if s.name == name)
        assert ranks == [(mb, o.rank(mb, stage)) for mb in range(N)]


def test_same_compute_as_1f1b_and_gpipe(tmp_path):
    P, N = 4, 8
    runs = {k: _run(_scenario(tmp_path, k, P, N)) for k in ("dualpipe", "1f1b", "gpipe")}
    work = {k: sum(s.dur_s for s in r.spans if s.kind == "compute" and s.phase != "opt")
            for k, r in runs.items()}
    flops = {k: sum(s.flops for s in r.spans if s.kind == "compute" and s.phase != "opt")
             for k, r in runs.items()}
    assert work["dualpipe"] == pytest.approx(work["1f1b"], rel=1e-12)
    assert work["gpipe"] == pytest.approx(work["1f1b"], rel=1e-12)
    assert flops["dualpipe"] == pytest.approx(flops["1f1b"], rel=1e-12)
    # the optimizer updates two copies of every stage: twice the parameters
    opt = {k: sum(s.flops for s in r.spans if s.name == "opt.adam") for k, r in runs.items()}
    assert opt["dualpipe"] == pytest.approx(2 * opt["1f1b"], rel=1e-12)
    # GPipe and 1F1B share the bubble (p-1)(F+B); DualPipe's is smaller
    end = {k: _pipeline_end(r) for k, r in runs.items()}
    assert end["gpipe"] == pytest.approx(end["1f1b"], rel=1e-12)
    assert end["dualpipe"] < 0.9 * end["1f1b"]


def _durations(r, stage_layers) -> tuple[Durations, float]:
    """F, B (full), W of one (micro-batch, stage) as the engine timed them, and the
    time of the ops only the end stages run (embedding, LM head) plus pipeline sends."""
    per = Counter()
    for s in r.spans:
        if s.kind == "compute" and s.layer in stage_layers and s.microbatch == 0:
            part = "W" if ".w_" in s.name else s.phase
            per[part] += s.dur_s
    extra = sum(s.dur_s for s in r.spans
                if s.name.endswith(("embedding", "lm_head")) or s.kind == "pp")
    F, Bi, W = per["fwd"], per["bwd"], per["W"]
    return Durations(F=F, B=Bi + W, W=W, FB=F + Bi + W), extra


CASES = [(P, N) for P in (2, 4, 8) for N in (2 * P, 2 * P + 2, 4 * P)]


@pytest.mark.parametrize("P, N", CASES)
def test_dualpipe_step_matches_the_evaluator(tmp_path, P, N):
    r = _run(_scenario(tmp_path, "dualpipe", P, N))
    t, extra = _durations(r, {2, 3})
    tl = evaluate(make_dual_order("dualpipe", P, N), 0, t)
    end = _pipeline_end(r)
    assert tl.step <= end * (1 + 1e-12)
    assert end <= (tl.step + extra) * (1 + 1e-12)
    assert extra < 0.05 * end             # the bound is tight: within 5 %


@pytest.mark.parametrize("P, N", CASES)
def test_dualpipev_on_half_the_devices(tmp_path, P, N):
    D = P // 2
    r = _run(_scenario(tmp_path, "dualpipev", D, N, stages=P))
    o = make_dual_order("dualpipev", D, N)
    t, extra = _durations(r, {2, 3})
    tl = evaluate(o, 0, t)
    end = _pipeline_end(r)
    assert tl.step <= end * (1 + 1e-12) and end <= (tl.step + extra) * (1 + 1e-12)
    # every micro-batch's backward of every stage, on the rank holding that stage
    got = Counter((s.microbatch, s.layer, s.rank) for s in r.spans if s.name == "bwd.w_attn")
    assert got == Counter((mb, layer, o.rank(mb, st)) for mb in range(N) for st in range(P)
                          for layer in (2 * st, 2 * st + 1))


# ---------------------------------------------------------------- EP overlap

def test_fb_overlap_hides_all_to_alls(tmp_path):
    # 4 GPUs on real PCIe links (31.5 GB/s), EP 2 inside DP 2, MoE toy layers
    base = tmp_path / "ep.yaml"
    text = _scenario(tmp_path, "dualpipe", 2, 4, gpus=4, dense=False, ep=2).read_text()
    base.write_text(text.replace("pcie_GBps: 1000000000.0, pcie_latency_us: 0.0", ""))
    plain = _run(base)
    over = _run(base, "overlap.kind=static")
    assert over.step_time_s < plain.step_time_s
    busy = Counter()
    for s in over.spans:
        if s.stream == "compute" and s.kind == "compute":
            busy[s.rank] += s.dur_s
    assert over.step_time_s >= max(busy.values())
    # the pairs' all-to-alls moved to their own stream, the others stayed
    streams = {s.stream for s in over.spans if s.kind.startswith("ep_")}
    assert streams == {"ep", "compute"}
    # the same work in both
    cw = lambda r: sorted((s.rank, s.name, s.microbatch, s.layer) for s in r.spans  # noqa
                          if s.kind == "compute")
    assert cw(over) == cw(plain)


@pytest.mark.parametrize("pp, kind, m", [(1, "1f1b", 4), (2, "interleaved", 4),
                                         (2, "interleaved", 6), (4, "interleaved", 8)])
def test_a2a_1f1b_runs_and_keeps_the_work(tmp_path, pp, kind, m):
    p = _scenario(tmp_path, kind, pp, m, gpus=2 * pp, dense=False, ep=2)
    over = ["parallel.vpp=2", f"model.layers={2 * pp}"] if kind == "interleaved" else []
    plain = _run(p, *over)
    a2a = _run(p, *over, "overlap.kind=a2a-1f1b")
    cw = lambda r: sorted((s.rank, s.name, s.microbatch, s.layer) for s in r.spans  # noqa
                          if s.kind == "compute")
    assert cw(a2a) == cw(plain)
    assert any(s.stream == "ep" for s in a2a.spans)


# ---------------------------------------------------------------- memory, errors

def test_memory_two_copies_and_pp_plus_one(tmp_path):
    P, N = 4, 8
    res = resolve_path(_scenario(tmp_path, "dualpipe", P, N))
    one = resolve_path(_scenario(tmp_path, "1f1b", P, N))
    dual, single = StageMemory(res), StageMemory(one)
    params = lambda sm: sum(sm.row(s)["dense_params"] for s in range(P))  # noqa: E731
    assert params(dual) == pytest.approx(2 * params(single), rel=1e-12)
    for s in range(P):
        row = dual.row(s)
        assert row["inflight"] == P + 1
        assert row["weights"] == pytest.approx(single.row(s)["weights"]
                                               + single.row(P - 1 - s)["weights"], rel=1e-12)
    # rank 0 at its peak: stage 0 and stage 3 activation sets, each charged its layers
    from moesim.schedule.dualpipe import peak_alive
    _, alive = peak_alive(dual.dual, 0)
    acts = sum(memory_per_rank(res.model, stage=st, layers=[2 * st, 2 * st + 1],
                               inflight_microbatches=k,
                               **dict(dual.common, pp=P)).activations
               for st, k in alive.items() if k)
    assert dual.row(0)["activations"] == pytest.approx(acts, rel=1e-12)
    v = StageMemory(resolve_path(_scenario(tmp_path, "dualpipev", 2, 8, stages=4)))
    assert v.row(0)["inflight"] == 2 * 2 + 1


@pytest.mark.parametrize("pp, kind, m", [(1, "1f1b", 4), (2, "interleaved", 4)])
def test_fast_engine_runs_a2a_1f1b(tmp_path, pp, kind, m):
    # same pairs in the same order, same work; over near-free links (all-to-alls of
    # ~1e-12 s) the only difference left is how an all-to-all is hidden (budget rule /
    # interleaving), so the steps agree to 1e-6
    p = _scenario(tmp_path, kind, pp, m, gpus=2 * pp, dense=False, ep=2, overlap="a2a-1f1b")
    over = ["parallel.vpp=2", f"model.layers={2 * pp}"] if kind == "interleaved" else []
    ex, fa = _run(p, *over), simulate(p, [*over, "engine.mode=fast"])
    assert fa.summary["model_flops"] == pytest.approx(ex.summary["model_flops"], rel=1e-12)
    assert fa.summary["breakdown_s"]["compute"] == pytest.approx(
        ex.summary["breakdown_s"]["compute"], rel=1e-9)
    assert fa.step_time_s == pytest.approx(ex.step_time_s, rel=1e-6)


@pytest.mark.parametrize("kind, pp, stages", [("dualpipe", 4, 4), ("dualpipev", 2, 4)])
def test_fast_engine_runs_the_same_order(tmp_path, kind, pp, stages):
    # compute only: the fast chain runs the same items with the same F, B, W costs; the
    # pipeline transfers (~1e-12 s) are the only difference
    p = _scenario(tmp_path, kind, pp, 8, stages=stages)
    ex, fa = _run(p), simulate(p, ["engine.mode=fast"])
    assert fa.step_time_s == pytest.approx(ex.step_time_s, rel=1e-9)
    assert fa.summary["model_flops"] == pytest.approx(ex.summary["model_flops"], rel=1e-12)
    for k, v in ex.summary["breakdown_s"].items():
        assert fa.summary["breakdown_s"][k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def test_zero3_refused_with_dualpipe(tmp_path):
    p = _scenario(tmp_path, "dualpipe", 2, 4)
    with pytest.raises(InputError, match="parallel.zero"):
        resolve_path(p, ["parallel.zero=3"])


@pytest.mark.parametrize("kind, pp, copies", [("dualpipe", 4, 2), ("dualpipev", 2, 1)])
def test_gradients_reduce_over_every_copy(tmp_path, kind, pp, copies):
    # 2 data-parallel replicas; DualPipe holds every stage on two pipeline ranks (r and
    # P-1-r), so a stage's buckets reduce over both copies' DP groups: 2 x 2 ranks;
    # DualPipeV holds each stage once: the DP group of 2. Each held stage has its own
    # buckets, highest stage first, after its layers' last weight gradient.
    from moesim.program.build import build_step
    res = resolve_path(_scenario(tmp_path, kind, pp, 8, stages=4, gpus=2 * pp))
    plan = build_step(res)
    lay = res.layout
    for rank, prog in enumerate(plan.programs):
        dps = [op for op in prog if op.kind == "dp"]
        pos = int(lay.coords["pp"][rank])
        held = sorted({st for it in make_dual_order(kind, pp, 8).items[pos]
                       for _, _, st in it.parts()}, reverse=True)
        assert [int(op.name.split(".")[1][1:]) for op in dps] == held   # one bucket each
        pp_g = lay.group_of(rank, "pp")
        for op, st in zip(dps, held, strict=True):
            assert len(op.coll.group) == 2 * copies
            holders = {pp_g[p] for p in range(pp)
                       if st in {x for it in make_dual_order(kind, pp, 8).items[p]
                                 for _, _, x in it.parts()}}
            assert set(op.coll.group) == {q for h in holders for q in lay.group_of(h, "dp")}
            last_w = max(i for i, o in enumerate(prog) if o.name.startswith("bwd.w_")
                         and o.layer in (2 * st, 2 * st + 1))
            assert op.deps == (last_w,)
