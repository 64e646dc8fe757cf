"""vLLM 0.9.0's V1 sampler over the full vocabulary in every rollout step, with NeMo RL
v0.3's sampling parameters (``rl.rollout.sampler: vllm-v1``).

moesim's serving step prices the sampler as one pass over each rank's vocabulary shard:
bf16 logits read, fp32 written (:func:`moesim.serve.costs.head_kernels`, 6 bytes a
logit). NeMo RL v0.3.0 (NVIDIA-NeMo/RL b1c86a816, pyproject.toml ``vllm==0.9.0``) samples
with ``temperature`` 1.0, ``top_p`` 1.0, ``top_k`` None (-1) and ``logprobs=0``
(nemo_rl/models/generation/vllm.py:415-431, examples/configs/grpo_math_1B.yaml), and
vLLM 0.9.0 (the wheel's vllm/ files, lines below) runs, per sampled token:

- the logits gathered whole on every TP rank (``use_all_gather`` under V1:
  platforms/interface.py:431-441, model_executor/layers/logits_processor.py:89-95), so
  each rank samples over the full vocabulary;
- sampler.py:34-36 ``compute_logprobs`` (logprobs requested): ``log_softmax`` of the bf16
  logits into fp32, 2 + 4 bytes a logit;
- :39 ``logits.to(torch.float32)``, 2 + 4; :108 ``apply_temperature`` ``div_``, 4 + 4
  (every request random at temperature 1.0);
- ops/topk_topp_sampler.py:92-97 (no top-k, no top-p): ``softmax`` fp32, 4 + 4;
  ``random_sample`` (:232-254): ``q.exponential_()`` 4, ``probs.div_(q)`` 4 + 4 + 4,
  ``argmax`` 4;
- sampler.py:135-179 ``gather_logprobs``: the sampled token's rank,
  ``(logprobs >= token_logprobs).sum(-1)``: 4 + 1 read back 1; ``topk`` with k = 0 and
  the gather are left out.

= 54 bytes a logit against the 6 moesim's serving step prices over ``ceil(vocab / tp)``:
the difference, one memory-bound op a step on the compute model (its HBM roofline), is
added to each decode step (``batch`` tokens) and prefill step (one token a prompt). The
logits' all-gather over TP and the host's pythonization of each token's logprob are left
out (no published per-item cost): a lower bound.
"""

from __future__ import annotations

from moesim.model.costs import memory_op
from moesim.rl.step_wrap import StepCostsWrapper

#: bytes per logit vLLM 0.9.0's V1 sampler moves with NeMo RL v0.3's parameters (above)
V1_BYTES_PER_LOGIT = 6 + 6 + 8 + 8 + 4 + 12 + 4 + 6
#: of which moesim's serving step prices over the rank's vocabulary shard (bf16 + fp32)
PRICED_BYTES_PER_LOGIT = 6


def extra_bytes(tokens: int, vocab: int, tp: int) -> float:
    """HBM bytes one rank's sampler moves beyond the serving step's for ``tokens``
    sampled tokens."""
    return float(tokens * (vocab * V1_BYTES_PER_LOGIT
                           - -(-vocab // tp) * PRICED_BYTES_PER_LOGIT))


class SamplerStepCosts(StepCostsWrapper):
    """A rollout engine's step costs (:class:`moesim.traffic.step_costs.StepCosts`
    ``inner``) with vLLM 0.9.0's V1 sampler added to each step: ``compute`` prices the
    extra bytes (``time_s(kernel)``), memoised by tokens."""

    def __init__(self, inner, compute, vocab: int, tp: int) -> None:
        self.inner, self.compute, self.vocab, self.tp = inner, compute, vocab, tp
        self.memo: dict[int, float] = {}

    def sampler_s(self, tokens: int) -> float:
        """Seconds the sampler adds to a step sampling ``tokens`` tokens."""
        if tokens <= 0:
            return 0.0
        if tokens not in self.memo:
            b = extra_bytes(tokens, self.vocab, self.tp)
            self.memo[tokens] = float(self.compute.time_s(
                memory_op("sampler_v1", b, 2.0 * tokens * self.vocab)))
        return self.memo[tokens]

    def extra_prefill_s(self, tokens: int, prompts: int) -> float:
        return self.sampler_s(prompts)

    def extra_decode_s(self, batch: int) -> float:
        return self.sampler_s(batch)
