"""Phase times from the step engines, for one pool of an RL scenario.

- :class:`EngineTrainerCosts` (:class:`moesim.rl.phases.TrainerCosts`): a training step is
  ``moesim run``'s step (:func:`moesim.engine.api.simulate`, the scenario's engine) on the
  trainer pool's layout with ``ceil(rows / dp)`` micro-batches of one packed row per data
  -parallel replica; a log-prob pass is a serving prefill step
  (:func:`moesim.serve.run.simulate_serve`) of one row per GPU plus the LM head and
  log-softmax over every token (a prefill samples the last token only), times the rows
  each data-parallel group holds. Forward passes run with the pipeline stages folded into
  data parallelism (one stage). Times are memoised by their inputs: RL steps whose
  mini-batches pack into the same number of rows per replica are simulated once.
- :class:`EngineStepCosts` (:class:`moesim.load.costs.StepCosts`) for one rollout replica:
  decode steps simulated by ``moesim serve`` at a grid of (batch, context) points and
  interpolated linearly (exact where the step is linear in context: reading the KV cache),
  prefill steps at a grid of prompt counts. The serving issue's engine-backed surface
  replaces it when it lands (docs/rl.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import math

from moesim.engine.api import simulate
from moesim.model.costs import memory_op
from moesim.scenario.resolve import resolve
from moesim.scenario.schema import ClusterConfig, EngineConfig, ParallelConfig, Scenario
from moesim.serve.config import ServeConfig, serving_scenario
from moesim.serve.costs import head_kernels
from moesim.serve.run import simulate_serve


def pool_cluster(scn: Scenario, gpus: int, gpus_per_node: int) -> ClusterConfig:
    """The scenario's topology cut to ``gpus`` GPUs: whole nodes, or part of one node."""
    params = dict(scn.cluster.params)
    if gpus < gpus_per_node:
        params["gpus_per_node"] = gpus
        nodes = 1
    else:
        nodes = math.ceil(gpus / gpus_per_node)
    return dataclasses.replace(scn.cluster, nodes=nodes, params=params)


def _serve_time(scn: Scenario, cfg: ServeConfig) -> tuple[float, object]:
    res = resolve(serving_scenario(scn, cfg))
    return float(simulate_serve(res, cfg, record_series=False).summary["step_time_s"]), res


class EngineTrainerCosts:
    def __init__(self, scn: Scenario, gpus: int, gpus_per_node: int, *, tp: int, pp: int,
                 ep: int, seq_len: int, reward_model: dict | None = None) -> None:
        par = dataclasses.replace(scn.parallel, tp=tp, pp=pp, ep=ep, dp=None)
        self.scn = dataclasses.replace(
            scn, cluster=pool_cluster(scn, gpus, gpus_per_node), parallel=par,
            schedule=dataclasses.replace(scn.schedule, micro_batch_size=1, seq_len=seq_len),
            serve={})
        self.gpus, self.tp, self.pp, self.ep, self.seq_len = gpus, tp, pp, ep, seq_len
        self.dp = gpus // (tp * pp)
        self.reward_model = reward_model
        self.memo: dict[tuple, float] = {}
        self.simulated = 0

    def train_step_s(self, rows: int) -> float:
        m = max(1, math.ceil(rows / self.dp))
        if self.scn.schedule.kind == "interleaved":
            m = math.ceil(m / self.pp) * self.pp
        key = ("train", m)
        if key not in self.memo:
            scn = dataclasses.replace(self.scn, schedule=dataclasses.replace(
                self.scn.schedule, microbatches=m))
            self.memo[key] = float(simulate(resolve(scn)).summary["step_time_s"])
            self.simulated += 1
        return self.memo[key]

    def forward_s(self, rows: int, model: dict | None = None) -> float:
        """``ceil(rows / groups)`` rows per data-parallel group, each priced as the
        simulated pass over one row per group (rows of ``seq_len`` tokens fill the GEMMs
        already; routing a whole batch of rows costs minutes of CPU at DeepSeek-V3 size)."""
        groups = self.gpus // self.tp            # data-parallel groups, stages folded
        per_group = max(1, math.ceil(rows / groups))
        key = ("fwd", None if model is None else repr(sorted(model.items())))
        if key not in self.memo:
            scn = self.scn if model is None else dataclasses.replace(self.scn, model=model)
            backend = scn.parallel.ep_backend.kind if self.ep > 1 else "nccl"
            # one request per GPU: a TP group computes tp rows in the step
            cfg = ServeConfig(phase="prefill", batch_per_gpu=1, prompt=self.seq_len,
                              output=1, tp=self.tp, ep=self.ep, ep_backend=backend)
            step, res = _serve_time(scn, cfg)
            per_row = step / self.tp
            tokens = self.seq_len - 1
            ks = head_kernels(res.model, tokens, self.tp)
            ks.append(memory_op("logprob_gather", 4 * tokens, tokens))
            self.memo[key] = per_row + sum(res.compute.time_s(k) for k in ks)
            self.simulated += 1
        return per_group * self.memo[key]

    def reward_model_s(self, rows: int) -> float:
        return self.forward_s(rows, self.reward_model or dict(self.scn.model))


