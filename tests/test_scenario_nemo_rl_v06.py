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


def test_deepseek_v3_recipe_layout():
    """grpo-deepseek-v3-32n8g.yaml: 256 GPUs, Megatron TP1 PP16 EP16 (data parallel
    256 / 16 = 16), 3 layers on the first stage and 2 on the last (61 = 3 + 14 x 4 + 2),
    full recompute; one optimizer step of 512 samples; vLLM TP32: 8 engines."""
    from moesim.rl.engine_costs import trainer_scenario_of

    setup = resolve_rl("grpo-deepseek-v3-nemo-rl")
    tr, ro = setup.cfg.train, setup.cfg.rollout
    assert (tr.gpus, tr.tp, tr.pp, tr.ep, tr.dp, tr.zero) == (256, 1, 16, 16, 16, 1)
    assert (tr.seq_len, tr.logprob_mb_tokens, tr.mini_batches) == (1536, 1536, 1)
    assert (ro.gpus // ro.tp, ro.tp, ro.executor, ro.host_overhead) == (8, 32, "ray", "vllm")
    trainer = trainer_scenario_of(setup)
    par = trainer.parallel
    assert (par.decoder_first_pipeline_num_layers, par.decoder_last_pipeline_num_layers) == (3, 2)
    assert trainer.memory.recompute == "full"
    from moesim.schedule.layout_string import stage_chunks
    assert [len(c) for c in stage_chunks(trainer, setup.res.model, 16)] == [3] + [4] * 14 + [2]
    assert setup.cfg.prompts_per_step * setup.cfg.samples_per_prompt == 512


def test_qwen3_235b_recipe_layout():
    """grpo-qwen3-235b-16n8g.yaml: 128 GPUs, Megatron TP2 (sequence parallel) CP2 PP8 EP16
    (data parallel 128 / 32 = 4), 11 layers on each end stage (94 = 11 + 6 x 12 + 11),
    full recompute; one optimizer step of 512 samples; vLLM TP16: 8 engines."""
    from moesim.rl.engine_costs import trainer_scenario_of
    from moesim.schedule.layout_string import stage_chunks

    setup = resolve_rl("grpo-qwen3-235b-nemo-rl")
    tr, ro = setup.cfg.train, setup.cfg.rollout
    assert (tr.gpus, tr.tp, tr.cp, tr.pp, tr.ep, tr.dp) == (128, 2, 2, 8, 16, 4)
    assert (tr.seq_len, tr.logprob_mb_tokens, tr.mini_batches) == (8192, 8192, 1)
    assert (ro.gpus // ro.tp, ro.tp) == (8, 16)
    trainer = trainer_scenario_of(setup)
    assert trainer.parallel.sequence_parallel and trainer.memory.recompute == "full"
    assert [len(c) for c in stage_chunks(trainer, setup.res.model, 8)] == [11] + [12] * 6 + [11]


def test_qwen3_235b_one_step_off_recipe():
    """grpo-qwen3-235b-32n8g-async-1off.yaml over the 16-node recipe: 256 GPUs, 128 of them
    training (TP4 with sequence parallelism, CP1, PP8, EP16: data parallel 128 / 32 = 4;
    the end stages' 11 layers) and 128 generating (16 engines of TP8,
    gpu_memory_utilization 0.8), one step off with in-flight weight updates that keep the
    KV caches; NeMo RL's chunked NCCL refit."""
    from moesim.rl.engine_costs import trainer_scenario_of
    from moesim.schedule.layout_string import stage_chunks

    setup = resolve_rl("grpo-qwen3-235b-nemo-rl-async")
    cfg = setup.cfg
    tr, ro, ws = cfg.train, cfg.rollout, cfg.weight_sync
    assert not cfg.colocated and (cfg.max_lag, cfg.partial_rollouts, cfg.kv_after_sync) == (
        1, True, "keep")
    assert (tr.gpus, tr.tp, tr.cp, tr.pp, tr.ep, tr.dp) == (128, 4, 1, 8, 16, 4)
    assert (ro.gpus, ro.gpus // ro.tp, ro.tp, ro.kv_fraction) == (128, 16, 8, 0.8)
    assert (ws.method, ws.per_gpu, ws.calls) == ("nccl", True, "nemo-async")
    trainer = trainer_scenario_of(setup)
    assert trainer.parallel.sequence_parallel and trainer.memory.recompute == "full"
    assert [len(c) for c in stage_chunks(trainer, setup.res.model, 8)] == [11] + [12] * 6 + [11]


def test_qwen3_30b_eight_steps_off_recipe():
    """grpo-qwen3-30ba3b-24n8g-async-8off.yaml over the 4-node recipe: 192 GPUs, 128 of them
    training (TP1 PP1 EP8: data parallel 128) and 64 generating (32 engines of TP2), at
    most 8 versions behind, generation streamed as the asynchronous collector runs it,
    paused by the in-flight weight updates; a steady state needs 2 x 8 + 1 steps, and the
    scenario simulates 40 (24 steady steps: a streamed step's time varies several-fold)."""
    from moesim.rl.summary import steps_for_steady_state

    cfg = resolve_rl("grpo-qwen3-30b-a3b-nemo-rl-async-8off").cfg
    tr, ro = cfg.train, cfg.rollout
    assert not cfg.colocated and (cfg.max_lag, cfg.generation) == (8, "stream")
    # in_flight_weight_updates with the KV caches kept: the stream's engines pause
    assert (cfg.partial_rollouts, cfg.kv_after_sync) == (True, "keep")
    assert (tr.gpus, tr.tp, tr.pp, tr.ep, tr.dp) == (128, 1, 1, 8, 128)
    assert (ro.gpus, ro.gpus // ro.tp, ro.tp) == (64, 32, 2)
    assert steps_for_steady_state(8) == 17 and cfg.steps - 2 * 8 == 24


def test_deepseek_v3_one_step_off_recipe():
    """grpo-deepseek-v3-64n8g-async-1off.yaml over the 32-node recipe: 512 GPUs, 256 of
    them training (PP16 EP16: data parallel 16) and 256 generating (8 engines of TP32),
    one step off with in-flight weight updates that keep the KV caches; logprob_batch_size
    2: log-prob rows of 2 x 1,536 tokens; NeMo RL's chunked NCCL refit."""
    setup = resolve_rl("grpo-deepseek-v3-nemo-rl-async")
    cfg = setup.cfg
    tr, ro, ws = cfg.train, cfg.rollout, cfg.weight_sync
    assert not cfg.colocated and (cfg.max_lag, cfg.partial_rollouts, cfg.kv_after_sync) == (
        1, True, "keep")
    assert (tr.gpus, tr.pp, tr.ep, tr.dp, tr.logprob_mb_tokens) == (256, 16, 16, 16, 3072)
    assert (ro.gpus, ro.gpus // ro.tp, ro.kv_fraction) == (256, 8, 0.8)
    assert (ws.method, ws.per_gpu, ws.calls) == ("nccl", True, "nemo-async")


@pytest.mark.parametrize("name", ["grpo-qwen3-30b-a3b-nemo-rl", "grpo-qwen3-235b-nemo-rl",
                                  "grpo-deepseek-v3-nemo-rl"])
def test_h100_colocated_recipes_copy_the_optimizer_into_pageable_memory(name):
    """NeMo RL v0.6.0's colocated refit copies each optimizer-state tensor out with
    ``v.to("cpu")`` (megatron_policy_worker.py move_optimizer) and wakes vLLM with every
    GPU of the host at once: the optimizer states out at 2.8 GB/s, vLLM's sleep and the
    weights out at 0.3133 of the 64 GB/s link, the wake-up at 0.3415 of it; the refit's
    host moves are exactly those three copies."""
    from moesim.rl.offload import PAGEABLE_D2H_Bps, setup_moves
    from moesim.rl.offload_pinned import sleep_Bps
    from moesim.rl.refit_wake import wake_Bps
    from moesim.rl.sync import PCIE_Bps

    setup = resolve_rl(name)
    assert setup.cfg.train.offload_copy == "pageable-concurrent"
    m = setup_moves(setup, PCIE_Bps)
    assert (m.pageable_Bps, m.pinned_out_Bps, m.wake_Bps) == (
        PAGEABLE_D2H_Bps, sleep_Bps(64e9), wake_Bps(64e9))
    assert m.refit_s == pytest.approx(m.optimizer_bytes / 2.8e9
                                      + m.engine_bytes / (0.341498 * 64e9)
                                      + m.weights_bytes / (0.313298 * 64e9), rel=1e-5)


def test_gb200_recipe_keeps_the_line_rate():
    """Grace's host link (NVLink-C2C) has no published pageable-copy or wake-up rate: the
    GB200 recipe's host moves run at the link's line rate."""
    from moesim.rl.offload import setup_moves
    from moesim.rl.sync import PCIE_Bps

    setup = resolve_rl("grpo-qwen3-30b-a3b-nemo-rl-gb200")
    assert setup.cfg.train.offload_copy == "line"
    m = setup_moves(setup, PCIE_Bps)
    assert (m.pageable_Bps, m.pinned_out_Bps, m.wake_Bps) == (None, None, None)
