"""Schedules: the order in which each pipeline stage runs its micro-batches.

GPipe, 1F1B and interleaved 1F1B (:mod:`moesim.schedule.pipeline`, what the engines
run today); DualPipe and DualPipeV (:mod:`moesim.schedule.dualpipe`, with the
reference's messages in :mod:`moesim.schedule.dualpipe_comm`); Megatron-Core's 1F1B
with all-to-all overlap (:mod:`moesim.schedule.a2a_overlap`); a stage-time evaluator
(:mod:`moesim.schedule.evaluate`). docs/schedules.md.
"""

from moesim.schedule.dualpipe import (
    DualOrder,
    Item,
    dualpipe_order,
    dualpipev_order,
    inflight_activations,
)
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
    "DualOrder", "Item", "dualpipe_order", "dualpipev_order", "inflight_activations",
]
