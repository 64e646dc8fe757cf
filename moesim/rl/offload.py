"""Colocated host moves phase by phase (``rl.train.offload: nemo``): what NeMo RL's
Megatron worker and vLLM's sleep mode copy between GPU and host memory in one GRPO step
on a colocated pool, each over the GPU's host link (``PCIE_Bps``, in series on each GPU,
every GPU at once).

Read from NVIDIA-NeMo/RL v0.3.0 (b1c86a816), per step and per GPU:

- **end of generation** (``grpo.py`` ``policy_generation.finish_generation()`` inside the
  ``generation`` timer; ``nemo_rl/models/generation/vllm.py`` ``sleep``:
  ``self.llm.sleep(level=1)``, vLLM's sleep mode level 1 offloading the weights to CPU
  memory and discarding the KV cache): the engine's weights to the host
  (:attr:`HostMoves.engine_sleep_s`, the colocated ``switch`` into training);
- **log-prob prep** (``logprob_inference_prep`` timer; ``megatron_policy_worker.py``
  ``prepare_for_lp_inference``: ``move_model(self.model, "cuda", move_grads=False)``):
  the policy's bf16 parameters back in (:attr:`HostMoves.logprob_prep_s`);
- **training prep** (``training_prep`` timer; ``prepare_for_training``: the gradient
  buffers back (``move_model(..., move_grads=True, move_params=True)``; the parameters
  are already on the GPU) and every optimizer-state tensor ``v.to("cuda")``): the
  optimizer states in (:attr:`HostMoves.train_prep_s`);
- **refit** (``prepare_for_generation`` timer, ``refit_policy_generation``):
  ``offload_before_refit`` (the gradient buffers released, the optimizer states to the
  host), ``prepare_for_generation(tags=["weights"])`` (vLLM's ``wake_up``: the engine's
  weights back), then, after the hand-over, ``offload_after_refit`` (the policy's
  parameters to the host) (:attr:`HostMoves.refit_s`, the colocated ``switch`` out of
  training). The KV cache is re-allocated (``tags=["kv_cache"]``), moving no bytes.

The gradient buffers cross no link: Megatron-Core's ``_ParamAndGradBuffer.offload_to_cpu``
(megatron/core/distributed/param_and_grad_buffer.py; NeMo RL v0.3.0 pins
terrykong/Megatron-LM at 2ff0f099f) releases the gradient storage (``resize_(0)``) and
``reload_from_cpu`` re-allocates and zeroes it; only the parameters are copied, into
pinned host memory (``param_data.cpu().pin_memory()`` the first time,
``param_data_cpu.copy_(..., non_blocking=True)`` after) and back.

Bytes per GPU come from moesim's memory table of the trainer's layout (its busiest
stage's ``weights``, ``gradients`` and ``optimizer`` categories: bf16 weights and
gradients, NeMo's recipes ``grad_reduce_in_fp32: false``; optimizer states sharded by the
distributed optimizer) and the engine's weight share
(:func:`moesim.rl.memory.replica_weight_bytes`). Not priced: ``gc.collect()`` and
``torch.cuda.empty_cache()`` between them (no published cost), and the slower rate of a
copy into pageable host memory (``v.to("cpu")`` of the optimizer states): every copy
runs at the link's line rate, a lower bound on each move.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class HostMoves:
    """Bytes per GPU of each move and the seconds of each NeMo RL timer's share."""

    weights_bytes: float        # the policy's bf16 parameters on the busiest trainer GPU
    grads_bytes: float          # its gradient buffer: released and re-zeroed, not copied
    optimizer_bytes: float      # its optimizer-state shard
    engine_bytes: float         # the engine's weights on one rollout GPU
    host_Bps: float

    @property
    def engine_sleep_s(self) -> float:
        return self.engine_bytes / self.host_Bps

    @property
    def logprob_prep_s(self) -> float:
        return self.weights_bytes / self.host_Bps

    @property
    def train_prep_s(self) -> float:
        return self.optimizer_bytes / self.host_Bps

    @property
    def refit_s(self) -> float:
        return (self.optimizer_bytes + self.engine_bytes + self.weights_bytes) / self.host_Bps

    @property
    def bytes_per_step(self) -> float:
        """Every byte a GPU moves over its host link in one step (each way once)."""
        return 2 * (self.weights_bytes + self.optimizer_bytes + self.engine_bytes)

    def as_dict(self) -> dict:
        return {**asdict(self), "engine_sleep_s": self.engine_sleep_s,
                "logprob_prep_s": self.logprob_prep_s, "train_prep_s": self.train_prep_s,
                "refit_s": self.refit_s, "bytes_per_step": self.bytes_per_step}


def host_moves(stage_row: dict, engine_bytes: float, host_Bps: float) -> HostMoves:
    """The moves from a memory-table row of the trainer's busiest stage (``weights``,
    ``gradients``, ``optimizer`` bytes) and the engine's weight bytes per GPU."""
    return HostMoves(float(stage_row["weights"]), float(stage_row["gradients"]),
                     float(stage_row["optimizer"]), float(engine_bytes), host_Bps)


def setup_moves(setup, host_Bps: float) -> HostMoves | None:
    """The moves of an RL setup (:class:`moesim.rl.run.RLSetup`) with
    ``rl.train.offload: nemo`` on a colocated pool, else None."""
    cfg = setup.cfg
    if cfg.train.offload != "nemo" or not cfg.colocated:
        return None
    from moesim.rl.memory import replica_weight_bytes, trainer_table

    rows = trainer_table(setup, 1)["stages"]
    worst = max(rows, key=lambda r: r["weights"] + r["gradients"] + r["optimizer"])
    return host_moves(worst, replica_weight_bytes(setup.res.model, cfg.rollout), host_Bps)
