"""vLLM V1's fixed CPU time per engine step under the rollout engines
(``rl.rollout.step_fixed: vllm-v1``).

The rollout's step costs price the engine's CPU time per request
(``rl.rollout.host_overhead``, :mod:`moesim.serve.host`), anchored at batch 256, so a
decode step of a handful of sequences, which most of a GRPO generation's long tail is,
pays almost none of it. vLLM V1's engine step does work whatever its batch (scheduling,
the model runner's input preparation, the graphs' replay and the sampler's sync, the
outputs' update); :data:`moesim.serve.host.V1_STEP_FIXED_S` prices it from a published
small-batch TPOT (vllm-project/vllm PR 17866), and :func:`moesim.serve.host.fixed_extra_s`
moves that part of the scheduling side from per request to per step, keeping the batch-256
anchor. Every prefill and decode step of ``B`` requests (a prefill counts its prompts)
gains ``F x (1 - B / 256)``. Only engines whose scheduling runs in series with the GPU
(``host_overhead`` ``vllm`` or ``vllm-inproc``) take it: ``moesim rl`` refuses the knob
with another engine. ``benchmarks/vllm_small_batch.py`` prints the check against published
small-batch latencies.
"""

from __future__ import annotations

from moesim.rl.step_wrap import StepCostsWrapper
from moesim.serve.host import STEP_FIXED, fixed_extra_s


class StepFixedCosts(StepCostsWrapper):
    """A rollout engine's step costs (``inner``) with the engine's fixed CPU time per
    step added to each prefill and decode step (:func:`moesim.serve.host.fixed_extra_s`)."""

    def __init__(self, inner, name: str = "vllm-v1") -> None:
        if name not in STEP_FIXED:
            raise ValueError(f"step_fixed {name!r}: one of {sorted(STEP_FIXED)}")
        self.inner, self.name, self.fixed_s = inner, name, STEP_FIXED[name]

    def extra_prefill_s(self, tokens: int, prompts: int) -> float:
        return fixed_extra_s(prompts, self.fixed_s)

    def extra_decode_s(self, batch: int) -> float:
        return fixed_extra_s(batch, self.fixed_s)
