"""Expert-parallel exchange kernels (DeepEP normal and low-latency, NCCL all-to-all).

* :mod:`.messages` — bytes per token as DeepEP's kernels lay them out;
* :mod:`.plan` — :func:`plan_ep_exchange`: one dispatch/combine as stages of flows
  (the contract the engines consume is in that module's docstring);
* :mod:`.timing` — kernel time: concurrent stages on max-min shared links, SM budget,
  pipeline fill/drain, notify latency;
* :mod:`.simulate` — :func:`simulate_ep`, the engine of ``moesim collective --op
  ep_dispatch|ep_combine``.
"""

from moesim.ep.plan import KERNELS, OPS, EpPlan, Stage, plan_ep_exchange
from moesim.ep.simulate import simulate_ep
from moesim.ep.timing import EpTiming, time_plan

__all__ = ["KERNELS", "OPS", "EpPlan", "EpTiming", "Stage", "plan_ep_exchange", "simulate_ep",
           "time_plan"]
