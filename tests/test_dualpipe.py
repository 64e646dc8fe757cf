"""DualPipe / DualPipeV orders (deepseek-ai/DualPipe dualpipe/dualpipe.py, dualpipev.py),
the stage-time evaluator against the README's bubble and memory table, Megatron-Core's
1F1B with all-to-all overlap, and the scenario fields that select them."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction as Fr
from pathlib import Path

import pytest

from moesim.errors import InputError
from moesim.scenario import load_scenario
from moesim.schedule.a2a_overlap import (
    a2a_1f1b_order,
    flatten,
    pair_timeline,
    serial_time,
)
from moesim.schedule.dualpipe import (
    Item,
    check,
    dualpipe_order,
    dualpipev_order,
    inflight_activations,
    peak_alive,
    recvs,
    sends,
)
from moesim.schedule.evaluate import Durations, evaluate, from_pipeline, work_done
from moesim.schedule.pipeline import (
    gpipe_order,
    inflight_microbatches,
    interleaved_order,
    one_f_one_b_order,
    simulate_pipeline,
)
from moesim.wiring import resolve as resolve_scenario


def _s(items) -> str:
    return " ".join(map(str, items))


# ---------------------------------------------------------------- orders by hand

def test_dualpipe_p4_n8_by_hand():
    # step() with P=4, N=8: half_num_chunks 4, num_half_ranks 2. Rank 0 (h=0): step 1
    # (2-0-1)*2 = 2 F0; step 2 one (F0, F1); step 3 one (B1 zb, W, F1); step 4
    # 4-4+0+1 = 1 x (F0&B1, F1&B0); step 5 one (B1, F1&B0); step 6 (h even) B1 full,
    # then zero bubble from B0; step 7 one (W, B0); step 8 one W. Phase 0 of rank 0
    # is stage 0 of micro-batches 0..3, phase 1 stage 3 of micro-batches 4..7.
    o = dualpipe_order(4, 8)
    assert _s(o.items[0]) == ("F0.0 F1.0 F2.0 F4.3 B4.3 W4.3 F5.3 F3.0&B5.3 F6.3&B0.0 "
                              "BW6.3 F7.3&B1.0 BW7.3 B2.0 W2.0 B3.0 W3.0")
    # rank 1 (h=1, a middle rank): no steps 1, 3, 5, 7; two (F0, F1); step 4 twice, its
    # first F0 and B1 not overlapped; step 6 (h odd) zero bubble from the 2nd pair
    assert _s(o.items[1]) == ("F0.1 F4.2 F1.1 F5.2 F2.1 BW4.2 F6.2&B0.1 F3.1&B5.2 "
                              "F7.2&B1.1 BW6.2 BW2.1 B7.2 B3.1 W7.2 W3.1")
    # second half: phase 0 is the reverse direction (micro-batches 4..7), stage h
    assert _s(o.items[2]) == ("F4.1 F0.2 F5.1 F1.2 F6.1 BW0.2 F2.2&B4.1 F7.1&B1.2 "
                              "F3.2&B5.1 BW2.2 BW6.1 B3.2 B7.1 W3.2 W7.1")
    assert o.rank(0, 3) == 3 and o.rank(5, 3) == 0 and o.rank(5, 0) == 3


def test_dualpipe_matches_the_readme_figure():
    # deepseek-ai/DualPipe images/dualpipe.png (8 ranks, 20 micro-batches), read cell by
    # cell up to each device's first overlapped pair; the figure leaves the reverse
    # direction's micro-batches (here 10..19) unlabelled. Device 0: forwards 0..6, a
    # reverse forward, then three times (backward for input, backward for weights,
    # forward), then the overlapped 7. Device 1: 0..4, rev, 5, rev, then (B, W, F) twice
    # and the overlapped 6.
    o = dualpipe_order(8, 20)
    assert [(it.kind, it.mb) for it in o.items[0][:18]] == (
        [("F", i) for i in range(7)] + [("F", 10)]
        + [("B", 10), ("W", 10), ("F", 11), ("B", 11), ("W", 11), ("F", 12), ("B", 12),
           ("W", 12), ("F", 13), ("F&B", 7)])
    assert [(it.kind, it.mb) for it in o.items[1][:15]] == (
        [("F", i) for i in range(5)] + [("F", 10), ("F", 5), ("F", 11)]
        + [("B", 10), ("W", 10), ("F", 12), ("B", 11), ("W", 11), ("F", 13), ("F&B", 6)])


def test_dualpipev_matches_the_readme_figure():
    # images/dualpipev.png (4 ranks, 8 stages, 10 micro-batches; white labels are the
    # second chunk, stage 7-r), read up to each device's first overlapped pair
    o = dualpipev_order(4, 10)
    got = [" ".join(map(str, o.items[r][:k])) for r, k in ((0, 17), (1, 15), (2, 12), (3, 11))]
    assert got == [
        "F0.0 F1.0 F2.0 F3.0 F4.0 F5.0 F6.0 F0.7 B0.7 W0.7 F1.7 B1.7 W1.7 F2.7 B2.7 W2.7 F3.7",
        "F0.1 F1.1 F2.1 F3.1 F4.1 F0.6 F5.1 F1.6 B0.6 W0.6 F2.6 B1.6 W1.6 F3.6 F6.1&B2.6",
        "F0.2 F1.2 F2.2 F0.5 F3.2 F1.5 F4.2 F2.5 B0.5 W0.5 F3.5 F5.2&B1.5",
        "F0.3 F0.4 F1.3 F1.4 F2.3 F2.4 F3.3 F3.4 F4.3 BW0.4 F4.4&B0.3"]
    assert str(o.items[0][17]) == "F7.0&B3.7"


def test_dualpipev_d2_n4_by_hand():
    # DualPipeV, 2 devices, 4 stages (rank 0: stages 0 and 3, rank 1: 1 and 2), N=4.
    # rank 0 (r=0): step 1 2 F0; step 2 (F0, F1); step 3 (B1 zb, W, F1); step 4
    # 4-4+0+1 = 1; step 5 one; step 6 B1 full then B0 zero bubble; step 7; step 8.
    o = dualpipev_order(2, 4)
    assert _s(o.items[0]) == ("F0.0 F1.0 F2.0 F0.3 B0.3 W0.3 F1.3 F3.0&B1.3 F2.3&B0.0 "
                              "BW2.3 F3.3&B1.0 BW3.3 B2.0 W2.0 B3.0 W3.0")
    # rank 1 (last): two (F0, F1) with the turn from stage 1 to stage 2 on the device
    assert _s(o.items[1]) == ("F0.1 F0.2 F1.1 F1.2 F2.1 BW0.2 F2.2&B0.1 F3.1&B1.2 "
                              "F3.2&B1.1 BW2.2 BW2.1 B3.2 B3.1 W3.2 W3.1")


def test_phase_counts_follow_h():
    # per rank: N forwards and N backwards over its two stages; overlapped pairs
    # 2(N/2 - P + h + 1) + (P/2 - h - 1), one fewer on the two middle ranks; zero-bubble
    # backwards (P/2-h-1) in step 3, h+1 in step 6, (P/2-h-1) in step 7, each with a W
    P, N = 8, 20
    o = dualpipe_order(P, N)
    for r, items in enumerate(o.items):
        h = min(r, P - 1 - r)
        c = Counter(it.kind for it in items)
        pairs = 2 * (N // 2 - P + h + 1) + (P // 2 - h - 1) - (h == P // 2 - 1)
        assert c["F&B"] == pairs
        assert c["F"] + c["F&B"] == N and c["B"] + c["BW"] + c["F&B"] == N
        assert c["B"] == c["W"] == 2 * (P // 2 - h - 1) + h + 1
        warm = items[: 2 * (P // 2 - h - 1) + 1]       # step 1 and step 2's first F0
        assert all(it.kind == "F" and it.stage == h for it in warm)
        assert items[len(warm)] == Item("F", o.direction.index(1 - r // (P // 2)), P - 1 - h)


@pytest.mark.parametrize("make, ranks, n", [
    (dualpipe_order, 2, 4), (dualpipe_order, 4, 8), (dualpipe_order, 6, 14),
    (dualpipe_order, 8, 20), (dualpipev_order, 1, 2), (dualpipev_order, 3, 7),
    (dualpipev_order, 4, 10)])
def test_every_microbatch_runs_f_b_w_once_per_stage(make, ranks, n):
    o = make(ranks, n)
    done = work_done(o)
    want = {(k, mb, s) for k in "FBW" for mb in range(n) for s in range(o.stages)}
    assert set(done) == want and set(done.values()) == {1}
    # each rank runs exactly its two stages
    for r, items in enumerate(o.items):
        assert {p[2] for it in items for p in it.parts()} == \
            {s for s in range(o.stages) if r in {o.rank(0, s), o.rank(n - 1, s)}}


def test_checks_follow_the_reference_asserts():
    assert check("dualpipe", 4, 8) is None and check("dualpipev", 3, 6) is None
    assert check("dualpipev", 3, 7) is None                  # DualPipeV: N need not be even
    assert check("dualpipe", 3, 6) == ("ranks", "an even number for dualpipe (rank r holds "
                                       "stages r and P-1-r)")
    assert check("dualpipe", 4, 6) == ("microbatches", "an even number >= 2 x ranks = 8 "
                                       "for dualpipe")
    assert check("dualpipe", 4, 9)[0] == "microbatches"
    assert check("dualpipev", 3, 5) == ("microbatches", "a number >= 2 x ranks = 6 for "
                                        "dualpipev")
    assert check("dualpipe", 0, 4) == ("ranks", "an integer >= 1")
    with pytest.raises(ValueError, match="microbatches: expected an even number"):
        dualpipe_order(4, 9)


# ---------------------------------------------------------------- pipeline messages

@pytest.mark.parametrize("make, ranks, n, per_way", [
    (dualpipe_order, 4, 8, 8 * 3), (dualpipe_order, 8, 16, 16 * 7),
    (dualpipev_order, 3, 6, 6 * 4)])   # V: 2D-1 stage crossings, the turn is local
def test_every_send_has_one_receive(make, ranks, n, per_way):
    o = make(ranks, n)
    sent = Counter(t for r, items in enumerate(o.items) for it in items for t in sends(o, r, it))
    got = Counter(t for r, items in enumerate(o.items) for it in items for t in recvs(o, r, it))
    assert sent == got and set(sent.values()) == {1}
    assert Counter(t.what for t in sent) == {"act": per_way, "grad": per_way}
    for t in sent:   # neighbours only
        assert abs(t.src - t.dst) == 1


def test_dualpipe_directions():
    o = dualpipe_order(4, 8)
    f = [t for it in o.items[1] if it.kind == "F" for t in sends(o, 1, it)]
    # rank 1 sends micro-batches 0..3 (stage 1 -> 2) to rank 2, 4..7 (stage 2 -> 3) to 0
    assert {(t.mb < 4, t.dst) for t in f} == {(True, 2), (False, 0)}
    assert sends(o, 0, Item("BW", 0, 0)) == [] and sends(o, 3, Item("F", 0, 3)) == []


# ---------------------------------------------------------------- bubble (README table)

def _middle_idle(o, t):
    tl = evaluate(o, 0, t)
    k = o.ranks // 2 - 1 if o.kind == "dualpipe" else o.ranks - 1
    return tl, tl.idle(k)


@pytest.mark.parametrize("P, N", [(2, 4), (4, 8), (4, 12), (6, 12), (8, 20), (10, 20)])
@pytest.mark.parametrize("fb", [Fr(2), Fr(5, 2), Fr(3), Fr(7, 2)])
def test_dualpipe_bubble_matches_the_readme(P, N, fb):
    # README: bubble (PP/2-1)(F&B + B - 3W), B a full backward and W its weight part.
    # By hand for P=4, N=8, F = W = 1, B = 2, F&B = 3 (rank 0 above): 5 F + 3 B-W + 3 W
    # + 2 full B + 3 F&B = 5 + 3 + 3 + 4 + 9 = 24 busy in a step of 26: idle 2 = 1 x 2.
    # The bubble is the idle time (step - own compute) of the middle ranks, which run the
    # most F&B pairs, with the zero-bubble convention F = B - W = W; with F&B = F + B
    # every rank idles exactly that long.
    t = Durations(F=1, B=2, W=1, FB=fb)
    o = dualpipe_order(P, N)
    tl, idle = _middle_idle(o, t)
    assert idle == (P // 2 - 1) * (t.FB + t.B - 3 * t.W)
    if fb == 3:
        assert {tl.idle(r) for r in range(P)} == {idle}
    if (P, N, fb) == (4, 8, 3):
        assert tl.step == 26 and tl.busy_time(0) == 24


@pytest.mark.parametrize("D, N", [(1, 2), (2, 4), (3, 6), (4, 10)])
def test_dualpipev_bubble_on_half_the_devices(D, N):
    # DualPipeV: PP = 2D stages on D devices, the same (PP/2-1)(F&B + B - 3W)
    for fb in (Fr(2), Fr(5, 2), Fr(3)):
        t = Durations(F=1, B=2, W=1, FB=fb)
        _, idle = _middle_idle(dualpipev_order(D, N), t)
        assert idle == (D - 1) * (t.FB + t.B - 3 * t.W)


def test_other_durations_are_not_the_readme_formula():
    # with F != W the formula is not exact; e.g. P=8, F=10, B=20, W=5, F&B=25: the middle
    # ranks idle 80 against the formula's 3 x (25 + 20 - 15) = 90 (worked by the evaluator
    # and kept here so a change in the order shows)
    _, idle = _middle_idle(dualpipe_order(8, 16), Durations(10, 20, 5, 25))
    assert idle == 80


@pytest.mark.parametrize("p, m", [(2, 2), (4, 8), (8, 16), (3, 7)])
def test_1f1b_and_gpipe_bubble(p, m):
    # README: 1F1B bubble (PP-1)(F+B) on every stage, whatever F and B
    t = Durations(F=Fr(3), B=Fr(7), W=Fr(2), FB=Fr(10))
    for order in (one_f_one_b_order(p, m), gpipe_order(p, m)):
        tl = evaluate(from_pipeline(order), p, t)
        assert {tl.idle(r) for r in range(p)} == {(p - 1) * (t.F + t.B)}
        # agrees with the existing executor
        assert tl.step == simulate_pipeline(order, 3, 7).step_time_s


def test_total_compute_agrees():
    # no overlap gain (F&B = F + B): DualPipe, 1F1B and GPipe do the same compute on P
    # stages, N micro-batches: N P (F + B); DualPipeV on P/2 devices likewise
    t = Durations(F=Fr(3), B=Fr(7), W=Fr(2), FB=Fr(10))
    P, N = 8, 16
    want = N * P * (t.F + t.B)
    runs = [(dualpipe_order(P, N), 0), (dualpipev_order(P // 2, N), 0),
            (from_pipeline(one_f_one_b_order(P, N)), P), (from_pipeline(gpipe_order(P, N)), P)]
    for items, stages in runs:
        tl = evaluate(items, stages, t)
        assert sum(tl.busy_time(r) for r in range(len(tl.busy))) == want


def test_evaluator_detects_deadlock_and_repeats():
    t = Durations(1, 2, 1, 3)
    with pytest.raises(ValueError, match="deadlocks"):
        evaluate([[Item("BW", 0, 0), Item("F", 0, 0)]], 1, t)
    with pytest.raises(ValueError, match="repeats"):
        evaluate([[Item("F", 0, 0), Item("F", 0, 0)]], 1, t)
    with pytest.raises(ValueError, match="W <= B"):
        Durations(1, 1, 2, 2)


# ---------------------------------------------------------------- memory (README table)

@pytest.mark.parametrize("P, N", [(2, 4), (4, 8), (6, 12), (8, 20), (16, 32)])
def test_dualpipe_activations_pp_plus_one(P, N):
    o = dualpipe_order(P, N)
    assert inflight_activations(o) == [P + 1] * P
    total, per_stage = peak_alive(o, 0)
    assert total == P + 1 and sum(per_stage.values()) == P + 1 and set(per_stage) <= {0, P - 1}
    # against 1F1B's PP on its first stage (README: PP)
    assert inflight_microbatches(one_f_one_b_order(P, N))[0] == P


@pytest.mark.parametrize("D, N", [(1, 2), (2, 4), (4, 10), (8, 16)])
def test_dualpipev_activations_pp_plus_one(D, N):
    assert inflight_activations(dualpipev_order(D, N)) == [2 * D + 1] * D


# ---------------------------------------------------------------- Megatron a2a overlap

def _steps(order):
    return ["&".join(map(str, st)) for st in order]


def test_a2a_1f1b_without_pipelining():
    # combined_1f1b_schedule_for_no_pipelining: F0, B(i) with F(i+1), the last B alone
    assert _steps(a2a_1f1b_order(1, 4)[0]) == ["F0", "F1&B0", "F2&B1", "F3&B2", "B3"]


def test_a2a_1f1b_interleaved_by_hand():
    # p=2, v=2, m=4: warm-up 2(p-s-1) + (v-1)p + 1 = 5 on stage 0, 3 on stage 1; the
    # k-th steady step runs forward k + warm-up with backward k
    o = a2a_1f1b_order(2, 4, 2)
    assert _steps(o[0]) == ["F0", "F1", "F0.1", "F1.1", "F2", "F3&B0.1", "F2.1&B1.1",
                            "F3.1&B0", "B1", "B2.1", "B3.1", "B2", "B3"]
    assert _steps(o[1]) == ["F0", "F1", "F0.1", "F1.1&B0.1", "F2&B1.1", "F3&B0",
                            "F2.1&B1", "F3.1&B2.1", "B3.1", "B2", "B3"]
    for steps in o:
        for st in steps:
            if len(st) == 2:      # the paired forward and backward are independent
                assert st[0].mb != st[1].mb or st[0].chunk != st[1].chunk
    # flattened it is a valid pipeline order with every op once, one more activation
    # set in flight on stage 0 than plain interleaving (the extra warm-up forward)
    flat = flatten(o)
    simulate_pipeline(flat, 1.0, 2.0)
    plain = inflight_microbatches(interleaved_order(2, 4, 2))
    assert inflight_microbatches(flat)[0] == plain[0] + 1


def test_a2a_pair_timeline_by_hand():
    t = {("f", "attn"): 2, ("f", "dispatch"): 1, ("f", "mlp"): 2, ("f", "combine"): 1,
         ("b", "combine"): 1, ("b", "mlp"): 2, ("b", "mlp_dw"): 2, ("b", "dispatch"): 1,
         ("b", "attn"): 2, ("b", "attn_dw"): 2}
    # compute: attn_f 0-2, mlp_b 2-4, mlp_dw 4-6, mlp_f 6-8, attn_b 8-10, attn_dw 10-12;
    # comm: combine_b 0-1, dispatch_f 2-3, dispatch_b 4-5, combine_f 8-9: all hidden
    total, spans = pair_timeline([t])
    assert total == 12 and serial_time([t]) == 16
    assert spans[0][("f", "mlp")] == (6, 8) and spans[0][("b", "dispatch")] == (4, 5)
    # a slow forward dispatch (5): dispatch_f 2-7 delays dispatch_b to 7-8 and mlp_f to
    # 7-9; combine_f 9-10; attn_b 9-11, attn_dw 11-13
    slow = {**t, ("f", "dispatch"): 5}
    total, spans = pair_timeline([slow])
    assert total == 13 and spans[0][("b", "attn")] == (9, 11)
    # two layer pairs: the second forward attention waits for the first combine (9)
    assert pair_timeline([t, t])[0] == 24


# ---------------------------------------------------------------- scenario fields

BASE = """\
name: t
cluster: {topology: dgx-h100, nodes: 2, device: H100}
model: {preset: mixtral-8x7b}
parallel: {tp: 1, pp: 4, dp: 4, ep: 4}
schedule: {kind: dualpipe, microbatches: 8, seq_len: 256}
compute: {kind: roofline}
"""


def _load(tmp_path: Path, text: str, *sets: str, resolve: bool = False):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    scn = load_scenario(p, list(sets))
    return resolve_scenario(scn).scenario if resolve else scn


def test_scenario_accepts_dualpipe_and_overlap_kinds(tmp_path):
    s = _load(tmp_path, BASE)
    assert s.schedule.kind == "dualpipe" and s.overlap.kind == "none"
    s = _load(tmp_path, BASE, "schedule.kind=dualpipev", "schedule.microbatches=9")
    assert s.schedule.kind == "dualpipev"
    # the old switch and the new name are one pairing
    s = _load(tmp_path, BASE, "schedule.kind=1f1b", "overlap.ep_comm_overlap=true")
    assert s.overlap.kind == "static" and s.overlap.ep_comm_overlap
    s = _load(tmp_path, BASE, "schedule.kind=1f1b", "overlap.kind=static")
    assert s.overlap.ep_comm_overlap
    s = _load(tmp_path, BASE, "schedule.kind=interleaved", "parallel.vpp=2",
              "overlap.kind=a2a-1f1b")
    assert s.overlap.kind == "a2a-1f1b"


@pytest.mark.parametrize("sets, field, words", [
    (["parallel.pp=3", "parallel.dp=4"], "parallel.pp", "an even number for dualpipe"),
    (["schedule.microbatches=6"], "schedule.microbatches", ">= 2 x parallel.pp = 8"),
    (["schedule.microbatches=9"], "schedule.microbatches", "an even number"),
    (["schedule.kind=dualpipev", "schedule.microbatches=7"], "schedule.microbatches", "= 8"),
    (["overlap.kind=overlapped"], "overlap.kind", "one of"),
    (["schedule.kind=1f1b", "overlap.kind=a2a-1f1b"], "schedule.kind", "interleaved"),
    # only the --set is the user's: blamed with the file's value it conflicts with
    (["overlap.kind=a2a-1f1b"], "overlap.kind", "1f1b or interleaved"),
    (["schedule.kind=interleaved", "parallel.vpp=2", "parallel.ep=1",
      "overlap.kind=a2a-1f1b"], "parallel.ep", "at least 2"),
    (["schedule.kind=1f1b", "overlap.kind=a2a-1f1b", "overlap.ep_comm_overlap=true"],
     "overlap.ep_comm_overlap", "false"),
])
def test_scenario_errors_are_one_line(tmp_path, sets, field, words):
    with pytest.raises(InputError) as err:
        _load(tmp_path, BASE, *sets)
    # a value given by --set is blamed on the command line (issue 12 item 14)
    blamed = err.value.field.removeprefix("--set ").split(" (with ")[0]
    assert blamed == field and words in err.value.expected
    assert "\n" not in str(err.value)


def test_engines_take_dualpipe_but_not_with_zero3(tmp_path):
    # integrated in the exact engine (tests/test_dualpipe_engine.py); ZeRO-3 gathers are
    # not built for ranks holding two stages, so that combination stops in one line
    assert _load(tmp_path, BASE, resolve=True).schedule.kind == "dualpipe"
    with pytest.raises(InputError) as err:
        _load(tmp_path, BASE, "parallel.zero=3", resolve=True)
    assert err.value.field.removeprefix("--set ") == "parallel.zero"
    assert "dualpipe" in err.value.expected



def test_plot_schedule_draws_every_item():
    from moesim.schedule.plot import plot_schedule
    from moesim.trace.plots import new_figure

    tl = evaluate(dualpipe_order(4, 8), 0, Durations(1, 2, 1, 3))
    ax = new_figure().add_subplot(111)
    assert plot_schedule(ax, tl) is ax
    n_items = sum(len(row) for row in tl.busy)
    n_pairs = sum(it.kind == "F&B" for row in tl.busy for _, _, it in row)
    assert len(ax.patches) == n_items + n_pairs     # a pair is two half boxes
    assert ax.get_xlim() == (0, 26) and len(ax.get_yticks()) == 4
