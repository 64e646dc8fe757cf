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
- :func:`rollout_costs` (a :class:`moesim.traffic.step_costs.StepCosts`) for one rollout replica:
  the serving issue's step-cost surface (:mod:`moesim.traffic.surface`) on a grid sized to
  the RL step's batches and contexts.
"""

from __future__ import annotations

import dataclasses
import math

from moesim.model.costs import memory_op
from moesim.model.read import ModelSection
from moesim.program.host_dispatch import layer_host_s, pass_extra_s
from moesim.rl.host_timeline import timeline_row_s
from moesim.rl.packed_attention import per_sequence, row_sequences
from moesim.rl.trainer_kernels import with_sort_chunks
from moesim.scenario.schema import EngineConfig, ParallelConfig, Scenario
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve.config import serving_scenario
from moesim.serve.costs import head_kernels
from moesim.serve.run import simulate_serve
from moesim.wiring import resolve, simulate


def _serve_time(scn: Scenario, cfg: ServeConfig, sp: bool = False,
                seqs=None) -> tuple[float, object]:
    """The serving step of ``cfg`` on ``scn`` (its time, its resolved scenario), with
    sequence parallelism ``sp`` (a Megatron trainer's forward pass: its norms on the
    sequence shard and its TP exchanges as reduce-scatters and all-gathers); ``seqs``:
    rows' packed sequences, core attention priced per sequence (:mod:`moesim.rl.packed_attention`)."""
    one = serving_scenario(scn, cfg)
    if sp:
        one = dataclasses.replace(one, parallel=dataclasses.replace(
            one.parallel, sequence_parallel=True))
    res = with_sort_chunks(resolve(one))
    step = simulate_serve(per_sequence(res, cfg.prompt, seqs), cfg, record_series=False)
    return float(step.summary["step_time_s"]), res


def trainer_scenario(scn: Scenario, gpus: int, gpus_per_node: int, *, tp: int, pp: int,
                     ep: int, seq_len: int, zero: int = 0, cp: int = 1) -> Scenario:
    """The scenario the trainer pool's steps are simulated (and its memory priced) on:
    the pool's GPUs, its layout and ZeRO stage over the scenario's ``parallel`` section
    (sequence parallelism, expert TP, pipeline layouts, the EP backend as written), its
    ``memory`` (recompute) and ``schedule`` (kind, buckets), one packed row of ``seq_len``
    tokens per micro-batch."""
    par = dataclasses.replace(scn.parallel, tp=tp, pp=pp, ep=ep, cp=cp, dp=None, zero=zero)
    return dataclasses.replace(
        scn, cluster=scn.cluster.pool(gpus, gpus_per_node), parallel=par,
        schedule=dataclasses.replace(scn.schedule, micro_batch_size=1, seq_len=seq_len),
        serve={})


def gpus_per_node(setup) -> int:
    """GPUs per node of an RL setup's cluster (:class:`moesim.rl.run.RLSetup`)."""
    return setup.res.scenario.gpus_per_node or len(setup.res.topology.gpus)


def trainer_scenario_of(setup, microbatches: int = 1) -> Scenario:
    """The scenario the trainer's steps are simulated and its memory priced on
    (:func:`moesim.rl.engine_costs.trainer_scenario`) with ``microbatches`` rows."""
    tr = setup.cfg.train
    scn = trainer_scenario(setup.scenario, tr.gpus, gpus_per_node(setup), tp=tr.tp,
                           pp=tr.pp, ep=tr.ep, cp=tr.cp, zero=tr.zero, seq_len=setup.seq_len)
    return dataclasses.replace(scn, schedule=dataclasses.replace(scn.schedule,
                                                                 microbatches=microbatches))


