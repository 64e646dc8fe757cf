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
from moesim.rl.config import rl_config
from moesim.rl.cpu_optimizer import step_copy_s
from moesim.rl.engine_costs import gpus_per_node, trainer_scenario_of
from moesim.rl.executor import ExecutorStepCosts
from moesim.rl.generate import Rollout, stream
from moesim.rl.loop import Timeline, schedule, schedule_partial
from moesim.rl.memory import reference_swap_s, replica_weight_bytes, rl_fits
from moesim.rl.offload import HostMoves, setup_moves
from moesim.rl.offload_pinned import concurrent_rates
from moesim.rl.offload_verl import VerlMoves, verl_moves
from moesim.rl.phases import Batch, StepWork, TrainerCosts, step_work
from moesim.rl.prefix_cache import PrefixCacheCosts
from moesim.rl.rollout_fp8 import rollout_scenario
from moesim.rl.sampler_v1 import SamplerStepCosts
from moesim.rl.step_fixed import StepFixedCosts
from moesim.rl.sync import PCIE_Bps, SyncResult, switch_cost, weight_sync
from moesim.rl.worker_post import PostProcessCosts
from moesim.scenario import load_scenario
from moesim.scenario.blame import blame_overrides
from moesim.scenario.resolved import Resolved
from moesim.scenario.schema import ParallelConfig, Scenario
from moesim.scenario.sections.rl import RLConfig
from moesim.serve.host import STEP_FIXED_ENGINES
from moesim.serve.kv import kv_bytes_per_token
from moesim.traffic.deploy import windows_of
from moesim.traffic.lengths import draw
from moesim.traffic.step_costs import StepCosts
from moesim.wiring import resolve

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

    def error(self, field: str, expected: str, got) -> InputError:
        """An error about ``field`` of the scenario, blamed on the command line when a
        ``--set`` gave it."""
        return blame_overrides(InputError(self.source, field, expected, got), self.source,
                               list(self.scenario.overrides))


@dataclass
class RLRun:
    setup: RLSetup
    batches: list[Batch]
    works: list[StepWork]
    timeline: Timeline
    sync: SyncResult
    kv_tokens: int              # KV-cache tokens per attention-DP rank of a replica
    switch_s: tuple[float, float]
    fits: list = dataclasses.field(default_factory=list)   # moesim.memory.fit.Fit
    moves: HostMoves | VerlMoves | None = None   # rl.train.offload: nemo or verl
    trainer_costs: object = None        # the TrainerCosts the steps were priced with


def refuse_unused(scn: Scenario) -> None:
    """What moesim rl sets itself and a scenario may not: the trainer's micro-batches
    (each mini-batch packed into rows of ``rl.train.seq_len`` tokens, one row per
    micro-batch, :mod:`moesim.rl.packing`)."""
    for name in ("microbatches", "micro_batch_size"):
        if getattr(scn.schedule, name) != 1:
            raise InputError(scn.source, f"schedule.{name}", "1 or omitted (moesim rl packs "
                             "each mini-batch into rows of rl.train.seq_len tokens, one row "
                             "per micro-batch)", getattr(scn.schedule, name))


def _check_reward_model(cfg: RLConfig, source: str) -> None:
    """A reward model's section is checked as a model of its own: its errors name
    ``rl.reward.model.FIELD``, not the policy's ``model.FIELD``."""
    if cfg.reward.model is None:
        return
    from moesim.model.read import model_from_dict

    try:
        model_from_dict(cfg.reward.model, source)
    except InputError as err:
        field = err.field.removeprefix("model.").removeprefix("model")
        raise InputError(source, "rl.reward.model" + (f".{field}" if field else ""),
                         *err.args[2:]) from None


def _check_target(target: str | Path) -> None:
    """A path that exists but is no regular file (``/dev/null``, a FIFO) is said to be
    so, not called missing."""
    p = Path(target)
    if p.exists() and not p.is_file() and not p.is_dir():
        raise InputError(str(target), "", "a scenario YAML file (or a shipped scenario name)",
                         "not a regular file (a device, a pipe or a socket)")