#: decode grid: running sequences per GPU of a replica
BATCH_PER_GPU = (1, 4, 16, 64, 256)
#: prefill grid: prompts per GPU admitted in one step (linear beyond the last point:
#: a prefill of many prompts is compute-bound, its time proportional to the tokens)
PROMPTS_PER_GPU = (1, 8)


class EngineStepCosts:
    """Decode and prefill step times of one engine replica, interpolated from serving
    steps simulated at grid points (each simulated once)."""

    def __init__(self, scn: Scenario, replica_gpus: int, gpus_per_node: int, *, tp: int,
                 ep: int, kv_dtype: str, max_batch: int, contexts: tuple[int, int],
                 prompt: int) -> None:
        self.scn = dataclasses.replace(
            scn, cluster=pool_cluster(scn, replica_gpus, gpus_per_node), serve={},
            engine=EngineConfig(mode="fast"),
            parallel=ParallelConfig(order=scn.parallel.order))
        self.g, self.tp, self.ep, self.kv_dtype = replica_gpus, tp, ep, kv_dtype
        top = max(1, math.ceil(max_batch / replica_gpus))
        self.batch_grid = sorted({b for b in BATCH_PER_GPU if b < top} | {top})
        self.ctx_grid = sorted(set(contexts))
        self.prompt = max(1, int(prompt))
        self.prefill_grid = sorted({min(p, top) for p in PROMPTS_PER_GPU})
        self.memo: dict[tuple, float] = {}
        self.simulated = 0

    def _sim(self, phase: str, per_gpu: int, ctx: int) -> float:
        key = (phase, per_gpu, ctx)
        if key not in self.memo:
            cfg = ServeConfig(phase=phase, batch_per_gpu=per_gpu, prompt=ctx, context=ctx,
                              output=1, tp=self.tp, ep=self.ep, kv_dtype=self.kv_dtype)
            self.memo[key] = _serve_time(self.scn, cfg)[0]
            self.simulated += 1
        return self.memo[key]

    def decode_s(self, batch: int, context: float) -> float:
        per_gpu = max(1.0, batch / self.g)
        return _interp2(self.batch_grid, self.ctx_grid, per_gpu, context,
                        lambda b, c: self._sim("decode", b, c))

    def prefill_s(self, tokens: int, prompts: int) -> float:
        per_gpu = max(1.0, prompts / self.g)
        # a grid step at the mean prompt, scaled to the tokens actually prefilled
        base = _interp1(self.prefill_grid, per_gpu,
                        lambda p: self._sim("prefill", p, self.prompt))
        return base * tokens / max(1.0, prompts * self.prompt)


def _bracket(grid: list[int], x: float) -> tuple[int, int, float]:
    if x <= grid[0] or len(grid) == 1:
        return grid[0], grid[0], 0.0
    if x >= grid[-1]:
        return grid[-2], grid[-1], (x - grid[-2]) / (grid[-1] - grid[-2])
    i = bisect.bisect_right(grid, x)
    lo, hi = grid[i - 1], grid[i]
    return lo, hi, (x - lo) / (hi - lo)


def _interp1(grid, x, f) -> float:
    lo, hi, w = _bracket(grid, x)
    return f(lo) if w == 0 else (1 - w) * f(lo) + w * f(hi)


def _interp2(bgrid, cgrid, b, c, f) -> float:
    return _interp1(bgrid, b, lambda bb: _interp1(cgrid, c, lambda cc: f(bb, cc)))
