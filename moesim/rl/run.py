"""RL post-training end to end: load the ``rl`` section, draw each step's batch, price
every phase with the engines (:mod:`moesim.rl.engine_costs`) or given costs, lay the
steps out over time (:mod:`moesim.rl.loop`) and summarise (:mod:`moesim.rl.summary`).

Pools: the rollout pool is the cluster's first ``rl.rollout.gpus`` GPUs, the trainer
the next ``rl.train.gpus`` (colocated: the same GPUs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.errors import InputError
from moesim.load.costs import StepCosts
from moesim.load.deploy import windows_of
from moesim.memory.model import rank_params
from moesim.rl.config import RLConfig, rl_from_dict
from moesim.rl.generate import Rollout
from moesim.rl.lengths import draw
from moesim.rl.loop import Timeline, schedule, schedule_partial
from moesim.rl.phases import Batch, StepWork, TrainerCosts, step_work
from moesim.rl.sync import SyncResult, switch_cost, weight_sync
from moesim.scenario import load_scenario
from moesim.scenario.blame import blame_overrides
from moesim.scenario.resolve import Resolved, resolve
from moesim.scenario.schema import ParallelConfig, Scenario
from moesim.serve.kv import kv_bytes_per_token

KV_ELEM = {"bf16": 2, "fp8": 1}


@dataclass
class RLSetup:
    scenario: Scenario          # as loaded (world filled in)
    res: Resolved               # the whole cluster (topology, model, device, compute)
    cfg: RLConfig
    seq_len: int                # the trainer's packed row length

    @property
    def source(self) -> str:
        return self.scenario.source


@dataclass
class RLRun:
    setup: RLSetup
    batches: list[Batch]
    works: list[StepWork]
    timeline: Timeline
    sync: SyncResult
    kv_tokens: int              # KV-cache tokens per attention-DP rank of a replica
    switch_s: tuple[float, float]


def resolve_rl(target: str | Path, overrides=()) -> RLSetup:
    """Load a scenario with an ``rl`` section and check it against the cluster."""
    scn = load_scenario(target, list(overrides), resolve=False)
    try:
        whole = dataclasses.replace(scn, parallel=ParallelConfig(order=scn.parallel.order),
                                    serve={})
        res = resolve(whole)
        cfg = rl_from_dict(dict(scn.rl), scn.source, world=res.layout.world)
    except InputError as err:
        raise blame_overrides(err, scn.source, list(overrides)) from None
    seq_len = cfg.train.seq_len or scn.schedule.seq_len
    return RLSetup(res.scenario, res, cfg, seq_len)


def draw_batch(setup: RLSetup, step: int) -> Batch:
    """Step ``step``'s samples: ``prompts_per_step`` prompts, each repeated for its group
    of ``samples_per_prompt`` responses (seeded by the scenario's seed and the step)."""
    cfg = setup.cfg
    rng = np.random.default_rng([setup.scenario.seed, step])
    prompts = draw(cfg.prompt_tokens, cfg.prompts_per_step, rng, "rl.prompt_tokens")
    response = draw(cfg.response_tokens, cfg.samples_per_step, rng, "rl.response_tokens")
    batch = Batch(np.repeat(prompts, cfg.samples_per_prompt), response)
    longest = int((batch.prompt + batch.response).max())
    if longest > setup.seq_len:
        raise InputError(setup.source, "rl.train.seq_len", f"at least the longest sample, "
                         f"prompt + response = {longest} tokens (the trainer packs samples "
                         "into rows of seq_len)", setup.seq_len)
    return batch


def replica_weight_bytes(spec, ro) -> float:
    """Weights on one GPU of an engine replica: dense layers split over TP, experts over
    EP, or over TP when EP is 1 (vLLM's fused MoE shards every expert over the TP group
    unless expert parallelism is enabled)."""
    dense, expert = rank_params(spec, range(spec.layers), tp=ro.tp, ep=ro.ep, first=True,
                                last=True, etp=ro.tp if ro.ep == 1 else 1)
    return float(spec.weight_bytes * (dense + expert))


def kv_capacity(setup: RLSetup) -> int:
    """KV-cache tokens of one attention-DP rank of an engine replica (a TP group):
    ``kv_fraction`` of each GPU's memory less its weights (vLLM's gpu_memory_utilization
    budget), over the per-token bytes of the GPU's share (GQA heads split over TP)."""
    ro, spec = setup.cfg.rollout, setup.res.model
    free = ro.kv_fraction * setup.res.device.hbm_bytes - replica_weight_bytes(spec, ro)
    per_token = kv_bytes_per_token(spec, KV_ELEM[ro.kv_dtype], ro.tp)
    return int(max(free, 0) // per_token)


def kv_need(tokens: int, layer_windows: list[int] | None) -> int:
    """KV tokens (counted over all layers, as :func:`kv_capacity` counts them) that one
    sequence of ``tokens`` holds: a sliding-window layer keeps only its last ``W``."""
    if not layer_windows:
        return tokens
    held = sum(min(tokens, w) if w else tokens for w in layer_windows)
    return -(-held // len(layer_windows))


def simulate_rl(setup: RLSetup, steps: int, *, rollout_costs: StepCosts | None = None,
                trainer_costs: TrainerCosts | None = None, on_solve=None,
                progress=None, cache: bool = True) -> RLRun:
    """Simulate ``steps`` RL steps. Without costs given, the engines price them
    (``cache``: keep the rollout step-cost surface on disk, moesim.load.surface)."""
    cfg, res = setup.cfg, setup.res
    ro, tr = cfg.rollout, cfg.train
    batches = [draw_batch(setup, s) for s in range(steps)]
    kv = kv_capacity(setup)
    windows = windows_of(res.model)
    longest = max(int((b.prompt + b.response).max()) for b in batches)
    if kv < kv_need(longest, windows):
        raise InputError(setup.source, "rl.rollout.kv_fraction",
                         f"room in each engine rank's KV cache for the longest sample ({longest} "
                         f"tokens); {kv} tokens fit beside the weights", ro.kv_fraction)
    gpus = list(res.topology.gpus)
    roll = gpus[:ro.gpus]
    train = roll if cfg.colocated else gpus[ro.gpus:ro.gpus + tr.gpus]
    sync = weight_sync(res.topology, res.model, train, roll, tp=tr.tp, pp=tr.pp, ep=tr.ep,
                       replica_gpus=ro.replica_gpus, per_tensor_s=cfg.weight_sync.per_tensor_s,
                       ipc=cfg.colocated, hbm_Bps=res.device.hbm_Bps, on_solve=on_solve,
                       sharded=cfg.weight_sync.method == "sharded")
    switch = switch_cost(res.model, tr.gpus, ro.replica_gpus) if cfg.colocated else (0.0, 0.0)
    if rollout_costs is None or trainer_costs is None:
        from moesim.rl.engine_costs import EngineTrainerCosts
        from moesim.rl.engine_costs import rollout_costs as surface
        gpn = res.scenario.gpus_per_node or len(gpus)
        if rollout_costs is None:
            rollout_costs = surface(
                setup.scenario, ro.replica_gpus, gpn, tp=ro.tp, ep=ro.ep, kv_dtype=ro.kv_dtype,
                max_batch=ro.max_batch, cache=cache, cuda_graphs=ro.cuda_graphs,
                prompt=max(1, int(np.mean([b.prompt.mean() for b in batches]))),
                response_max=max(int(b.response.max()) for b in batches))
        if trainer_costs is None:
            trainer_costs = EngineTrainerCosts(
                setup.scenario, tr.gpus, gpn, tp=tr.tp, pp=tr.pp, ep=tr.ep,
                seq_len=setup.seq_len, reward_model=cfg.reward.model)
    works = []
    partial = cfg.partial_rollouts
    for s, batch in enumerate(batches):
        works.append(step_work(cfg, batch, setup.seq_len, rollout_costs, kv, trainer_costs,
                               sync.time_s, switch, generation=not partial,
                               layer_windows=windows))
        if progress is not None and not partial:
            progress(s + 1, steps)
    if not partial:
        tl = schedule([w.durations for w in works], cfg.max_lag, cfg.colocated)
        return RLRun(setup, batches, works, tl, sync, kv, switch)

    def rollout(s: int, version: int) -> Rollout:
        if progress is not None and s:
            progress(s, steps)
        b = batches[s]
        return Rollout(b.prompt, b.response, rollout_costs, ro.replicas, kv, ro.max_batch,
                       ro.replica_gpus // ro.tp, version=version, layer_windows=windows)

    tl = schedule_partial([w.durations for w in works], cfg.max_lag, rollout,
                          keep_kv=cfg.kv_after_sync == "keep")
    for w, r in zip(works, tl.rollouts, strict=True):
        w.generation = gen = r.finish()
        w.durations = dataclasses.replace(w.durations, generate=gen.time_s - r.paused_s)
    if progress is not None:
        progress(steps, steps)
    return RLRun(setup, batches, works, tl, sync, kv, switch)


def rl_summary(target: str | Path, overrides=(), steps: int | None = None) -> dict:
    """The summary of ``steps`` (default ``rl.steps``) RL steps of a scenario (a sweep
    point's row)."""
    from moesim.rl.summary import summarize

    setup = resolve_rl(target, overrides)
    return summarize(simulate_rl(setup, steps or setup.cfg.steps))
