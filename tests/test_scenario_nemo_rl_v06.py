"""NeMo RL v0.6's Qwen3-30B-A3B performance recipes as scenarios: the packed rows the
recipes ask for (train_mb_tokens = 4,096 x train_micro_batch_size, logprob_mb_tokens =
4,096 x logprob_batch_size) and the GB200 recipe's layout, worked out by hand."""

from __future__ import annotations

import pytest

from moesim.rl.run import resolve_rl


@pytest.mark.parametrize("name", ["grpo-qwen3-30b-a3b-nemo-rl",
                                  "grpo-qwen3-30b-a3b-nemo-rl-async"])
def test_h100_recipes_pack_log_prob_rows_of_four_samples(name):
    # grpo-qwen3-30ba3b-4n8g.yaml: logprob_batch_size 4 -> 4,096 x 4 = 16,384 tokens a row
    tr = resolve_rl(name).cfg.train
    assert (tr.seq_len, tr.logprob_mb_tokens, tr.packed_attention) == (4096, 16384,
                                                                       "per_sequence")


def test_gb200_recipe_layout():
    """grpo-qwen3-30ba3b-4n4g.yaml: 16 GPUs, Megatron EP16 (TP1 PP1: data parallel 16),
    vLLM TP1 (16 one-GPU engines, no Ray executor, so vLLM's asynchronous scheduling),
    logprob_batch_size 2 -> rows of 8,192 tokens."""
    setup = resolve_rl("grpo-qwen3-30b-a3b-nemo-rl-gb200")
    cfg = setup.cfg
    assert (setup.scenario.cluster.topology, setup.scenario.cluster.device) == (
        "gb200-nvl72", "GB200")
    tr, ro = cfg.train, cfg.rollout
    assert (tr.gpus, tr.tp, tr.pp, tr.ep, tr.dp, tr.zero) == (16, 1, 1, 16, 16, 1)
    assert (tr.seq_len, tr.logprob_mb_tokens, tr.mini_batches) == (4096, 8192, 4)
    assert (ro.gpus, ro.tp, ro.ep, ro.executor, ro.host_overhead, ro.step_fixed) == (
        16, 1, 1, "none", "vllm-async", "none")
    assert cfg.colocated and cfg.prompts_per_step * cfg.samples_per_prompt == 2048