def resolve_rl(target: str | Path, overrides=()) -> RLSetup:
    """Load a scenario with an ``rl`` section and check it against the cluster."""
    _check_target(target)
    scn = load_scenario(target, list(overrides))
    try:
        refuse_unused(scn)
        whole = dataclasses.replace(scn, parallel=ParallelConfig(
            order=scn.parallel.order, ep_backend=scn.parallel.ep_backend), serve=None)
        res = resolve(whole)
        cfg = rl_config(scn.rl, scn.source, world=res.layout.world, parallel=scn.parallel)
        _check_reward_model(cfg, scn.source)
        # the scenario as written (its parallel section the trainer's, rl.train over it;
        # dp, when not written, the whole cluster's as resolved: the trainer's is the pool's)
        par = scn.parallel if scn.parallel.dp is not None else dataclasses.replace(
            scn.parallel, dp=res.scenario.parallel.dp)
        setup = RLSetup(dataclasses.replace(res.scenario, parallel=par), res, cfg,
                        cfg.train.seq_len or scn.schedule.seq_len)
        resolve(trainer_scenario_of(setup))     # the trainer's layout checked as moesim run's
    except InputError as err:
        raise blame_overrides(err, scn.source, list(overrides)) from None
    return setup


def draw_batch(setup: RLSetup, step: int) -> Batch:
    """Step ``step``'s samples: ``prompts_per_step`` prompts, each repeated for its group
    of ``samples_per_prompt`` responses (seeded by the scenario's seed and the step).
    ``rl.longest_response: limit``: the step's longest response is set to the generation
    limit (``rl.response_tokens.max``), so a synchronous generation runs as many decode
    steps as the limit allows; the law's other draws are kept."""
    cfg = setup.cfg
    rng = np.random.default_rng([setup.scenario.seed, step])
    prompts = draw(cfg.prompt_tokens, rng, cfg.prompts_per_step, source=setup.source,
                   field="rl.prompt_tokens")
    response = draw(cfg.response_tokens, rng, cfg.samples_per_step, source=setup.source,
                    field="rl.response_tokens")
    if cfg.longest_response == "limit":
        limit = cfg.response_tokens.max
        if limit is None:
            raise setup.error("rl.response_tokens.max", "the generation limit, a number of "
                              "tokens (rl.longest_response: limit sets each step's longest "
                              "response to it)", None)
        response[int(np.argmax(response))] = limit
    batch = Batch(np.repeat(prompts, cfg.samples_per_prompt), response)
    longest = int((batch.prompt + batch.response).max())
    if longest > setup.seq_len:
        raise setup.error("rl.train.seq_len", f"at least the longest sample, prompt + "
                          f"response = {longest} tokens (the trainer packs samples into rows "
                          "of seq_len)", setup.seq_len)
    lp = cfg.train.logprob_mb_tokens
    if lp is not None and longest > lp:
        raise setup.error("rl.train.logprob_mb_tokens", f"at least the longest sample, prompt "
                          f"+ response = {longest} tokens (the log-prob passes pack samples "
                          "into rows of logprob_mb_tokens)", lp)
    return batch


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


def draw_batches(setup: RLSetup, steps: int) -> list[Batch]:
    return [draw_batch(setup, s) for s in range(steps)]


