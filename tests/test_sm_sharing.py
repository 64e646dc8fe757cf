"""Compute shares the GPU's SMs with communication kernels (exact engine executor).

Hand cases on one link of 100 GB/s between g0 and g1, no latency: a send of 1 GB takes
10 ms. A device of S = 100 SMs; the send's kernel holds s of them from issue to delivery.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from moesim.collectives.communicator import Communicator
from moesim.engine.exact.execute import Executor
from moesim.network import FlowNetwork
from moesim.program.ops import Op
from moesim.units import GB


class OneLink:
    capacity_Bps = np.full(2, 100 * GB)
    latency_s = np.zeros(2)
    link_names = ["g0->g1", "g1->g0"]
    link_kinds = ["nvlink"] * 2

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        return (0,) if (src, dst) == ("g0", "g1") else (1,)


def run(programs, sm_total: int = 100) -> list:
    env = simpy.Environment()
    net = FlowNetwork(env, OneLink())
    gpus = ["g0", "g1"]
    comm = Communicator(env, net, gpus, rank_host=[0, 0])
    ex = Executor(env, net, comm, gpus, programs, sm_total=sm_total)
    ex.run()
    return ex.spans


def send(sms: int, deps=()) -> Op:
    return Op(stream="pp", kind="pp", name="send", send_to=1, key=("m",), nbytes=1 * GB,
              sms=sms, deps=deps)


RECV = [Op(stream="compute", kind="pp", name="recv", recv_from=0, key=("m",))]


def compute_span(spans):
    return next(s for s in spans if s.kind == "compute" and s.rank == 0)


@pytest.mark.parametrize("s", [20, 50, 60])
def test_fully_overlapped_compute_takes_S_over_S_minus_s(s):
    # compute of 4 ms at full rate starts with the 10 ms send: it runs wholly under the
    # kernel (4 ms · 100/(100 - s) <= 10 ms for s <= 60), at (100 - s)/100 of its rate
    prog0 = [send(s), Op(stream="compute", kind="compute", name="c", duration_s=0.004)]
    c = compute_span(run([prog0, RECV]))
    assert c.start_s == 0.0
    assert c.end_s == pytest.approx(0.004 * 100 / (100 - s), rel=1e-12)


def test_partly_overlapped_compute_speeds_up_when_the_kernel_ends():
    # s = 50: 20 ms of work; for the send's 10 ms it does 5 ms of work, then 15 ms at
    # full rate: ends at 25 ms
    prog0 = [send(50), Op(stream="compute", kind="compute", name="c", duration_s=0.020)]
    c = compute_span(run([prog0, RECV]))
    assert c.end_s == pytest.approx(0.025, rel=1e-12)


def test_kernel_starting_mid_compute_slows_the_rest():
    # the send waits on op 0 (4 ms of compute); op 2 (10 ms) follows op 0 on the compute
    # stream, so both start at 4 ms
    prog0 = [Op(stream="compute", kind="compute", name="a", duration_s=0.004),
             send(50, deps=(0,)),
             Op(stream="compute", kind="compute", name="c", duration_s=0.010)]
    spans = run([prog0, RECV])
    c = next(s for s in spans if s.name == "c")
    # c runs 4..?: the send holds 50 SMs from 4 ms to 14 ms; c's 10 ms of work at half
    # rate needs 20 ms, more than the send's 10: 5 ms done by 14 ms, 5 ms more at full rate
    assert c.start_s == pytest.approx(0.004, rel=1e-12)
    assert c.end_s == pytest.approx(0.019, rel=1e-12)


def test_nothing_overlapping_means_no_slowdown():
    # the send holds SMs, but the compute op runs only after it: exactly its duration
    prog0 = [send(50), Op(stream="compute", kind="compute", name="c", duration_s=0.004,
                          deps=(0,))]
    c = compute_span(run([prog0, RECV]))
    assert c.start_s == pytest.approx(0.010, rel=1e-12)
    assert c.end_s - c.start_s == pytest.approx(0.004, rel=1e-12)


def test_kernels_holding_no_sms_leave_compute_alone():
    prog0 = [send(0), Op(stream="compute", kind="compute", name="c", duration_s=0.004)]
    c = compute_span(run([prog0, RECV]))
    assert c.end_s == 0.004


def test_a_device_without_sm_count_is_not_shared():
    prog0 = [send(50), Op(stream="compute", kind="compute", name="c", duration_s=0.004)]
    c = compute_span(run([prog0, RECV], sm_total=0))
    assert c.end_s == 0.004
