"""The ``rl:`` scenario section: GRPO post-training steps (docs/rl.md).

The section's fields, an example and their checks are
:mod:`moesim.scenario.sections.rl`; here the registry names (algorithm, length
distributions) are checked and the pools laid out.

Every problem is one :class:`~moesim.errors.InputError` naming the file and the
``rl.`` field. Defaults and their sources are next to each field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moesim.errors import InputError
from moesim.rl.algorithms import ALGORITHMS
from moesim.scenario.sections import written
from moesim.scenario.sections.rl import LENGTH_DEFAULTS, RLConfig
from moesim.scenario.sections.rl import rl_from_dict as parse_rl
from moesim.traffic.lengths import check as check_lengths


def _algorithm_fields(d: dict, src: str) -> None:
    """The algorithm by name from the registry (:data:`ALGORITHMS`); a key that only
    other algorithms take is refused, naming the algorithm and the ones that take it."""
    kind = ALGORITHMS.get(d.get("algorithm", RLConfig.algorithm), src)
    ALGORITHMS.refuse_foreign(d, kind, src, "rl", "algorithm")


#: the trainer's layout fields ``rl.train`` takes from the scenario's ``parallel`` section
#: where it does not write them (docs/rl.md, "The trainer's layout")
TRAIN_FROM_PARALLEL = ("tp", "pp", "ep", "cp", "zero")


def trainer_layout(cfg: RLConfig, given_train: dict, parallel) -> RLConfig:
    """``rl.train``'s layout: each of :data:`TRAIN_FROM_PARALLEL` as ``rl.train`` writes
    it, else the scenario's ``parallel`` value (``parallel`` None: ``rl.train``'s own)."""
    if parallel is None:
        return cfg
    take = {k: getattr(parallel, k) for k in TRAIN_FROM_PARALLEL if k not in given_train}
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **take))


def rl_config(cfg: RLConfig | None, source: str, *, world: int | None = None,
              parallel=None) -> RLConfig:
    """The scenario's ``rl`` section (checked against itself when it was read) checked
    against the registries (the algorithm, the length distributions) and the cluster's
    ``world`` GPUs; the trainer's GPUs filled in where left to the rest of the cluster,
    its layout from the scenario's ``parallel`` section (a ``ParallelConfig``) where
    ``rl.train`` does not write it (:func:`trainer_layout`)."""
    if cfg is None:
        raise InputError(source, "rl", "an rl section, e.g. rl: {prompts_per_step: 64, "
                         "samples_per_prompt: 8, rollout: {gpus: 8}, train: {gpus: 8}}", {})
    given = written(cfg)
    _algorithm_fields(given, source)
    lengths = {k: check_lengths(given[k], source, f"rl.{k}", LENGTH_DEFAULTS[k])
               for k in LENGTH_DEFAULTS if k in given}
    cfg = dataclasses.replace(cfg, **lengths)
    train_given = given.get("train") or {}
    cfg = trainer_layout(cfg, train_given if isinstance(train_given, dict) else {}, parallel)
    if cfg.train.gpus is None:
        rest = cfg.rollout.gpus if cfg.colocated else (world or 0) - cfg.rollout.gpus
        if rest < 1:
            raise InputError(source, "rl.train.gpus", "an integer >= 1 (the rest of the "
                             f"cluster's {world} GPUs is {rest})")
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, gpus=rest))
    _consistent(cfg, source, world)
    if parallel is not None and parallel.dp is not None and parallel.dp != cfg.train.dp:
        raise InputError(source, "parallel.dp", f"omitted or rl.train.gpus / (tp x cp x pp) "
                         f"= {cfg.train.dp} (the trainer pool sets moesim rl's data "
                         "parallelism)", parallel.dp)
    return cfg


def rl_from_dict(d: Any, source: str, *, world: int | None = None) -> RLConfig:
    """Check an ``rl`` mapping as reading a scenario and running it do."""
    return rl_config(parse_rl(d, source), source, world=world)


def _consistent(cfg: RLConfig, src: str, world: int | None) -> None:
    if cfg.colocated and cfg.max_lag != 0:
        raise InputError(src, "rl.max_lag", "0 with rl.colocated: true (one pool runs the "
                         "phases in turn, so no rollout can overlap training)", cfg.max_lag)
    if cfg.partial_rollouts and cfg.max_lag < 1:
        raise InputError(src, "rl.partial_rollouts", "false with rl.max_lag: 0 (a sample "
                         "continued under a newer version is off-policy: partial rollouts "
                         "need max_lag >= 1, disaggregated pools)", True)
    if cfg.kv_after_sync == "keep" and not cfg.partial_rollouts:
        raise InputError(src, "rl.kv_after_sync", "recompute without rl.partial_rollouts "
                         "(the KV caches kept across a weight sync are those of samples a "
                         "sync pauses)", "keep")
    if cfg.colocated and cfg.weight_sync.method == "sharded":
        raise InputError(src, "rl.weight_sync.method", "ipc or nccl with rl.colocated: true "
                         "(a sharded sync moves weights between two pools)", "sharded")
    if not cfg.colocated and cfg.weight_sync.method == "ipc":
        raise InputError(src, "rl.weight_sync.method", "nccl or sharded for disaggregated "
                         "pools (CUDA IPC hands over memory on the same GPU only)", "ipc")
    ro, tr = cfg.rollout, cfg.train
    if tr.offload != "none" and not cfg.colocated:
        raise InputError(src, "rl.train.offload", "none for disaggregated pools (the host "
                         "moves are those of one pool switching between its phases)",
                         tr.offload)
    if tr.te_gemm_call != "launch" and tr.host_dispatch != "timeline":
        raise InputError(src, "rl.train.te_gemm_call", "launch unless rl.train.host_dispatch "
                         "is timeline (the call's host time is a clock of that timeline)",
                         tr.te_gemm_call)
    if ro.ep > 1 and ro.ep % ro.tp:
        raise InputError(src, "rl.rollout.ep", f"1 or a multiple of rl.rollout.tp = {ro.tp} "
                         "(a replica spans ep GPUs, attention data parallel ep / tp)", ro.ep)
    if ro.gpus % ro.replica_gpus:
        raise InputError(src, "rl.rollout.gpus", f"a multiple of the replica's "
                         f"{ro.replica_gpus} GPUs (max of tp, ep)", ro.gpus)
    if tr.gpus % (tr.tp * tr.cp * tr.pp):
        raise InputError(src, "rl.train.gpus", f"a multiple of tp x cp x pp = "
                         f"{tr.tp * tr.cp * tr.pp}", tr.gpus)
    if (tr.gpus // tr.pp) % tr.ep:
        raise InputError(src, "rl.train.ep", f"a divisor of gpus / pp = {tr.gpus // tr.pp}",
                         tr.ep)
    if cfg.colocated and tr.gpus != ro.gpus:
        raise InputError(src, "rl.train.gpus", f"rl.rollout.gpus = {ro.gpus} with "
                         "rl.colocated: true (one pool)", tr.gpus)
    if cfg.samples_per_step % (tr.mini_batches):
        raise InputError(src, "rl.train.mini_batches", "a divisor of the step's samples "
                         f"(prompts_per_step x samples_per_prompt = {cfg.samples_per_step})",
                         tr.mini_batches)
    if world is not None and ro.gpus > world:
        raise InputError(src, "rl.rollout.gpus", f"a rollout pool that fits the cluster's "
                         f"{world} GPUs", ro.gpus)
    if world is not None and cfg.total_gpus > world:
        raise InputError(src, "rl.train.gpus" if not cfg.colocated else "rl.rollout.gpus",
                         f"pools that fit the cluster's {world} GPUs (rollout + train = "
                         f"{cfg.total_gpus})", tr.gpus if not cfg.colocated else ro.gpus)
