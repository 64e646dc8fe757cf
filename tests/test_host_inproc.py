"""vLLM V1 with its engine core in the caller's process (``host_overhead: vllm-inproc``,
as NeMo RL runs it): scheduling and output processing both in series with the GPU."""

from __future__ import annotations

import pytest

from moesim.serve import host


def test_inproc_output_cost_is_what_async_output_processing_hid():
    # issue 6854: 13 ms of GPU bubble with all CPU work in series (its upper end);
    # issue 10634: 5.5 ms at batch 256 with the outputs beside the GPU: 7.5 ms / 256
    assert host.INPROC_OUTPUT_PER_REQUEST_S * 256 == pytest.approx(7.5e-3)
    assert host.INPROC_OUTPUT_PER_REQUEST_S == pytest.approx(29.296875e-6)


def test_inproc_puts_both_in_series_by_hand():
    """Batch 256, 10 ms of GPU: scheduling 5.5 ms + output processing 7.5 ms, both in
    series: the step is 23 ms, none of it overlapped; the same batch under ``vllm``
    (outputs beside the GPU, 0.287 ms) lasts 15.5 ms."""
    h = host.host_step("vllm-inproc", 256, 10e-3)
    assert (h.schedule_s, h.output_s) == pytest.approx((5.5e-3, 7.5e-3))
    assert h.serial_s == pytest.approx(13e-3) and h.overlapped_s == 0.0
    assert h.step_s == pytest.approx(23e-3)
    assert host.host_step("vllm", 256, 10e-3).step_s == pytest.approx(15.5e-3)


def test_inproc_keeps_its_own_output_cost_over_the_callers():
    """The keyword rate applies to the other engines; the in-process engine's output
    processing is its own (4 requests: 4 x 29.3 us)."""
    h = host.host_step("vllm-inproc", 4, 1e-3, output_per_request_s=1.0)
    assert h.output_s == pytest.approx(4 * host.INPROC_OUTPUT_PER_REQUEST_S)
    assert host.host_step("vllm", 4, 1e-3, output_per_request_s=1.0).output_s == 4.0
