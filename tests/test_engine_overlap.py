"""EP all-to-all overlap (interleaving two schedule items) never deadlocks a pipeline.

Interleaving items x then y puts y's pipeline receive before x's pipeline send; on
some schedules the neighbour stage needs x's message before it sends y's, and the
two stages would wait for each other. These cases used to deadlock; each must now
finish with the same work as without overlap.
"""

from __future__ import annotations

import pytest

from moesim.wiring import simulate

CASES = [("gpipe", 2, 3, 1), ("gpipe", 3, 5, 1), ("1f1b", 4, 3, 1), ("1f1b", 3, 4, 1),
         ("1f1b", 4, 9, 1), ("interleaved", 2, 4, 2)]


@pytest.mark.parametrize("kind,pp,m,v", CASES)
def test_overlap_pairs_never_deadlock(kind, pp, m, v):
    over = [f"cluster.nodes={pp}", f"parallel.pp={pp}", f"parallel.vpp={v}",
            f"schedule.kind={kind}", f"schedule.microbatches={m}", f"model.layers={pp * v}",
            "schedule.seq_len=256", "cluster.network=analytical", "engine.mode=exact"]
    plain = simulate("mixtral-8x7b-64gpu", over, record_series=False)
    over_r = simulate("mixtral-8x7b-64gpu", over + ["overlap.ep_comm_overlap=true"],
                      record_series=False)
    # same work: every compute span and every byte is there
    work = lambda r: sorted((s.rank, s.name, s.microbatch, s.layer, s.dur_s)  # noqa: E731
                            for s in r.spans if s.kind == "compute")
    a, b = work(over_r), work(plain)
    assert [w[:4] for w in a] == [w[:4] for w in b]
    assert [w[4] for w in a] == pytest.approx([w[4] for w in b], rel=1e-9)
    sent = lambda r: sum(s.bytes for s in r.spans if s.kind.startswith("ep_"))  # noqa: E731
    assert sent(over_r) == pytest.approx(sent(plain), rel=1e-12)
    assert all(s.stream == "ep" for s in over_r.spans if s.kind.startswith("ep_"))
    # something was actually interleaved: some rank computes another micro-batch between
    # a dispatch and the experts of the same micro-batch
    inter = False
    for rank in range(over_r.n_ranks):
        comp = [s for s in over_r.spans if s.rank == rank and s.kind == "compute"]
        comp.sort(key=lambda s: s.start_s)
        names = [(s.name, s.microbatch) for s in comp]
        for i in range(1, len(names) - 1):
            if names[i][0].endswith("experts") and names[i - 1][1] != names[i][1]:
                inter = True
                break
    assert inter
