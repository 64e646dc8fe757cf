"""vLLM's Ray executor under the rollout engines (``rl.rollout.executor: ray``).

NeMo RL v0.3.0 (NVIDIA-NeMo/RL b1c86a816) builds every vLLM engine of more than one GPU
(tensor or pipeline parallel) with ``distributed_executor_backend="ray"`` and one-GPU
engines with none (the in-process executor): nemo_rl/models/generation/vllm.py,
``VllmGenerationWorker.__init__``, ``model_parallel_size > 1``. vLLM 0.9.0's V1 Ray
executor runs each engine step through a Ray Compiled Graph: the scheduler's output goes
to every worker and the step waits for the result
(vllm/v1/executor/ray_distributed_executor.py ``execute_model``:
``self.forward_dag.execute(scheduler_output)``, then ``refs[0].get()`` without pipeline
parallelism), in series with the engine core's step.

Priced as a fixed time per engine step, :data:`RAY_STEP_S`, from the measurement that
introduced the executor (vllm-project/vllm PR 11107, "[V1] TP Ray executor",
``benchmarks/benchmark_latency.py``, Llama-3.1-8B-Instruct, TP2 on L4 GPUs, batch 8, 128
prompt and 256 output tokens, 20 iterations): 9.42692 s a batch with Ray against 9.35681 s
with vLLM's multiprocessing executor, 70.1 ms over the batch's 256 engine steps (one
prefill, 255 decodes). moesim's step is the engine's work with no executor at all, so
the multiprocessing executor's own message queue is left out: a lower bound. The
measurement is at batch 8; how the scheduler output's serialisation grows with the batch
is not published, so the price does not grow with it.
"""

from __future__ import annotations

from moesim.rl.step_wrap import StepCostsWrapper

#: seconds per engine step that vLLM V1's Ray Compiled Graph executor adds over the
#: multiprocessing executor: vllm-project/vllm PR 11107's benchmark_latency runs (module
#: docstring), (9.42691584636923 - 9.356813629437237) s over 256 steps
RAY_STEP_S = (9.42691584636923 - 9.356813629437237) / 256

#: ``rl.rollout.executor`` -> seconds added to each engine step
EXECUTORS = {"none": 0.0, "ray": RAY_STEP_S}


class ExecutorStepCosts(StepCostsWrapper):
    """A rollout engine's step costs (:class:`moesim.traffic.step_costs.StepCosts`
    ``inner``) with the executor's time added to every prefill and decode step."""

    def __init__(self, inner, name: str = "ray") -> None:
        if name not in EXECUTORS:
            raise ValueError(f"executor {name!r}: one of {sorted(EXECUTORS)}")
        self.inner, self.name, self.step_s = inner, name, EXECUTORS[name]

    def extra_prefill_s(self, tokens: int, prompts: int) -> float:
        return self.step_s

    def extra_decode_s(self, batch: int) -> float:
        return self.step_s
