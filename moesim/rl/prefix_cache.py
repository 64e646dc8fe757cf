"""vLLM's automatic prefix caching over a GRPO group's shared prompt, with the step's
samples dealt to the engines in contiguous shards (``rl.rollout.prefix_cache: vllm``).

NeMo RL v0.3.0 (NVIDIA-NeMo/RL b1c86a816):

- builds every vLLM engine with ``enable_prefix_caching`` on GPUs of compute capability
  8 and above (nemo_rl/models/generation/vllm.py, ``VllmGenerationWorker.__init__``:
  ``torch.cuda.get_device_capability()[0] >= 8``);
- repeats each prompt for its group (``repeat_interleave(num_generations_per_prompt)``,
  nemo_rl/algorithms/grpo.py), so a group's samples are consecutive, and
  ``VllmGeneration.generate`` deals the step's samples in contiguous shards, one per
  engine, of ``ceil(n / engines)`` samples (``shard_by_batch_size(dp_size,
  allow_uneven_shards=True)``, nemo_rl/distributed/batched_data_dict.py): an engine holds
  whole groups, in order.

vLLM 0.9.0's V1 KV-cache manager caches a request's full blocks when it allocates them
(vllm/v1/core/kv_cache_manager.py ``allocate_slots``: ``cache_blocks(...,
num_computed_tokens + num_new_tokens)``), so a later request of the same prompt, in the
same step or after, finds them (``get_computed_blocks``) and prefills only the rest: at
most ``prompt - 1`` tokens hit ("we must recompute the last token to obtain logits"), in
whole blocks of :data:`BLOCK` tokens (vLLM's default ``block_size`` on CUDA). The blocks
are shared, so the later request holds only its own tokens in the KV cache; its decode
steps still read the whole prompt.

Here: each member (engine replica's attention rank) gets its contiguous shard of the
samples, in order (:func:`submit_order`: the round-robin router's order that deals
them so); a sample whose group already has a sample on its member prefills ``prompt -
hit`` tokens with ``hit = (prompt - 1) // BLOCK * BLOCK``. Left out: a prompt
cached from an earlier RL step (NeMo RL resets the prefix cache when the engine sleeps,
vllm.py ``sleep``), and hits after a preemption (its recompute prefills everything).
"""

from __future__ import annotations

import numpy as np

from moesim.rl.step_wrap import StepCostsWrapper

#: tokens per KV block: vLLM's default ``block_size`` on CUDA (CacheConfig, 16)
BLOCK = 16


def hit(prompt: int, block: int = BLOCK) -> int:
    """Prompt tokens a request finds cached when an earlier request of the same prompt
    holds its blocks: whole blocks of at most ``prompt - 1`` tokens."""
    return max(int(prompt) - 1, 0) // block * block


def shards(n: int, ways: int) -> list[range]:
    """NeMo RL's contiguous shards of ``n`` samples over ``ways`` engines:
    ``ceil(n / ways)`` each, the last ones shorter (``shard_by_batch_size``)."""
    size = -(-n // ways) if ways else n
    return [range(min(k * size, n), min((k + 1) * size, n)) for k in range(ways)]


def submit_order(n: int, ways: int) -> list[int]:
    """Sample indices in the order a round-robin router over ``ways`` members deals
    them: position ``p`` goes to member ``p % ways``, so the ``k``-th contiguous shard's
    ``i``-th sample sits at ``i * ways + k``. Exact when the shards are even; otherwise
    the last round's samples fill the round from its first member."""
    parts = shards(n, ways)
    order: list[int] = []
    for i in range(max((len(p) for p in parts), default=0)):
        for p in parts:
            if i < len(p):
                order.append(p[i])
    return order


def prefill_tokens(prompt, group: int, order: list[int], ways: int) -> np.ndarray:
    """Per sample, the prompt tokens it prefills when groups of ``group`` consecutive
    samples share a prompt and the samples are dealt in ``order`` round robin over
    ``ways`` members: the first sample of a group on a member prefills its whole prompt,
    a later one ``prompt - hit``."""
    prompt = np.asarray(prompt, dtype=np.int64)
    out = prompt.copy()
    seen: set[tuple[int, int]] = set()
    for pos, i in enumerate(order):
        key = (pos % ways, i // group)
        if key in seen:
            out[i] = prompt[i] - hit(int(prompt[i]))
        seen.add(key)
    return out


class PrefixCacheCosts(StepCostsWrapper):
    """A rollout engine's step costs (``inner``) that also say the step's samples share
    their group's prompt (``prefix_group`` consecutive samples) and are dealt in
    contiguous shards: :class:`moesim.rl.generate.Rollout` reads it. Steps are
    ``inner``'s."""

    def __init__(self, inner, group: int) -> None:
        if group < 1:
            raise ValueError(f"prefix_cache group {group}: at least 1")
        self.inner, self.prefix_group = inner, int(group)
