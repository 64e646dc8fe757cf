"""Colocated host moves as verl's Megatron worker makes them (``rl.train.offload: verl``),
phase by phase, per GPU: verl's ``param_offload`` for the actor and the reference and
vLLM's sleep at level 2.

Read from volcengine/verl e2e4c35ec (the commit of its DeepSeek-V3 H20 benchmark):

- **Rollout** (the ``gen`` timer; ``verl/workers/sharding_manager/megatron_vllm.py``
  ``__enter__``): ``load_megatron_model_to_gpu(actor, load_grad=False)`` (the actor's
  parameters in), vLLM's ``wake_up(tags=["weights"])`` (after a level-2 sleep the
  weights were discarded: memory is mapped, nothing is copied), the per-tensor hand-over,
  then ``offload_megatron_model_to_cpu(actor)`` (the parameters out); ``__exit__``:
  ``sleep(level=2)``, which discards the weights and the KV cache without a copy
  (``verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py``).
- **Old log-probs** (``verl/workers/megatron_workers.py`` ``compute_log_prob``): the
  actor's parameters in, the pass, out.
- **Reference** (``compute_ref_log_prob``): the reference's parameters in, the pass, out.
- **Update** (``update_actor``): the actor's parameters in (its gradient buffers are
  re-allocated and zeroed, nothing copied), the optimizer steps, the parameters out.

How each copies (``verl/utils/megatron_utils.py``): an actor offload is
``buffer.param_data.cpu_data = buffer.param_data.data.cpu().pin_memory()`` every time,
a copy into fresh *pageable* host memory (priced at the published pageable rate,
:data:`moesim.rl.offload.PAGEABLE_D2H_Bps`) followed by a host-side copy into pinned
memory (not priced: no published rate); the reference, not a DDP module, goes out with
``param.data.to("cpu", non_blocking=True)`` into pinned memory, and every load is a
copy from pinned memory (both at the host link's rate). Gradient buffers are released
(``resize_(0)``) and re-allocated, never copied. The bytes are the busiest trainer GPU's
bf16 parameters (moesim's memory table), the reference's the same.

moesim's phases: the rollout's two moves are the colocated switch out of training, the
sleep's switch into training is free, the log-prob passes' moves are ``logprob_prep``,
the update's ``train_prep`` (outside ``update_policy``, the time verl's MFU divides by).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moesim.rl.offload import PAGEABLE_D2H_Bps


@dataclass(frozen=True)
class VerlMoves:
    """Bytes per GPU and the seconds of each phase's share of verl's parameter moves."""

    weights_bytes: float        # the actor's bf16 parameters on the busiest trainer GPU
    host_Bps: float             # a copy from or into pinned memory
    pageable_Bps: float         # the actor's offload into pageable memory
    old_logprob: bool = True
    reference: bool = True

    @property
    def round_trip_s(self) -> float:
        """The actor's parameters in (pinned) and out (pageable) once."""
        return self.weights_bytes / self.host_Bps + self.weights_bytes / self.pageable_Bps

    @property
    def reference_round_trip_s(self) -> float:
        """The reference's parameters in and out, both through pinned memory."""
        return 2 * self.weights_bytes / self.host_Bps

    @property
    def engine_sleep_s(self) -> float:
        """vLLM's level-2 sleep discards the engine's weights: nothing crosses the link."""
        return 0.0

    @property
    def refit_s(self) -> float:
        """The rollout's moves around the hand-over (the switch out of training)."""
        return self.round_trip_s

    @property
    def logprob_prep_s(self) -> float:
        return ((self.round_trip_s if self.old_logprob else 0.0)
                + (self.reference_round_trip_s if self.reference else 0.0))

    @property
    def train_prep_s(self) -> float:
        return self.round_trip_s

    @property
    def bytes_per_step(self) -> float:
        """Every byte a GPU moves over its host link in one step."""
        trips = 2 + (1 if self.old_logprob else 0) + (1 if self.reference else 0)
        return 2 * trips * self.weights_bytes

    def as_dict(self) -> dict:
        return {**asdict(self), "framework": "verl", "engine_sleep_s": self.engine_sleep_s,
                "refit_s": self.refit_s, "logprob_prep_s": self.logprob_prep_s,
                "train_prep_s": self.train_prep_s, "bytes_per_step": self.bytes_per_step}


def verl_moves(setup, host_Bps: float) -> VerlMoves:
    """The moves of an RL setup with ``rl.train.offload: verl`` (colocated)."""
    from moesim.rl.memory import trainer_table

    rows = trainer_table(setup, 1)["stages"]
    weights = max(float(r["weights"]) for r in rows)
    cfg = setup.cfg
    return VerlMoves(weights, host_Bps, PAGEABLE_D2H_Bps, cfg.old_logprob, cfg.reference)