def simulate_rl(setup: RLSetup, steps: int, *, rollout_costs: StepCosts | None = None,
                trainer_costs: TrainerCosts | None = None, on_solve=None,
                progress=None, cache: bool = True, fits: list | None = None) -> RLRun:
    """Simulate ``steps`` RL steps. Without costs given, the engines price them
    (``cache``: keep the rollout step-cost surface on disk, moesim.traffic.surface).
    ``fits``: the pools' memory verdicts (default: :func:`moesim.rl.memory.rl_fits`)."""
    cfg, res = setup.cfg, setup.res
    ro, tr = cfg.rollout, cfg.train
    if ro.step_fixed != "none" and ro.host_overhead not in STEP_FIXED_ENGINES:
        raise setup.error("rl.rollout.step_fixed", "none unless rl.rollout.host_overhead "
                          f"is one of {', '.join(STEP_FIXED_ENGINES)}", ro.step_fixed)
    if ro.precision == "fp8" and (cfg.weight_sync.method == "sharded"
                                  or not cfg.weight_sync.per_gpu):
        raise setup.error("rl.rollout.precision", "bf16 unless rl.weight_sync has per_gpu: "
                          "true and method nccl or ipc (NeMo RL's refit, whose engines cast "
                          "the bf16 weights they receive to FP8)", ro.precision)
    batches = draw_batches(setup, steps)
    if fits is None:
        fits = rl_fits(setup, batches)
    kv = kv_capacity(setup)
    windows = windows_of(res.model)
    longest = max(int((b.prompt + b.response).max()) for b in batches)
    if kv < kv_need(longest, windows):
        raise setup.error("rl.rollout.kv_fraction", f"room in each engine rank's KV cache "
                          f"for the longest sample ({longest} tokens); {kv} tokens fit beside "
                          "the weights", ro.kv_fraction)
    gpus = list(res.topology.gpus)
    roll = gpus[:ro.gpus]
    train = roll if cfg.colocated else gpus[ro.gpus:ro.gpus + tr.gpus]
    sync = weight_sync(res.topology, res.model, train, roll, tp=tr.tp, pp=tr.pp, ep=tr.ep,
                       replica_gpus=ro.replica_gpus, per_tensor_s=cfg.weight_sync.per_tensor_s,
                       ipc=cfg.colocated, hbm_Bps=res.device.hbm_Bps, on_solve=on_solve,
                       sharded=cfg.weight_sync.method == "sharded",
                       per_gpu=cfg.weight_sync.per_gpu, calls=cfg.weight_sync.calls,
                       etp=setup.scenario.parallel.etp, hbm_bytes=res.device.hbm_bytes,
                       launch_s=res.device.launch_overhead_s,
                       gather=cfg.weight_sync.gather, precision=ro.precision)
    switch = switch_cost(res.model, tr.gpus, ro.replica_gpus) if cfg.colocated else (0.0, 0.0)
    # NeMo RL's host moves (rl.train.offload: nemo) or verl's (verl: moesim.rl.offload_verl)
    moves = (verl_moves(setup, PCIE_Bps) if tr.offload == "verl" and cfg.colocated
             else setup_moves(setup, PCIE_Bps))
    if moves is not None:       # NeMo RL's moves replace the switch's (moesim.rl.offload)
        switch = (moves.engine_sleep_s, moves.refit_s)
    if rollout_costs is None or trainer_costs is None:
        from moesim.rl.engine_costs import EngineTrainerCosts
        from moesim.rl.engine_costs import rollout_costs as surface
        gpn = gpus_per_node(setup)
        if rollout_costs is None:
            rollout_costs = surface(
                rollout_scenario(setup.scenario, ro.precision), ro.replica_gpus, gpn,
                tp=ro.tp, ep=ro.ep, kv_dtype=ro.kv_dtype,
                max_batch=ro.max_batch, cache=cache, cuda_graphs=ro.cuda_graphs,
                host_overhead=ro.host_overhead,
                prompt=max(1, int(np.mean([b.prompt.mean() for b in batches]))),
                response_max=max(int(b.response.max()) for b in batches))
        if trainer_costs is None:
            trainer_costs = EngineTrainerCosts(
                setup.scenario, tr.gpus, gpn, tp=tr.tp, pp=tr.pp, ep=tr.ep, cp=tr.cp,
                seq_len=setup.seq_len, reward_model=cfg.reward.model, zero=tr.zero,
                loss_logprob=tr.loss_logprob, logprob_softmax=tr.logprob_softmax)
    if ro.sampler != "none":         # vLLM 0.9.0's V1 sampler (moesim.rl.sampler_v1)
        rollout_costs = SamplerStepCosts(rollout_costs, res.compute, res.model.vocab, ro.tp)
    if ro.executor != "none":        # vLLM's Ray executor per step (moesim.rl.executor)
        rollout_costs = ExecutorStepCosts(rollout_costs, ro.executor)
    if ro.step_fixed != "none":      # vLLM V1's CPU time per step (moesim.rl.step_fixed)
        rollout_costs = StepFixedCosts(rollout_costs, ro.step_fixed)
    if ro.prefix_cache != "none":    # a group's shared prompt cached (moesim.rl.prefix_cache)
        rollout_costs = PrefixCacheCosts(rollout_costs, cfg.samples_per_prompt)
    if ro.post_process != "none":    # the worker's loop after vLLM (moesim.rl.worker_post)
        rollout_costs = PostProcessCosts(rollout_costs, ro.post_process)
    works = []
    # a stream prices its own in-flight weight updates (moesim.rl.generate.stream)
    stream_gen = cfg.generation == "stream"
    partial = cfg.partial_rollouts and not stream_gen
    # pageable-concurrent: the swap's pinned copies with the host's GPUs copying at once
    swap = reference_swap_s(res.model, tr, PCIE_Bps, *concurrent_rates(tr, PCIE_Bps))
    # rl.train.optimizer cpu: each optimizer step's copies (moesim.rl.cpu_optimizer)
    opt_copy = step_copy_s(res.model, tr, PCIE_Bps) if tr.optimizer == "cpu" else 0.0
    for s, batch in enumerate(batches):
        # a batch's own generation only where neither the loop nor the stream replaces it
        works.append(step_work(cfg, batch, setup.seq_len, rollout_costs, kv, trainer_costs,
                               sync.time_s, switch, generation=not (partial or stream_gen),
                               layer_windows=windows, reference_swap_s=swap,
                               logprob_prep_s=moves.logprob_prep_s if moves else 0.0,
                               train_prep_s=moves.train_prep_s if moves else 0.0,
                               optimizer_copy_s=opt_copy))
        if progress is not None and not partial:
            progress(s + 1, steps)
    if stream_gen:
        streamed(setup, batches, works, rollout_costs, kv, windows)
    if not partial:
        tl = schedule([w.durations for w in works], cfg.max_lag, cfg.colocated)
        return RLRun(setup, batches, works, tl, sync, kv, switch, fits, moves, trainer_costs)

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
    return RLRun(setup, batches, works, tl, sync, kv, switch, fits, moves, trainer_costs)


