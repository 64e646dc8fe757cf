"""Streamed generation (moesim.rl.generate.stream, rl.generation: stream): a new prompt
group starts when a sequence slot frees, times by hand."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.rl.generate import generate, stream
from moesim.traffic.step_costs import LinearStepCosts

# a prefill step 0.5 s (gives a sample's first token), a decode step 1 s (one more token)
COSTS = LinearStepCosts(prefill_base_s=0.5, decode_base_s=1.0)
PROMPTS = [np.full(2, 4), np.full(2, 4)]
RESPONSES = [np.array([2, 6]), np.array([2, 6])]


def test_batch_waits_for_its_slowest_sample():
    # one replica, two slots: prefill both (0.5 s, token 1), five decode steps: the
    # 2-token sample is done at 1.5, the 6-token one at 5.5; two steps take 11 s
    g = generate(PROMPTS[0], RESPONSES[0], COSTS, replicas=1, kv_tokens=10_000, max_batch=2)
    assert g.time_s == pytest.approx(5.5)
    assert list(g.finish_s) == pytest.approx([1.5, 5.5])


def test_stream_starts_the_next_group_when_a_slot_frees():
    # step 0's short sample frees its slot at 1.5: step 1's short one is prefilled
    # (1.5-2.0) and decoded beside the long one (2.0-3.0, done); step 1's long one is
    # prefilled 3.0-3.5, then decodes 3.5-4.5, 4.5-5.5, 5.5-6.5 beside step 0's long one
    # and alone 6.5-7.5, 7.5-8.5. Step 0's long one: token 1 at 0.5, 2 at 1.5, waits the
    # two prefills, tokens 3-6 at 3.0, 4.5, 5.5, 6.5. Steps ready at 6.5 and 8.5: 8.5 s for
    # both against 11 s batched; step 1 adds 2.0 s.
    g = stream(PROMPTS, RESPONSES, COSTS, replicas=1, kv_tokens=10_000, max_batch=2)
    assert [x.time_s for x in g] == pytest.approx([6.5, 2.0])
    assert list(g[0].finish_s) == pytest.approx([1.5, 6.5])
    assert list(g[1].finish_s) == pytest.approx([3.0, 8.5])
    # the same with the engine stepping instead of skipping between events
    g2 = stream(PROMPTS, RESPONSES, COSTS, replicas=1, kv_tokens=10_000, max_batch=2,
                skip=False)
    assert [x.time_s for x in g2] == pytest.approx([6.5, 2.0])


def test_one_step_stream_is_the_batch():
    g = stream(PROMPTS[:1], RESPONSES[:1], COSTS, replicas=1, kv_tokens=10_000, max_batch=2)
    b = generate(PROMPTS[0], RESPONSES[0], COSTS, replicas=1, kv_tokens=10_000, max_batch=2)
    assert g[0].time_s == pytest.approx(b.time_s)
    assert list(g[0].finish_s) == pytest.approx(list(b.finish_s))


def test_stream_waits_for_the_version_it_may_use():
    # three steps, max_lag 1, trainer 10 s per step, sync 1 s: step 2 needs version 1,
    # published at ready[0] + 10 + 1 = 6.5 + 11 = 17.5 (the stream of steps 0 and 1 as
    # above, idle after 8.5); step 2 then runs alone: prefill 17.5-18.0, short sample done
    # at 19.0, long at 23.0. Step 2 adds 23.0 - 8.5 = 14.5 s.
    g = stream(PROMPTS + PROMPTS[:1], RESPONSES + RESPONSES[:1], COSTS, replicas=1,
               kv_tokens=10_000, max_batch=2, max_lag=1, trainer_s=[10.0] * 3, sync_s=1.0)
    assert [x.time_s for x in g[:2]] == pytest.approx([6.5, 2.0])
    assert list(g[2].finish_s) == pytest.approx([19.0, 23.0])
    assert g[2].time_s == pytest.approx(14.5)


# one sample a step, one slot: prefill 0.5 s (token 1) and two decode steps (tokens 2, 3)
ONE_P = [np.full(1, 4)] * 3
ONE_R = [np.array([3])] * 3


def _one(partial):
    return stream(ONE_P, ONE_R, COSTS, replicas=1, kv_tokens=10_000, max_batch=1,
                  max_lag=1, trainer_s=[1.0] * 3, sync_s=1.0, partial=partial)


def test_stream_without_partial_rollouts_never_stops():
    # back to back: 0-2.5, 2.5-5.0, and step 2 (version 1 published at 2.5 + 1 + 1 = 4.5)
    # when the slot frees at 5.0
    g = _one(None)
    assert [x.finish_s[0] for x in g] == pytest.approx([2.5, 5.0, 7.5])
    assert [x.paused_s for x in g] == [0.0, 0.0, 0.0]


def test_stream_pauses_for_in_flight_weight_updates_keeping_kv():
    # version 1's sync is due when the trainer has trained step 0: 2.5 + 1 = 3.5, in step
    # 1's decode step 3.0-4.0, which finishes: the engines stop 4.0-5.0 and step 1's last
    # decode step runs 5.0-6.0. Version 1 is published at 5.0; step 2 (max_lag 1) waits
    # for the slot: prefill 6.0-6.5, decode 6.5-7.5; version 2's sync is due at
    # max(6.0, 5.0) + 1 = 7.0, the step in flight ends 7.5, stop 7.5-8.5, last decode
    # 8.5-9.5
    g = _one("keep")
    assert [x.finish_s[0] for x in g] == pytest.approx([2.5, 6.0, 9.5])
    assert [x.time_s for x in g] == pytest.approx([2.5, 3.5, 3.5])
    assert [x.paused_s for x in g] == pytest.approx([0.0, 1.0, 1.0])


def test_stream_pauses_for_in_flight_weight_updates_recomputing_kv():
    # the sync at 3.5 drops step 1's decode step in flight (token 1 kept); after the sync
    # (3.5-4.5) its prefill of prompt + 1 token gives token 2 (4.5-5.0), a decode step
    # token 3 (5.0-6.0). Version 1 at 4.5; step 2 from 6.0: token 1 at 6.5, the sync due
    # at 7.0 drops the decode step 6.5-7.5; 7.0-8.0 sync, prefill 8.0-8.5, decode 8.5-9.5
    g = _one("recompute")
    assert [x.finish_s[0] for x in g] == pytest.approx([2.5, 6.0, 9.5])
    assert [x.paused_s for x in g] == pytest.approx([0.0, 1.0, 1.0])
