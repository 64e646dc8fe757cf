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
``torch.cuda.empty_cache()`` between them (no published cost).

**Pageable copies** (``rl.train.offload_copy: pageable``). ``offload_before_refit`` copies
the optimizer states out one tensor at a time with ``v.to("cpu")``: a fresh *pageable*
host tensor each time, a synchronous copy. The CUDA driver cannot DMA into pageable
memory: it copies through a pinned staging buffer and the calling thread then
``memcpy``s each chunk into the destination, faulting its fresh pages in as it goes
(NVIDIA developer blog, M. Harris, "How to Optimize Data Transfers in CUDA C/C++":
"the CUDA driver must first allocate a temporary page-locked, or 'pinned', host array");
so the copy's rate is the host thread's, not the link's. The rate taken is
:data:`PAGEABLE_D2H_Bps`, a published measurement of the same call on a Hopper host:
``module.to("cpu")`` into pageable memory "effectively ran at only ~2.8 GB/s" on an H200
(PCIe Gen5 x16) in sgl-project/sglang PR 32032 (offloading a rollout engine's weights in
colocated RL). One such copy runs per GPU process, eight per node; at 2.8 GB/s each the
node's host memory (hundreds of GB/s) is not what binds. With ``line`` (default) every
move runs at the link's line rate, a lower bound. Only the optimizer states' copy out
(inside the refit timer) is priced at the pageable rate: the copy back
(``v.to("cuda")`` in the training prep) reads pages already resident, and no published
figure gives its rate (the published step less its four phases, 2-4 s, bounds it).

**Pinned copies out with a host's GPUs copying together** (``rl.train.offload_copy:
pageable-concurrent``, :mod:`moesim.rl.offload_pinned`): as ``pageable``, and vLLM's sleep
(the engine's weights out) and the refit's weights out run at the per-GPU rate of a
published sleep with a host's GPUs copying at once (:func:`moesim.rl.offload_pinned.sleep_Bps`).

**The wake-up's rate** (``rl.train.offload_copy: pageable-concurrent`` or
``rl.weight_sync.calls: nemo-v03-wake``). vLLM's ``wake_up`` of the weights inside the
refit restores each GPU's weights with every GPU of the host waking at once; its rate is
the measured share of the host link's line rate (:func:`moesim.rl.refit_wake.wake_Bps`)
instead of the line rate.

NeMo RL v0.6.0 (5fb588932) moves the same bytes the same way: ``refit_policy_generation``
(``nemo_rl/algorithms/grpo.py`` 1116-1118) runs ``offload_before_refit`` and vLLM's
``wake_up`` on a colocated pool; ``move_optimizer("cpu")`` still copies each
optimizer-state tensor with ``v.to("cpu")`` (``megatron_policy_worker.py`` 1252-1266);
vLLM 0.17.1's ``sleep(level=1)`` ends generation (``vllm_worker.py`` 1009).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: bytes/s of a device-to-host copy into fresh pageable host memory (``module.to("cpu")``,
#: one tensor at a time): "~2.8 GB/s" on an H200 host, PCIe Gen5 x16 (sgl-project/sglang
#: PR 32032, "[Diffusion] offload rollout weights to pinned host memory")
PAGEABLE_D2H_Bps = 2.8e9
#: ``rl.train.offload_copy``: ``line`` (every move at the link's rate), ``pageable`` or
#: ``pageable-concurrent`` (also the pinned copies out at a host's concurrent rate,
#: :mod:`moesim.rl.offload_pinned`)
OFFLOAD_COPIES = ("line", "pageable", "pageable-concurrent")


