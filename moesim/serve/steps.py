"""Many serving steps of one deployment, priced one after the other (issue 23).

A step-cost surface, a benchmark of consecutive decode steps or a request-level check
asks for thousands of steps that differ only in the ``serve`` fields (batch, context,
prompt, phase, routing step). :class:`ServeSteps` keeps what does not change between them:

- the resolved deployment (topology graph and routes, layout, model, compute model): a
  step whose layout is the same (``serving_scenario``'s ``parallel`` section) reuses it
  with the step's schedule and overlap put in, instead of resolving again;
- on the fast engine, the network (every EP group's routes and link incidence, ring
  costs) and the expert kernels' prices per token count
  (:class:`moesim.engine.fast.forward.ForwardState`);
- the routing law of every (seed, routing step, MoE layer): expert shares, inclusion
  probabilities and the DeepEP copy ratios (the builder's routing cache), which depend
  on neither the batch nor the context.

A step priced here equals the same step resolved and simulated afresh (the same floats:
``tests/test_serve_steps.py``); it keeps no spans and builds no summary or memory table.
"""

from __future__ import annotations

import dataclasses

from moesim.scenario.resolved import Resolved
from moesim.serve import mtp
from moesim.serve.config import ServeConfig, serving_scenario
from moesim.serve.host import host_step
from moesim.wiring import resolve

#: routing laws kept (one per seed, routing step and MoE layer) before the cache is dropped
ROUTING_CACHE_MAX = 1 << 14


class ServeSteps:
    """Step times of the deployment ``res`` (resolved by
    :func:`moesim.serve.run.resolve_serve`) for ``cfg`` with fields replaced."""

    def __init__(self, res: Resolved, cfg: ServeConfig,
                 host_overhead: str | None = None) -> None:
        from moesim.engine.fast.forward import ForwardState
        self.res, self.cfg = res, cfg
        # the engine whose CPU time per step is added (default: the section's)
        self.host = host_overhead or cfg.host_overhead
        self._resolved: dict = {}
        self._state = ForwardState()
        self._routing: dict = {}     # (seed, step, layer, ...) -> routing law, copy ratios
        self.sims = 0

    def config(self, **changes) -> ServeConfig:
        """``cfg`` with ``changes``, as a deployment runs it: prefill on DeepEP's normal
        kernels where the deployment decodes on its low-latency ones (deepseek-ai/DeepEP
        README: low-latency kernels for decoding, normal kernels for prefilling; a
        colocated engine switches), one micro-batch when the requests do not split in
        two, and the segments' overlap where the 5-stage decode pipeline does not apply."""
        cfg = dataclasses.replace(self.cfg, **changes)
        if cfg.phase == "prefill" and cfg.ep_backend == "deepep-ll":
            cfg = dataclasses.replace(cfg, ep_backend="deepep")
        if cfg.requests_per_group() % 2:
            cfg = dataclasses.replace(cfg, two_microbatch=False)
        if cfg.decode_overlap != "segments" and (cfg.phase != "decode" or
                                                 not cfg.two_microbatch):
            # DeepSeek's 5-stage pipeline is its decode overlap of two micro-batches;
            # its prefill interleaves whole segments (day-6 overview)
            cfg = dataclasses.replace(cfg, decode_overlap="segments")
        return cfg

    def resolved(self, cfg: ServeConfig) -> Resolved:
        """The deployment resolved for ``cfg``: resolved once per layout (and CUDA-graph
        choice, which sets the compute model's launch overhead), then the step's
        schedule and overlap put in (the only parts of the scenario a serve field
        changes besides the layout)."""
        scn = serving_scenario(self.res.scenario, cfg)
        key = (scn.parallel, scn.overlap.cuda_graphs)     # graphs: another compute model
        base = self._resolved.get(key)
        if base is None:
            base = self._resolved[key] = resolve(scn)
            return base
        return dataclasses.replace(base, scenario=dataclasses.replace(
            base.scenario, schedule=scn.schedule, overlap=scn.overlap))

    def step_s(self, **changes) -> float:
        """Seconds of one serving step of ``cfg`` with ``changes`` (e.g. ``phase``,
        ``batch_per_gpu``, ``context``, ``prompt``, ``step``) on the scenario's engine,
        the engine's CPU time per step included (``serve.host_overhead``,
        :mod:`moesim.serve.host`)."""
        cfg = self.config(**changes)
        res = mtp.with_draft(self.resolved(cfg), cfg)    # serve.mtp: the draft's layer
        self.sims += 1
        if len(self._routing) > ROUTING_CACHE_MAX:
            self._routing.clear()
        if res.scenario.engine.mode == "fast":
            from moesim.engine.fast.forward import simulate_forward
            from moesim.serve.program import ServeBuilder
            b = ServeBuilder(res, cfg, routing_cache=self._routing)
            gpu = simulate_forward(res, b, span_ranks=0, step_only=True,
                                   state=self._state)[0]
            h = host_step(self.host, cfg.requests_per_group(), gpu)
            return gpu if h is None else h.step_s
        from moesim.serve.run import simulate_serve
        return float(simulate_serve(res, cfg, spans=False,
                                    host_overhead=self.host).summary["step_time_s"])
