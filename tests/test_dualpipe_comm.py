"""DualPipe(V) pipeline messages as the reference queues and issues them
(deepseek-ai/DualPipe dualpipe/dualpipe.py: _recv_*/_send_* then
_commit_and_wait_comm) and the stage-time run that honours them."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction as Fr

import pytest

from moesim.schedule.dualpipe import dualpipe_order, dualpipev_order
from moesim.schedule.dualpipe_comm import reference_program, run_reference
from moesim.schedule.evaluate import Durations, evaluate


def _ev(e) -> str:
    if e[0] == "compute":
        return f"[{e[1]}]"
    if e[0] == "wait":
        return "w"
    m = e[1]
    return f"{e[0][0]}{m.what[0]}{m.mb}.{m.stage}{'>' if e[0] == 'send' else '<'}" \
           f"{m.dst if e[0] == 'send' else m.src}"


def test_rank0_program_by_hand():
    # P=4, N=8, rank 0 (h=0). Step 1: F0 has no receive (first stage); its send is
    # queued and leaves at the next commit. Step 2 queues F4.3's input; step 3's W4.3
    # waits on the queued input of F5.3; stage 3 is the last stage of micro-batches 4..7
    # (no activation send) and stage 0 the first of 0..3 (no gradient send).
    got = " ".join(map(_ev, reference_program(dualpipe_order(4, 8), 0)))
    assert got == (
        "w [F0.0] sa0.1>1 w [F1.0] sa1.1>1 w [F2.0] ra4.3<1 w [F4.3] sa2.1>1 "
        "w [B4.3] sg4.2>1 ra5.3<1 w [W4.3] w [F5.3] "
        "w [F3.0&B5.3] sa3.1>1 sg5.2>1 ra6.3<1 rg0.0<1 w [F6.3&B0.0] "
        "w [BW6.3] sg6.2>1 ra7.3<1 rg1.0<1 w [F7.3&B1.0] "
        "w [BW7.3] sg7.2>1 rg2.0<1 w [B2.0] w [W2.0] rg3.0<1 w [B3.0] w [W3.0] w")


@pytest.mark.parametrize("make, ranks, n", [
    (dualpipe_order, 2, 4), (dualpipe_order, 4, 8), (dualpipe_order, 8, 20),
    (dualpipev_order, 1, 2), (dualpipev_order, 3, 7), (dualpipev_order, 4, 10)])
def test_every_message_queued_once_on_both_sides(make, ranks, n):
    o = make(ranks, n)
    progs = [reference_program(o, r) for r in range(ranks)]
    sent = Counter(e[1] for p in progs for e in p if e[0] == "send")
    got = Counter(e[1] for p in progs for e in p if e[0] == "recv")
    assert sent == got and set(sent.values()) <= {1}
    assert len(sent) == 2 * n * (o.stages - 1 - (make is dualpipev_order))
    for r, p in enumerate(progs):   # the compute items are the order's, in order
        assert tuple(e[1] for e in p if e[0] == "compute") == o.items[r]
        assert all(e[1].src == r for e in p if e[0] == "send")


@pytest.mark.parametrize("make, ranks, n", [
    (dualpipe_order, 4, 8), (dualpipe_order, 6, 12), (dualpipe_order, 8, 20),
    (dualpipev_order, 2, 4), (dualpipev_order, 4, 10)])
@pytest.mark.parametrize("fb", [Fr(2), Fr(5, 2), Fr(3)])
def test_reference_waits_cost_nothing_with_zero_bubble_chunks(make, ranks, n, fb):
    # F = B-W = W: the reference's queued receives and deferred sends never delay a
    # chunk beyond its data dependencies, so the README's bubble holds for it too
    t = Durations(F=1, B=2, W=1, FB=fb)
    want = evaluate(make(ranks, n), 0, t).step
    assert run_reference(make(ranks, n), t).step == want
    assert run_reference(make(ranks, n), t, eager_sends=True).step == want


def test_deferred_send_costs_time_by_hand():
    # DualPipeV, 2 ranks, N=4, every chunk 1 (so an input-gradient B takes 0). Rank 1
    # (the last) does not send F1.2's output in step 2; it queues it in step 4 after F2.1
    # and it leaves at the commit before BW0.2, t=6. Rank 0 queued that input before its
    # W0.3 (step 3), so W0.3 waits from 4 to 6 where the data dependencies alone run it
    # at 4-5 and F1.3 at 5-6. The step grows from 14 to 15.
    o, t = dualpipev_order(2, 4), Durations(F=1, B=1, W=1, FB=1)
    dep, ref = evaluate(o, 0, t), run_reference(o, t, eager_sends=True)
    w = {str(it): (s, e) for s, e, it in dep.busy[0]}
    v = {str(it): (s, e) for s, e, it in ref.busy[0]}
    assert w["W0.3"] == (4, 5) and w["F1.3"] == (5, 6) and dep.step == 14
    assert v["W0.3"] == (6, 7) and v["F1.3"] == (7, 8) and ref.step == 15


def test_run_reference_never_beats_the_dependencies():
    # more constraints never shorten the step; eager sends never lengthen it
    for t in (Durations(5, 3, 3, 25), Durations(4, 3, 3, 1), Durations(8, 6, 5, 26),
              Durations(6, 2, 0, 1)):
        for o in (dualpipe_order(4, 16), dualpipev_order(4, 22), dualpipe_order(8, 22)):
            a = evaluate(o, 0, t).step
            b, c = run_reference(o, t).step, run_reference(o, t, eager_sends=True).step
            assert b >= c >= a