class EngineTrainerCosts:
    def __init__(self, scn: Scenario, gpus: int, gpus_per_node: int, *, tp: int, pp: int,
                 ep: int, seq_len: int, reward_model: ModelSection | None = None,
                 zero: int = 0, cp: int = 1, loss_logprob: str = "none",
                 logprob_softmax: str = "none") -> None:
        self.scn = trainer_scenario(scn, gpus, gpus_per_node, tp=tp, pp=pp, ep=ep,
                                    seq_len=seq_len, zero=zero, cp=cp)
        self.gpus, self.tp, self.pp, self.ep, self.seq_len = gpus, tp, pp, ep, seq_len
        self.cp = cp
        self.dp = gpus // (tp * cp * pp)
        self.reward_model = reward_model
        self.loss_logprob = loss_logprob
        #: rl.train.logprob_softmax: "nemo" / "nemo-v06" add NeMo RL's fp32 log-softmax
        #: to every log-prob row (moesim.rl.loss.logprob_extra_bytes)
        self.logprob_softmax = logprob_softmax
        rl = getattr(scn, "rl", None)
        #: rl.train.host_dispatch (moesim.program.host_dispatch): "eager" bounds each MoE
        #: layer's forward by the host time of its ops between Megatron's host syncs
        self.host_dispatch = getattr(getattr(rl, "train", None), "host_dispatch", "none")
        #: rl.train.te_gemm_call: TE's per-expert GEMM call's host price on the timeline
        self.te_gemm_call = getattr(getattr(rl, "train", None), "te_gemm_call", "launch")
        #: rl.train.packed_attention (moesim.rl.packed_attention): "per_sequence" prices a
        #: packed row's core attention per sequence of the rows it is given
        self.packed_attention = getattr(getattr(rl, "train", None), "packed_attention", "row")
        self.memo: dict[tuple, float] = {}
        #: micro-batches per replica -> the simulated step's ``breakdown_s``
        self.breakdowns: dict[int, dict] = {}
        self.experts: dict[int, dict | None] = {}
        self.simulated = 0

    def micro_batches(self, rows: int) -> int:
        """Micro-batches the busiest data-parallel replica runs for ``rows`` rows."""
        m = max(1, math.ceil(rows / self.dp))
        if self.scn.schedule.kind == "interleaved":
            m = math.ceil(m / self.pp) * self.pp
        return m

    def loss_logprob_s(self, rows: int) -> float:
        """NeMo RL's loss log-probs over ``rows`` rows beyond the fused loss
        (:mod:`moesim.rl.loss`; 0 unless ``rl.train.loss_logprob: nemo``): one
        memory-bound pass per micro-batch of the last stage."""
        if self.loss_logprob != "nemo" or not rows:
            return 0.0
        key = ("loss",)
        if key not in self.memo:
            from moesim.rl.loss import elements, extra_bytes

            res = resolve(self.scn)
            n = elements(self.seq_len, res.model.vocab, self.tp, self.cp)
            op = memory_op("loss_logprob", extra_bytes(self.seq_len, res.model.vocab,
                                                       self.tp, self.cp), 12 * n)
            self.memo[key] = float(res.compute.time_s(op))
        return self.micro_batches(rows) * self.memo[key]

    def row_seqs(self, rows: int):
        """The packed sequences of ``rows`` with ``rl.train.packed_attention: per_sequence``
        (:func:`moesim.rl.packed_attention.row_sequences`), else None."""
        return row_sequences(rows, self.pp) if self.packed_attention == "per_sequence" else None

    def train_step_s(self, rows: int) -> float:
        m = self.micro_batches(rows)
        seqs = self.row_seqs(rows)
        key = ("train", m) if seqs is None else ("train", m, seqs)
        if key not in self.memo:
            scn = dataclasses.replace(self.scn, schedule=dataclasses.replace(
                self.scn.schedule, microbatches=m))
            summary = simulate(per_sequence(with_sort_chunks(resolve(scn)), self.seq_len,
                                            seqs)).summary
            self.memo[key] = float(summary["step_time_s"])
            self.breakdowns[m] = dict(summary.get("breakdown_s", {}))
            #: micro-batches per replica -> the simulated step's ``experts`` statistics
            self.experts[m] = summary.get("experts")
            self.simulated += 1
        if self.host_dispatch != "none":      # the forwards on the 1F1B path: m + pp - 1
            return self.memo[key] + (m + self.pp - 1) * self.host_pass_s(self.seq_len) / self.pp
        return self.memo[key]

    def host_pass_s(self, row: int) -> float:
        """Seconds one forward pass over a row of ``row`` tokens gains when each MoE layer
        is bounded by the host's eager dispatch (``rl.train.host_dispatch: eager``,
        :mod:`moesim.program.host_dispatch`): every MoE layer takes ``max(G, H)``, ``G``
        the pass's GPU time per layer (the simulated forward of one row, LM head left
        out, over the model's layers), ``H`` the host time of one layer's ops; 0 with the knob off."""
        if self.host_dispatch == "none":
            return 0.0
        key = ("host", row)
        if key not in self.memo:
            spec = resolve(self.scn).model
            moe = sum(1 for i in range(spec.layers) if spec.is_moe_layer(i))
            if not moe:
                self.memo[key] = 0.0
            else:
                self._row_s(row, None)          # the layers' part of the pass, no LM head
                gpu_layer = self.memo[("layers", row, None)] / spec.layers
                host = layer_host_s(max(1, spec.n_experts // self.ep), self.tp)
                self.memo[key] = (pass_extra_s(moe, gpu_layer, host)
                                  if self.host_dispatch == "eager" else
                                  timeline_row_s(self.scn, row, moe, gpu_layer, self.ep,
                                                 self.te_gemm_call))
        return self.memo[key]

    def forward_s(self, rows: int, tokens: int | None = None,
                  model: ModelSection | None = None) -> float:
        """``ceil(rows / groups)`` rows of ``tokens`` tokens (None: ``seq_len``) per
        data-parallel group, each priced as the simulated pass over one row per group
        (rows of thousands of tokens fill the GEMMs already; routing a whole batch of rows
        costs minutes of CPU at DeepSeek-V3 size)."""
        groups = self.gpus // self.tp            # data-parallel groups, stages folded
        per_group = max(1, math.ceil(rows / groups))
        row = tokens or self.seq_len
        t = self._row_s(row, model, self.row_seqs(rows))
        if model is None and self.host_dispatch != "none":
            t += self.host_pass_s(row)
        if model is None:
            t += self.logprob_softmax_s(row)
        return per_group * t

    def logprob_softmax_s(self, row: int) -> float:
        """Seconds NeMo RL's fp32 cast and log-softmax over one log-prob row of ``row``
        tokens add to the pass (``rl.train.logprob_softmax``, :mod:`moesim.rl.loss`):
        one memory-bound op; 0 with the knob off."""
        if self.logprob_softmax == "none":
            return 0.0
        key = ("lp_softmax", row)
        if key not in self.memo:
            from moesim.rl.loss import elements, logprob_extra_bytes

            res = resolve(self.scn)
            n = elements(row, res.model.vocab, self.tp, self.cp)
            op = memory_op("logprob_softmax", logprob_extra_bytes(
                row, res.model.vocab, self.tp, self.cp, self.logprob_softmax), 4 * n)
            self.memo[key] = float(res.compute.time_s(op))
        return self.memo[key]

    def _row_s(self, row: int, model: ModelSection | None, seqs=None) -> float:
        """The simulated forward pass over one row of ``row`` tokens (memoised; ``seqs``:
        rows' packed sequences, core attention priced per sequence)."""
        key = ("fwd", row, None if model is None else repr(sorted(model.as_dict().items())))
        key = key if seqs is None else key + (seqs,)
        if key not in self.memo:
            scn = self.scn if model is None else dataclasses.replace(self.scn, model=model)
            # the trainer's pass (Megatron-Core, Transformer Engine's GroupedLinear): each
            # expert launched on its own, not serving's grouped default
            scn = dataclasses.replace(scn, compute=scn.compute.with_default(
                "expert_launches", "per_expert", scn.source))
            backend = scn.parallel.ep_backend.kind if self.ep > 1 else "nccl"
            # one request per GPU: a TP group computes tp rows in the step
            cfg = ServeConfig(phase="prefill", batch_per_gpu=1, prompt=row,
                              output=1, tp=self.tp, ep=self.ep, ep_backend=backend)
            # the trainer's sequence parallelism: NeMo RL's Megatron log-prob pass runs
            # the training model's forward
            sp = bool(self.scn.parallel.sequence_parallel) and self.tp > 1
            step, res = _serve_time(scn, cfg, sp, seqs)
            per_row = step / self.tp
            n = row - 1
            ks = head_kernels(res.model, n, self.tp, sp)
            ks.append(memory_op("logprob_gather", 4 * n, n))
            self.memo[key] = per_row + sum(res.compute.time_s(k) for k in ks)
            self.memo[("layers",) + key[1:]] = per_row
            self.simulated += 1
        return self.memo[key]

    def reward_model_s(self, rows: int) -> float:
        return self.forward_s(rows, model=self.reward_model or self.scn.model)


def rollout_costs(scn: Scenario, replica_gpus: int, gpus_per_node: int, *, tp: int, ep: int,
                  kv_dtype: str, max_batch: int, prompt: int, response_max: int,
                  cache: bool = True, cuda_graphs: bool = False, host_overhead: str = "none"):
    """The serving issue's engine-backed step-cost surface
    (:class:`moesim.traffic.surface.EngineStepCosts`) of one engine replica: decode steps at
    1 .. ``max_batch`` sequences per attention-DP rank and contexts from the prompt to
    the longest sample, prefill steps of 1 .. 64 prompts of the mean prompt length (linear
    beyond), each simulated once by ``moesim serve`` on the fast engine (cached on disk
    by the scenario's content unless ``cache`` is false)."""
    from moesim.traffic.surface import EngineStepCosts

    one = dataclasses.replace(scn, cluster=scn.cluster.pool(replica_gpus, gpus_per_node),
                              serve={}, engine=EngineConfig(mode="fast"),
                              parallel=ParallelConfig(order=scn.parallel.order))
    cfg = ServeConfig(phase="decode", batch_per_gpu=1, prompt=prompt, context=prompt,
                      output=1, tp=tp, ep=ep, kv_dtype=kv_dtype, cuda_graphs=cuda_graphs,
                      host_overhead=host_overhead)
    res = resolve(serving_scenario(one, cfg))
    return EngineStepCosts(
        res, cfg, batches=sorted({b for b in BATCHES if b < max_batch} | {max_batch}),
        contexts=sorted({prompt, prompt + response_max // 2, prompt + response_max}),
        prompts=sorted({p for p in PROMPTS if p < max_batch} | {min(max_batch, 64)}),
        prompt_lens=[prompt], cache=cache)


#: decode grid: running sequences per attention-DP rank
BATCHES = (1, 4, 16, 64, 256)
#: prefill grid: prompts per attention-DP rank admitted in one step (linear beyond)
PROMPTS = (1, 8)
