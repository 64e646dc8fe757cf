"""``schedule.pp_comm: reference``: DualPipe(V)'s pipeline messages as
deepseek-ai/DualPipe issues them (dualpipe/dualpipe.py at 3da1bbea,
``_commit_and_wait_comm``: the queued sends and receives go at the rank's next commit,
each once both sides have posted it, and the rank waits for all of them, sends
included), in the pure stage-time run and in both engines."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from moesim.errors import InputError
from moesim.schedule.dualpipe import dualpipe_order, dualpipev_order, make_dual_order
from moesim.schedule.dualpipe_comm import run_reference
from moesim.schedule.evaluate import Durations
from moesim.wiring import resolve_path, simulate
from tests.test_dualpipe_engine import TOY_YAML

# the toy model of tests/test_dualpipe_engine.py: every layer dense, one GPU per stage,
# PCIe links of pcie_GBps without latency, no launch cost


def _scenario(tmp_path: Path, kind: str, pp: int, m: int, stages: int, gbps: float,
              ep: int = 1, overlap: str = "none") -> Path:
    p = tmp_path / f"{kind}-{pp}-{m}-{gbps}-{ep}.yaml"
    p.write_text(TOY_YAML.format(gpus=pp * ep, gbps=gbps, layers=2 * stages,
                                 dense=2 * stages if ep == 1 else 0, pp=pp, ep=ep,
                                 kind=kind, m=m, overlap=overlap))
    return p


# ---------------------------------------------------------------- pure, by hand

def test_dualpipe_two_ranks_by_hand():
    # P=2, N=4, F=1, B=2 (input part 1), W=1, F&B=3, every message 1. The ranks mirror
    # each other. t=1: each posts its F output and the next F's input; both sides post
    # at 1, delivered at 2: F2.1 runs 2-3 (free: 1-2). F1.0 3-4, BW2.1 4-6. t=6: each
    # posts two sends (act 1.1, grad 2.0) and two receives; the pp stream sends one at
    # a time: 6-7, 7-8, so the commit (sends included) ends at 8 and the pair runs
    # 8-11. BW3.1 11-13, then grad 3.0 out and grad 1.0 in, 13-14; B1.0 14-15, W1.0
    # 15-16. Step 16 = 12 (free communication) + 4 transfers on the path.
    o, t = dualpipe_order(2, 4), Durations(F=1, B=2, W=1, FB=3)
    assert run_reference(o, t).step == 12
    tl = run_reference(o, t, transfer=1)
    assert [(s, e, str(it)) for s, e, it in tl.busy[0]] == [
        (0, 1, "F0.0"), (2, 3, "F2.1"), (3, 4, "F1.0"), (4, 6, "BW2.1"),
        (8, 11, "F3.1&B0.0"), (11, 13, "BW3.1"), (14, 15, "B1.0"), (15, 16, "W1.0")]
    assert [(s, e) for s, e, _ in tl.busy[1]] == [(s, e) for s, e, _ in tl.busy[0]]
    assert tl.step == 16


def test_blocking_send_and_rendezvous_by_hand():
    # DualPipeV, 2 ranks, N=4, every chunk 1 (an input-gradient B takes 0), messages 1.
    # Rank 1 posts F0.1's input at 0; rank 0 posts its send at 1 (after F0.0): the
    # transfer runs 1-2 and rank 0 waits for it, so F1.0 runs 2-3 (an eager send: 1-2).
    # Rank 1 queued F1.1's input before F0.2 (the turn, no input of its own), so F0.2
    # waits for it: 3-4 (posted by both at 3), F0.2 4-5. Rank 0, after B0.3 at 8,
    # posts grad 0.2 out and act 1.3 in; rank 1 posts its side only after F2.1 at 10:
    # the transfers run 10-11 and rank 0's W0.3 waits for them, 11-12.
    o, t = dualpipev_order(2, 4), Durations(F=1, B=1, W=1, FB=1)
    block = run_reference(o, t, transfer=1)
    eager = run_reference(o, t, transfer=1, eager_sends=True)
    r0 = {str(it): (s, e) for s, e, it in block.busy[0]}
    r1 = {str(it): (s, e) for s, e, it in block.busy[1]}
    assert r0["F0.0"] == (0, 1) and r0["F1.0"] == (2, 3) and r1["F0.1"] == (2, 3)
    assert {str(it): (s, e) for s, e, it in eager.busy[0]}["F1.0"] == (1, 2)
    assert r1["F0.2"] == (4, 5) and r0["F0.3"] == (6, 7) and r1["F1.2"] == (8, 9)
    assert r0["B0.3"] == (8, 8) and r1["F2.1"] == (9, 10)
    assert r0["W0.3"] == (11, 12) and r1["BW0.2"] == (11, 12)
    assert block.step > eager.step > run_reference(o, t).step


def test_a_message_flies_while_both_ranks_wait():
    # the case above by hand: the messages fly 1-2, 6-7 and 7-8, 13-14, and those are
    # exactly the gaps of each rank's chunks (the ranks mirror each other): both sides
    # wait in their commits while a message is in flight, so no chunk of either rank
    # (nor an all-to-all inside it) runs beside a message
    tl = run_reference(dualpipe_order(2, 4), Durations(F=1, B=2, W=1, FB=3), transfer=1)
    for busy in tl.busy:
        gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False)
                if b[0] > a[1]]
        assert gaps == [(1, 2), (6, 8), (13, 14)]


@pytest.mark.parametrize("make, ranks, n", [
    (dualpipe_order, 4, 8), (dualpipe_order, 8, 20), (dualpipev_order, 2, 4),
    (dualpipev_order, 4, 10)])
def test_transfer_time_never_shortens_the_step(make, ranks, n):
    # a slower message never ends a commit earlier (max-plus), and free messages give
    # the free run
    o = make(ranks, n)
    for t in (Durations(1, 2, 1, 3), Durations(5, 3, 3, 25)):
        steps = [run_reference(o, t, transfer=x).step for x in (0, 0.25, 1, 4)]
        assert steps == sorted(steps) and steps[0] == run_reference(o, t).step


# ---------------------------------------------------------------- the engines

def _durations(r, stage_layers) -> tuple[Durations, float]:
    """F, B (full), W of one (micro-batch, stage) as the engine timed them, and the
    time of the ops only the end stages run (embedding, LM head)."""
    per = Counter()
    for s in r.spans:
        if s.kind == "compute" and s.layer in stage_layers and s.microbatch == 0:
            per["W" if ".w_" in s.name else s.phase] += s.dur_s
    extra = sum(s.dur_s for s in r.spans if s.name.endswith(("embedding", "lm_head")))
    F, Bi, W = per["fwd"], per["bwd"], per["W"]
    return Durations(F=F, B=Bi + W, W=W, FB=F + Bi + W), extra


def _pipeline_end(r) -> float:
    return max(s.end_s for s in r.spans if s.kind == "compute" and s.phase in ("fwd", "bwd"))


@pytest.mark.parametrize("kind, pp, m, stages", [("dualpipe", 2, 4, 2), ("dualpipe", 4, 8, 4),
                                                 ("dualpipev", 2, 4, 4)])
@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("gbps", [1e9, 20.0])
def test_engines_run_the_reference_program(tmp_path, kind, pp, m, stages, mode, gbps):
    # every message takes x, the same on every pair of this PCIe switch (1e9 GB/s: about
    # 1e-12 s, communication free; 20 GB/s: 13.1 us); given the engine's own F, B, W and
    # x, the step lies between the stage-time run of the reference program and that
    # plus the embedding and LM head (a fixed-order makespan grows by at most the time
    # added)
    p = _scenario(tmp_path, kind, pp, m, stages, gbps)
    r = simulate(p, ["schedule.pp_comm=reference", f"engine.mode={mode}"],
                 record_series=False)
    sends = {round(s.dur_s, 15) for s in r.spans if s.kind == "pp" and s.dur_s > 0}
    assert len(sends) == 1
    x = sends.pop()
    t, extra = _durations(r, {2, 3})
    want = run_reference(make_dual_order(kind, pp, m), t, transfer=x).step
    end = _pipeline_end(r)
    assert want * (1 - 1e-12) <= end <= (want + extra) * (1 + 1e-12)
    if gbps < 1e3:   # the eager run is faster, by more than the slack: commits cost time
        eager = _pipeline_end(simulate(p, [f"engine.mode={mode}"], record_series=False))
        assert eager + extra < end
    # every commit's wait is a bubble naming its peer stage
    waits = [s for s in r.spans if s.kind == "bubble" and s.name.endswith(".send")]
    assert waits and all(s.waited_on >= 0 for s in waits)


@pytest.mark.parametrize("kind, pp, stages", [("dualpipe", 4, 4), ("dualpipev", 2, 4)])
@pytest.mark.parametrize("gbps, rel", [(1e9, 1e-9), (20.0, 3e-3)])
def test_fast_and_exact_agree_with_ep(tmp_path, kind, pp, stages, gbps, rel):
    # EP 2 with the F&B overlap: near-free links agree to 1e-9 (the eager runs' bound);
    # over slow links within 0.3 % (the eager runs differ by 0.12 % and 0.21 % there)
    p = _scenario(tmp_path, kind, pp, 10, stages, gbps, ep=2, overlap="static")
    ex, fa = (simulate(p, ["schedule.pp_comm=reference", f"engine.mode={e}"],
                       record_series=False) for e in ("exact", "fast"))
    assert fa.step_time_s == pytest.approx(ex.step_time_s, rel=rel)
    assert fa.summary["breakdown_s"]["compute"] == pytest.approx(
        ex.summary["breakdown_s"]["compute"], rel=1e-9)


def test_eager_is_the_default_and_not_echoed(tmp_path):
    p = _scenario(tmp_path, "dualpipe", 2, 4, 2, 20.0)
    res = resolve_path(p)
    assert res.scenario.schedule.pp_comm == "eager"
    assert "pp_comm" not in res.scenario.to_dict()["schedule"]
    on = resolve_path(p, ["schedule.pp_comm=reference"]).scenario.to_dict()["schedule"]
    assert on["pp_comm"] == "reference"


def test_bad_values_refused_in_one_line(tmp_path):
    p = _scenario(tmp_path, "dualpipe", 2, 4, 2, 20.0)
    with pytest.raises(InputError, match="schedule.pp_comm") as e:
        resolve_path(p, ["schedule.pp_comm=lazy"])
    assert "\n" not in str(e.value)
    # other schedules have no commits: the knob leaves them as they are (a DualPipe
    # scenario that ships it keeps its --set schedule.kind=1f1b what-if)
    one = _scenario(tmp_path, "dualpipe", 2, 4, 2, 20.0)
    over = ["schedule.kind=1f1b", "schedule.microbatches=4"]
    a = simulate(one, over, record_series=False).step_time_s
    assert simulate(one, [*over, "schedule.pp_comm=reference"],
                    record_series=False).step_time_s == a


# ---------------------------------------------------------------- beside the all-to-alls

#: DeepSeek-V3 cut to 32 GPUs (tests/test_fast_pairs.py's DS32): DualPipeV on PP 2, each
#: stage's EP16 group over two nodes with NCCL all-to-alls, so a pipeline send leaves
#: through the NICs its stages' all-to-alls use
DS32_V = ["model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null", "model.layers=4",
          "model.first_dense_layers=0", "schedule.microbatches=4", "cluster.nodes=4",
          "parallel.pp=2", "parallel.ep=16", "routing.max_nodes=null",
          "parallel.ep_backend.kind=nccl", "routing.grad_dispatch_dtype=bf16",
          "schedule.kind=dualpipev"]


def _sends_and_a2as(r):
    sends = [s for s in r.spans if s.kind == "pp" and s.name.endswith(".send")]
    a2as = [(s.start_s, s.end_s) for s in r.spans
            if s.kind in ("ep_dispatch", "ep_combine") and s.end_s > s.start_s]
    met = [s for s in sends
           if any(min(e, s.end_s) > max(a, s.start_s) for a, e in a2as)]
    return sends, met


@pytest.mark.slow
def test_reference_messages_never_meet_an_all_to_all():
    """Eager, a send leaves after its chunk while the rank computes on, and the next
    chunk's all-to-alls share its NICs: the exact engine's flow network stretches it
    (measured: 79 of the 256 sends, 1.30 to 6.89 ms against 1.24 ms alone; the fast
    path holds them beside the all-to-alls, fast.flow_a2a). With the reference's
    commits a transfer starts once both sides have posted and both ranks wait in their
    commit until it is delivered, so it lies between their chunks and no all-to-all of
    either stage (PP 2: every rank) runs beside it. Alone on its path, as the fast path
    times it: one 4096 x 7168 BF16 activation, 58,720,256 B at 50 GB/s x 0.95 over the
    NIC, plus 2 x 1.4 us of IB latency (topologies/dgx-h800.yaml): 1.239016 ms. Only a
    send beside a gradient bucket's ring (after the exact engine's first bucket starts)
    takes longer. Fast against exact: step within 0.3 % (measured +0.05 %), every
    category within 1 % of the step."""
    alone = 4096 * 7168 * 2 / (50e9 * 0.95) + 2 * 1.4e-6
    eager = simulate("deepseek-v3-2048", [*DS32_V, "schedule.pp_comm=eager"], engine="exact")
    sends, met = _sends_and_a2as(eager)
    assert met and max(s.dur_s for s in met) > 4 * alone       # shared with all-to-alls
    runs = {e: simulate("deepseek-v3-2048", [*DS32_V, "schedule.pp_comm=reference"],
                        engine=e) for e in ("exact", "fast")}
    bucket = min(s.start_s for s in runs["exact"].spans if s.kind == "dp")
    for r in runs.values():
        sends, met = _sends_and_a2as(r)
        assert len(sends) == 256 and not met
        early = [s.dur_s for s in sends if s.end_s <= bucket]
        assert len(early) >= 200 and early == pytest.approx([alone] * len(early), rel=1e-9)
    ex, fa = runs["exact"], runs["fast"]
    assert fa.step_time_s == pytest.approx(ex.step_time_s, rel=3e-3)
    for k, v in ex.summary["breakdown_s"].items():
        assert abs(fa.summary["breakdown_s"][k] - v) < 0.01 * ex.step_time_s, k
