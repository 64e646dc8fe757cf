"""Issue 20 item 10: the fast engine names a stall's cause as the exact engine does.

A wait at an all-to-all that follows the expert computation of its (layer,
micro-batch, phase) (``fwd.combine``, ``bwd.dispatch``) is on the late rank's experts:
"rank B still computing hot expert E (T tokens)"; any other wait is "rank B arrived
late at OP" (no expert). Both engines, same scenario: the same text per stall."""

from __future__ import annotations

from moesim.engine.exact.engine import simulate_exact
from moesim.engine.fast.engine import simulate_fast
from moesim.trace.spans import wait_reason
from moesim.wiring import resolve_path
from tests._util import two_gpu_scenario


def _stalls(result) -> dict[tuple, tuple]:
    return {(s.rank, s.name, s.layer, s.microbatch, s.phase, s.stream):
            (s.waited_on, s.expert, s.tokens, s.reason)
            for s in result.spans if s.kind == "stall" and "." in s.name
            and s.name.split(".")[1] in ("dispatch", "combine")}


def test_wait_reason_text():
    assert wait_reason(5, "bwd.dispatch", 5, 39081) == \
        "rank 5 still computing hot expert 5 (39081 tokens)"
    assert wait_reason(7, "fwd.dispatch") == "rank 7 arrived late at fwd.dispatch"


def test_two_ranks_fast_names_the_hot_expert_like_exact(tmp_path):
    """Rank 0 holds hot expert 0 (45 % of the assignments): rank 1 waits for it at the
    forward combine, by hand the only wait of the forward."""
    res = resolve_path(two_gpu_scenario(tmp_path))
    fast, exact = _stalls(simulate_fast(res)), _stalls(simulate_exact(res))
    key = (1, "fwd.combine", 0, 0, "fwd", "compute")
    assert fast[key][:3] == exact[key][:3]
    assert fast[key][3] == exact[key][3] == \
        f"rank 0 still computing hot expert 0 ({exact[key][2]} tokens)"
    assert fast == exact


def test_hot_expert_scenario_fast_and_exact_name_the_same_causes():
    res = resolve_path("hot-expert", ["model.layers=1"])
    fast, exact = _stalls(simulate_fast(res)), _stalls(simulate_exact(res))
    common = [k for k in exact if k in fast and fast[k][0] == exact[k][0]]
    assert len(common) >= len(exact) // 2 > 0
    hot = [k for k in common if "still computing hot expert 3" in exact[k][3]]
    assert hot, "the hot-expert scenario's exact engine names expert 3"
    for k in common:
        assert fast[k][1:] == exact[k][1:], k
    assert not any("partner" in v[3] for v in fast.values())