def streamed(setup: RLSetup, batches, works, costs, kv: int, windows) -> None:
    """``rl.generation: stream``: every step's generation from one stream of the steps'
    samples (:func:`moesim.rl.generate.stream`), in place of the batch's."""
    cfg, ro = setup.cfg, setup.cfg.rollout
    if cfg.colocated or cfg.max_lag < 1:
        raise setup.error("rl.generation", "batch unless disaggregated with max_lag >= 1 (a "
                          "stream runs ahead of the weights)", cfg.generation)
    for knob in ("post_process", "prefix_cache"):   # both act on a batch's generate call
        if getattr(ro, knob) != "none":
            raise setup.error(f"rl.rollout.{knob}", "none under rl.generation: stream (it "
                              "prices a batch's generate call; the stream has none)",
                              getattr(ro, knob))
    gens = stream([b.prompt for b in batches], [b.response for b in batches], costs,
                  ro.replicas, kv, ro.max_batch, ro.replica_gpus // ro.tp,
                  layer_windows=windows, max_lag=cfg.max_lag,
                  trainer_s=[sum(w.durations.trainer.values()) for w in works],
                  sync_s=works[0].durations.weight_sync if works else 0.0,
                  partial=cfg.kv_after_sync if cfg.partial_rollouts else None)
    for w, g in zip(works, gens, strict=True):
        w.generation = g
        # the syncs inside the stream take the rollout pool on the timeline already
        w.durations = dataclasses.replace(w.durations, generate=g.time_s - g.paused_s)


def rl_summary(target: str | Path, overrides=(), steps: int | None = None) -> dict:
    """The summary of ``steps`` (default ``rl.steps``) RL steps of a scenario (a sweep
    point's row)."""
    from moesim.rl.summary import summarize

    setup = resolve_rl(target, overrides)
    return summarize(simulate_rl(setup, steps or setup.cfg.steps))
