"""The serving schedulers by name (``load.scheduler``): each registered once in
:data:`SCHEDULERS` with the ``load`` fields it takes (and their defaults) and a factory
``factory(Deployment) -> LoadSim`` (and optionally ``check(groups, options, source)``, a
check against the deployment's number of lockstep groups); ``load.scheduler`` and the fields each scheduler takes
are checked against it (:mod:`moesim.traffic.config`), and
:func:`moesim.traffic.deploy.build_sim` builds through it.

Built in: ``vllm`` (:class:`~moesim.traffic.vllm.ContinuousBatching` on every member),
``sarathi`` (:class:`~moesim.traffic.sarathi.ChunkedPrefill`), ``disaggregated``
(the first ``prefill_groups`` lockstep groups prefill, the others decode, the KV caches
moving between them: :mod:`moesim.traffic.disagg`). A scheduler whose members each run one
:class:`~moesim.traffic.scheduler.Scheduler` policy registers :func:`per_member` of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import InputError
from moesim.traffic.disagg import DecodeOnly, KVTransfer, PrefillOnly
from moesim.traffic.kvcache import BlockManager
from moesim.traffic.loop import LoadSim
from moesim.traffic.registry import Registry
from moesim.traffic.sarathi import ChunkedPrefill
from moesim.traffic.scheduler import MAX_SEQS, TOKEN_BUDGET
from moesim.traffic.vllm import ContinuousBatching


@dataclass
class Deployment:
    """What a scheduler's factory builds a LoadSim from: the step ``costs``, lockstep
    ``groups`` of member ids 0..M-1, ``cache()`` (a fresh KV cache for one member), the
    scheduler's ``options`` (its registered fields), the balancer's name ``router``,
    ``series``; for moving KV caches between members: ``kv_bytes_per_token``, ``links``
    (a topology), ``gpus_of[member]`` and ``layer_windows``."""

    costs: Any
    groups: list[list[int]]
    cache: Callable[[], BlockManager]
    options: dict = field(default_factory=dict)
    router: str = "least_outstanding"
    series: bool = True
    kv_bytes_per_token: float = 0.0
    links: Any = None
    gpus_of: list[tuple[str, ...]] | None = None
    layer_windows: list[int] | None = None

    @property
    def members(self) -> list[int]:
        return sorted(m for g in self.groups for m in g)


#: serving schedulers by name: ``load.scheduler``
SCHEDULERS = Registry("load.scheduler")

#: the fields every built-in policy takes (vllm/config.py SchedulerConfig defaults)
POLICY_FIELDS = {"token_budget": TOKEN_BUDGET, "max_seqs": MAX_SEQS}


def per_member(policy: type) -> Callable[[Deployment], LoadSim]:
    """A factory running ``policy(cache, **options)`` on every member."""

    def build(dep: Deployment) -> LoadSim:
        scheds = [policy(dep.cache(), **dep.options) for _ in dep.members]
        return LoadSim(dep.costs, dep.groups, scheds, router=dep.router, series=dep.series)

    return build


def _disaggregated(dep: Deployment) -> LoadSim:
    opts = dict(dep.options)
    prefill_groups = opts.pop("prefill_groups", 1)
    if not 1 <= prefill_groups < len(dep.groups):
        raise ValueError("disaggregated serving needs prefill_groups in [1, groups)")
    members = dep.members
    pre = {m for g in dep.groups[:prefill_groups] for m in g}
    scheds = [(PrefillOnly if m in pre else DecodeOnly)(dep.cache(), **opts) for m in members]
    sim = LoadSim(dep.costs, dep.groups, scheds, router=dep.router, series=dep.series,
                  entry=sorted(pre))
    move = KVTransfer(sim, dep.kv_bytes_per_token, dep.links, dep.gpus_of, dep.layer_windows)
    move.decode_members = [m for m in members if m not in pre]
    sim.handoff = move
    sim.transfer = move
    return sim


def _check_disaggregated(groups: int, options: dict, source: str) -> None:
    """Disaggregated serving on ``groups`` lockstep groups: at least two, and fewer
    prefilling than there are (one line naming the field otherwise)."""
    prefill_groups = options["prefill_groups"]
    if groups < 2:
        raise InputError(source, "load.scheduler", "disaggregated serving on at least two "
                         "lockstep groups (a cluster larger than one EP group); this layout "
                         f"has {groups}", "disaggregated")
    if prefill_groups >= groups:
        raise InputError(source, "load.prefill_groups", f"fewer than the {groups} lockstep "
                         "groups", prefill_groups)


SCHEDULERS.register("vllm", per_member(ContinuousBatching), POLICY_FIELDS,
                    "continuous batching, prefill first (vLLM's default scheduler)")
SCHEDULERS.register("sarathi", per_member(ChunkedPrefill), POLICY_FIELDS,
                    "chunked prefill under a token budget (Sarathi-Serve)")
SCHEDULERS.register("disaggregated", _disaggregated, {**POLICY_FIELDS, "prefill_groups": 1},
                    "prefill and decode pools apart, KV caches moved between them",
                    check=_check_disaggregated)
