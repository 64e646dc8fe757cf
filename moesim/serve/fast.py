"""A serving step on the fast engine's lockstep model (``engine.mode: fast``).

The step is the fast engine's public forward-only step
(:func:`moesim.engine.fast.forward.simulate_forward`) with the serving builder
(:class:`moesim.serve.program.ServeBuilder`: KV-cache reads for decode, the prompt's causal
attention for prefill, the LM head's distributed top-k over the TP group).
"""

from __future__ import annotations

from moesim.engine.fast.forward import simulate_forward
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve.mtp import with_draft
from moesim.serve.program import ServeBuilder
from moesim.trace.result import SimResult


def simulate_serve_fast(res, cfg: ServeConfig, *, progress=None, span_ranks: int = 64,
                        builders: list | None = None) -> tuple[SimResult, object]:
    """One serving step on the lockstep model; returns the result (training summary
    keys, the caller adds the serving ones) and the step plan. With ``serve.mtp`` the
    deployment runs the draft's decoder layer as its last (:mod:`moesim.serve.mtp`);
    ``builders`` gets the step's :class:`ServeBuilder`."""
    res = with_draft(res, cfg)
    sb = ServeBuilder(res, cfg)
    if builders is not None:      # the caller reads the step's builder (its timer)
        builders.append(sb)
    return simulate_forward(res, sb, progress=progress, span_ranks=span_ranks)
