"""verl's H20 scenarios carry its scripts' settings (scenarios/grpo-*-verl-h20.yaml against
volcengine/verl e2e4c35ec run_deepseek671b_math_megatron_96gb.sh and f6f910069
run_qwen3moe-30b_megatron_96gb.sh), and need the host optimizer to fit."""

from __future__ import annotations

from moesim.rl.memory import trainer_fit
from moesim.rl.run import draw_batches, resolve_rl


def test_deepseek_v3_on_96_h20_is_the_script():
    s = resolve_rl("grpo-deepseek-v3-verl-h20")
    cfg, tr, ro = s.cfg, s.cfg.train, s.cfg.rollout
    assert s.res.device.name == "H20" and s.res.model.mtp_layers == 0
    # 96 prompts x 8; 3 mini-batches of 32 prompts; rows of 2,048 + 9,632 tokens
    assert (cfg.prompts_per_step, cfg.samples_per_prompt, tr.mini_batches) == (96, 8, 3)
    assert tr.seq_len == tr.logprob_mb_tokens == 2048 + 9632
    assert cfg.response_tokens.max == 9632 and cfg.response_tokens.mean == 1960
    # TP8 PP12 EP8 on 96 GPUs: data parallel 1; the optimizer on the host
    assert (tr.gpus, tr.tp, tr.pp, tr.ep, tr.dp, tr.zero) == (96, 8, 12, 8, 1, 1)
    assert (tr.packing, tr.optimizer) == ("verl", "cpu")
    assert s.scenario.memory.recompute == "full"
    # three TP32 engines, eager, 0.6 of the memory; KL loss: the reference pass runs
    assert (ro.tp, ro.replicas, ro.kv_fraction, ro.cuda_graphs) == (32, 3, 0.6, False)
    assert cfg.reference and cfg.old_logprob and cfg.colocated


def test_qwen3_30b_on_8_h20_is_the_script():
    s = resolve_rl("grpo-qwen3-30b-a3b-verl-h20")
    cfg, tr, ro = s.cfg, s.cfg.train, s.cfg.rollout
    assert (cfg.prompts_per_step, cfg.samples_per_prompt, tr.mini_batches) == (512, 16, 4)
    assert tr.seq_len == 2048 + 8192 and cfg.response_tokens.max == 8192
    assert (tr.gpus, tr.tp, tr.pp, tr.ep, tr.dp, tr.optimizer) == (8, 1, 1, 8, 8, "cpu")
    assert (ro.tp, ro.replicas, ro.kv_fraction, ro.cuda_graphs) == (4, 2, 0.7, False)
    # no KL term in the script: no reference pass
    assert not cfg.reference and cfg.old_logprob


def test_the_deepseek_v3_trainer_fits_only_with_the_optimizer_on_the_host():
    """With the states on the GPU the busiest stage needs more than the H20's 95.6 GiB."""
    cpu = resolve_rl("grpo-deepseek-v3-verl-h20")
    gpu = resolve_rl("grpo-deepseek-v3-verl-h20", ["rl.train.optimizer=gpu"])
    assert not trainer_fit(cpu, draw_batches(cpu, 1)).oom
    assert trainer_fit(gpu, draw_batches(gpu, 1)).oom