@dataclass(frozen=True)
class HostMoves:
    """Bytes per GPU of each move and the seconds of each NeMo RL timer's share."""

    weights_bytes: float        # the policy's bf16 parameters on the busiest trainer GPU
    grads_bytes: float          # its gradient buffer: released and re-zeroed, not copied
    optimizer_bytes: float      # its optimizer-state shard
    engine_bytes: float         # the engine's weights on one rollout GPU
    host_Bps: float
    #: the optimizer states' copy out into pageable memory (None: at ``host_Bps``)
    pageable_Bps: float | None = None
    #: the engine's weights back in at the refit's ``wake_up`` (None: at ``host_Bps``)
    wake_Bps: float | None = None
    #: the copies out into pinned memory, vLLM's sleep and the refit's weights out, with
    #: every GPU of the host copying at once (None: at ``host_Bps``)
    pinned_out_Bps: float | None = None

    def _rate(self, measured_Bps: float | None) -> float:
        """A move's rate: the host link's, capped by its measured rate where one is set."""
        return self.host_Bps if measured_Bps is None else min(self.host_Bps, measured_Bps)

    @property
    def optimizer_out_s(self) -> float:
        """``offload_before_refit``'s copy of the optimizer states to the host."""
        return self.optimizer_bytes / self._rate(self.pageable_Bps)

    @property
    def engine_wake_s(self) -> float:
        """vLLM's ``wake_up(tags=["weights"])`` in the refit: the engine's weights in."""
        return self.engine_bytes / self._rate(self.wake_Bps)

    @property
    def engine_sleep_s(self) -> float:
        return self.engine_bytes / self._rate(self.pinned_out_Bps)

    @property
    def weights_out_s(self) -> float:
        """``offload_after_refit``'s copy of the policy's parameters to the host."""
        return self.weights_bytes / self._rate(self.pinned_out_Bps)

    @property
    def logprob_prep_s(self) -> float:
        return self.weights_bytes / self.host_Bps

    @property
    def train_prep_s(self) -> float:
        return self.optimizer_bytes / self.host_Bps

    @property
    def refit_s(self) -> float:
        if self.wake_Bps is None and self.pinned_out_Bps is None:   # the same float as
            return self.optimizer_out_s + (self.engine_bytes + self.weights_bytes) / self.host_Bps
        return self.optimizer_out_s + self.engine_wake_s + self.weights_out_s   # before them

    @property
    def bytes_per_step(self) -> float:
        """Every byte a GPU moves over its host link in one step (each way once)."""
        return 2 * (self.weights_bytes + self.optimizer_bytes + self.engine_bytes)

    def as_dict(self) -> dict:
        d = asdict(self)
        if self.pageable_Bps is None:           # line rate: the summary as before
            del d["pageable_Bps"]
        else:
            d["optimizer_out_s"] = self.optimizer_out_s
        if self.wake_Bps is None:               # line rate: the summary as before
            del d["wake_Bps"]
        else:
            d["engine_wake_s"] = self.engine_wake_s
        if self.pinned_out_Bps is None:         # line rate: the summary as before
            del d["pinned_out_Bps"]
        else:
            d["weights_out_s"] = self.weights_out_s
        return {**d, "engine_sleep_s": self.engine_sleep_s,
                "logprob_prep_s": self.logprob_prep_s, "train_prep_s": self.train_prep_s,
                "refit_s": self.refit_s, "bytes_per_step": self.bytes_per_step}


def host_moves(stage_row: dict, engine_bytes: float, host_Bps: float,
               pageable_Bps: float | None = None, wake_Bps: float | None = None,
               pinned_out_Bps: float | None = None) -> HostMoves:
    """The moves from a memory-table row of the trainer's busiest stage (``weights``,
    ``gradients``, ``optimizer`` bytes) and the engine's weight bytes per GPU."""
    return HostMoves(float(stage_row["weights"]), float(stage_row["gradients"]),
                     float(stage_row["optimizer"]), float(engine_bytes), host_Bps,
                     pageable_Bps, wake_Bps, pinned_out_Bps)


def setup_moves(setup, host_Bps: float) -> HostMoves | None:
    """The moves of an RL setup (:class:`moesim.rl.run.RLSetup`) with
    ``rl.train.offload: nemo`` on a colocated pool, else None."""
    cfg = setup.cfg
    if cfg.train.offload != "nemo" or not cfg.colocated:
        return None
    from moesim.rl.memory import replica_weight_bytes, trainer_table

    rows = trainer_table(setup, 1)["stages"]
    worst = max(rows, key=lambda r: r["weights"] + r["gradients"] + r["optimizer"])
    pageable = PAGEABLE_D2H_Bps if cfg.train.offload_copy != "line" else None
    from moesim.rl.offload_pinned import concurrent_rates

    pinned_out, wake = concurrent_rates(cfg.train, host_Bps)
    if wake is None and cfg.weight_sync.calls == "nemo-v03-wake":
        from moesim.rl.refit_wake import wake_Bps
        wake = wake_Bps(host_Bps)
    return host_moves(worst, replica_weight_bytes(setup.res.model, cfg.rollout), host_Bps,
                      pageable, wake, pinned_out)
