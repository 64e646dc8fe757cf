"""Part 6 of ``rl_moe_trainer.py``: what each lead on NeMo RL v0.3's MoE trainer adds to
the Qwen3-30B-A3B step (``scenarios/grpo-qwen3-30b-a3b-nemo-v03.yaml``), as seconds of
its training and log-prob phases: the trainer's phases of one RL step (the step's batch
as ``moesim rl`` draws it; generation, refit and the host moves left out) with one knob
changed at a time."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "grpo-qwen3-30b-a3b-nemo-v03.yaml"
#: NeMo RL v0.3 blog post (NVIDIA-NeMo/.github blog/posts/nemo-rl-v0.3/index.md): policy
#: training 50 s, log-probs 23 s per step
PUBLISHED = {"train": 50.0, "logprobs": 23.0}

#: (label, overrides over the shipped scenario, source)
LEADS = (
    ("knobs off (packing nemo, no log-prob softmax)",
     ("rl.train.packing=nemo", "rl.train.logprob_softmax=none"), "the page's baseline"),
    ("+ packing none: whole samples padded to the longest",
     ("rl.train.logprob_softmax=none",),
     "grpo_math_qwen30ba3b_megatron.yaml sequence_packing.enabled False; "
     "megatron_policy_worker.py train() / get_logprobs() (NeMo RL b1c86a816)"),
    ("+ logprob_softmax nemo: fp32 log-softmax in log-prob passes", (),
     "megatron_policy_worker.py get_logprobs collection_fn; model_utils.py "
     "DistributedLogprob (b1c86a816): the shipped scenario"),
    ("+ routing zipf s 0.5, drift layer (not shipped)",
     ("routing.kind=zipf", "routing.zipf_s=0.5", "routing.drift=layer"),
     "sensitivity: no published per-micro-batch load of Qwen3-30B-A3B found"),
    ("+ routing zipf s 1.0, drift layer (not shipped)",
     ("routing.kind=zipf", "routing.zipf_s=1.0", "routing.drift=layer"),
     "sensitivity, as above"),
    ("+ sort_chunks: Megatron's sort by local expert in the trainer's passes",
     ("rl.train.sort_chunks=true",),
     "Megatron-LM 2ff0f099 token_dispatcher.py dispatch_postprocess, combine_preprocess "
     "(num_local_experts 16 > 1)"),
    ("+ host_dispatch timeline: host and GPU as two clocks, TE module calls at 115 us",
     ("rl.train.host_dispatch=timeline",),
     "Megatron-LM 2ff0f099 token_dispatcher.py (the sync); TransformerEngine PR 1191"),
    ("+ both (sort_chunks, timeline)",
     ("rl.train.sort_chunks=true", "rl.train.host_dispatch=timeline"), "the two above"),
)

#: H100 SXM FP64 tensor-core peak, FLOP/s (NVIDIA H100 Tensor Core GPU datasheet: 67
#: teraFLOPS FP64 Tensor Core, SXM)
H100_FP64_FLOPS = 67e12
#: ``.item()`` calls in ClippedPGLossFn.__call__ per training micro-batch (NVIDIA-NeMo/RL
#: b1c86a816 nemo_rl/algorithms/loss_functions.py lines 138, 281, 286, 294, 297, 299,
#: 300, 301): each a device-to-host read that waits for the GPU
LOSS_ITEMS = 8

#: the row of the shipped scenario in LEADS
SHIPPED = 2

#: trainer costs by the overrides that change the simulated passes (routing, sort_chunks,
#: host_dispatch): the knobs of the first rows change rows and one attribute, not the
#: simulated passes, so those rows share one trainer
_TRAINERS: dict[tuple, object] = {}


def trainer_phases(overrides) -> tuple[dict, float]:
    """The trainer's phases of step 0 under ``overrides`` and the busiest EP rank's
    tokens over the mean in the training step (mean over MoE layers)."""
    from moesim.rl.engine_costs import EngineTrainerCosts, gpus_per_node
    from moesim.rl.phases import step_work
    from moesim.rl.run import draw_batch, resolve_rl

    setup = resolve_rl(SCENARIO, overrides)
    tr = setup.cfg.train
    # the routing, sort and host-dispatch overrides change the simulated passes
    key = tuple(o for o in overrides if o.startswith(
        ("routing.", "rl.train.sort_chunks", "rl.train.host_dispatch")))
    if key not in _TRAINERS:
        _TRAINERS[key] = EngineTrainerCosts(
            setup.scenario, tr.gpus, gpus_per_node(setup), tp=tr.tp, pp=tr.pp, ep=tr.ep,
            cp=tr.cp, seq_len=setup.seq_len, zero=tr.zero, loss_logprob=tr.loss_logprob)
    c = _TRAINERS[key]
    c.logprob_softmax = tr.logprob_softmax
    w = step_work(setup.cfg, draw_batch(setup, 0), setup.seq_len, None, 0, c, 0.0,
                  generation=False)
    return dict(w.durations.trainer), hot_rank(c, tr.ep)


def hot_rank(c, ep: int) -> float:
    """The busiest EP rank's routed tokens over the mean, averaged over the MoE layers of
    the simulated training step (experts on ranks in contiguous blocks)."""
    import numpy as np

    ratios = []
    for stats in c.experts.values():
        for layer in (stats or {}).get("tokens_per_expert", []):
            ranks = np.asarray(layer, dtype=float).reshape(ep, -1).sum(axis=1)
            ratios.append(ranks.max() / ranks.mean())
    return float(np.mean(ratios)) if ratios else 1.0


def leads() -> None:
    print()
    print("### Part 6: what each lead adds to NeMo RL v0.3's Qwen3-30B-A3B trainer")
    print()
    print("| run | source | training s | log-probs s | added to training | added to "
          "log-probs | busiest EP rank / mean |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for i, (label, sets, src) in enumerate(LEADS):
        ph, hot = trainer_phases(sets)
        train = ph.get("train", 0.0) + ph.get("loss_logprob", 0.0)
        lp = ph.get("old_logprob", 0.0) + ph.get("reference", 0.0)
        # the knobs against the row before; the routing rows against the shipped one
        ref = None if i == 0 else rows[i - 1] if i < SHIPPED + 1 else rows[SHIPPED]
        d_t = "" if ref is None else f"{train - ref[0]:+.2f}"
        d_l = "" if ref is None else f"{lp - ref[1]:+.2f}"
        print(f"| {label} | {src} | {train:.2f} | {lp:.2f} | {d_t} | {d_l} | {hot:.3f} |")
        rows.append((train, lp))
    train, lp = rows[SHIPPED]
    both = rows[-1]
    bounds()
    print()
    print(f"The shipped scenario's trainer: training {train:.2f} s against the published "
          f"{PUBLISHED['train']:.0f} s ({(train / PUBLISHED['train'] - 1) * 100:+.1f} %), "
          f"log-prob passes {lp:.2f} s against {PUBLISHED['logprobs']:.0f} s "
          f"({(lp / PUBLISHED['logprobs'] - 1) * 100:+.1f} %; the published figure also "
          "holds the reference swap and the log-prob prep). Training here includes the "
          "loss's log-softmax phase (loss_logprob). The routing rows are the shipped "
          "scenario with a skew added, compared with it: a sensitivity, not a calibration "
          "(no per-micro-batch expert load of Qwen3-30B-A3B on math data was found "
          "published; ForeMoE, arXiv:2606.11867, describes such micro-step imbalance in RL "
          "post-training, and its figures were not in the stored material).")
    print()
    print(f"With both of Part 7's mechanisms on (`--set rl.train.sort_chunks=true --set "
          f"rl.train.host_dispatch=timeline`): training {both[0]:.2f} s "
          f"({(both[0] / PUBLISHED['train'] - 1) * 100:+.1f} %), log-prob passes "
          f"{both[1]:.2f} s ({(both[1] / PUBLISHED['logprobs'] - 1) * 100:+.1f} %).")
    from rl_moe_part7 import part7

    part7()


def bounds() -> None:
    """What the worker's source adds beyond the rows above, bounded by hand: the loss's
    host syncs and the fp64 router GEMMs (``moe_router_dtype: fp64``)."""
    from moesim.program import host_dispatch as hd
    from moesim.rl.run import resolve_rl

    setup = resolve_rl(SCENARIO)
    tr, spec = setup.cfg.train, setup.res.model
    dp = tr.gpus // tr.tp
    train_mb = tr.mini_batches * -(-setup.cfg.samples_per_step // tr.mini_batches // dp)
    lp_rows = -(-setup.cfg.samples_per_step // (tr.logprob_mb_tokens // setup.seq_len))
    lp_mb = 2 * -(-lp_rows // dp)                      # old policy and reference
    sync_s = train_mb * LOSS_ITEMS * (hd.EAGER_OP_S + hd.CPP_LAUNCH_S)
    # the router GEMM over each GPU's sequence-parallel share of the row's tokens, fp64:
    # forward and input gradient in training (the router is frozen: no weight gradient),
    # forward in the log-prob passes
    gemm = 2 * spec.hidden * spec.n_experts
    moe = sum(1 for i in range(spec.layers) if spec.is_moe_layer(i))
    router_train = train_mb * moe * 2 * gemm * (setup.seq_len // tr.tp) / H100_FP64_FLOPS
    router_lp = lp_mb * moe * gemm * (tr.logprob_mb_tokens // tr.tp) / H100_FP64_FLOPS
    print()
    print(f"Read in the worker and bounded by hand (not in the rows above): the loss's "
          f"{LOSS_ITEMS} `.item()` host syncs per training micro-batch x {train_mb} "
          f"micro-batches at one eager op and one launch each: {sync_s:.3f} s; the fp64 "
          f"router GEMMs at the H100's FP64 tensor-core peak (67 TFLOP/s): training "
          f"{router_train:.3f} s, log-prob passes ({lp_mb} micro-batches) "
          f"{router_lp:.3f} s per step (moesim prices them in bf16); "
          "`torch.cuda.empty_cache()` after each mini-batch's forward-backward "
          "(empty_unused_memory_level 1; 4 a step): no published cost, not priced; "
          "activation checkpointing off and the optimizer on the GPU (no CPU offload in "
          "the v0.3 recipe): nothing beyond the simulated step.")
