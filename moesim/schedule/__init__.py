"""Schedules: the order in which each pipeline stage runs its micro-batches."""

from moesim.schedule.pipeline import (
    KINDS,
    PipelineRun,
    PipeOp,
    gpipe_order,
    inflight_microbatches,
    interleaved_order,
    make_order,
    one_f_one_b_order,
    simulate_pipeline,
)

__all__ = [
    "KINDS", "PipeOp", "PipelineRun", "gpipe_order", "one_f_one_b_order", "interleaved_order",
    "make_order", "simulate_pipeline", "inflight_microbatches",
]
