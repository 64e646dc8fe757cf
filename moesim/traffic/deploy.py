"""A deployment for :class:`moesim.traffic.loop.LoadSim`: its lockstep groups of attention
data-parallel ranks, each rank's KV cache and scheduler, and (disaggregated) the KV
transfer between the pools.

From a serve scenario (:func:`build_for`): a *member* is one TP group (an attention-DP
rank); members joined by an EP group (or a TP group spanning them) step together (the
connected components of the EP and TP groups of the serving layout). A member's KV cache
holds ``kv_fraction`` of a GPU's memory minus its weights and activations (the serving
memory table, :mod:`moesim.serve.memory`), divided by the KV bytes per token on a GPU
with every layer full (``kv_tokens``). With sliding-window layers the cache is vLLM's
hybrid one (:mod:`moesim.traffic.kvcache`): groups of ``group_size`` layers share a pool of
``kv_tokens · layers / (group_size · block_size)`` blocks (the same bytes), and a windowed
group holds only the blocks of its window.
"""

from __future__ import annotations

from moesim.errors import InputError
from moesim.model.window import is_window_layer
from moesim.traffic.kvcache import BlockManager, kv_groups
from moesim.traffic.loop import LoadSim
from moesim.traffic.schedulers import SCHEDULERS, Deployment


def build_sim(costs, groups: list[list[int]], kv_tokens: int, *, scheduler: str = "vllm",
              router: str = "least_outstanding", max_seqs: int | None = None,
              token_budget: int | None = None, block_size: int = 16,
              prefill_groups: int | None = None, kv_bytes_per_token: float = 0.0,
              links=None, gpus_of: list[tuple[str, ...]] | None = None, series: bool = True,
              layer_windows: list[int] | None = None, options: dict | None = None) -> LoadSim:
    """A LoadSim over ``groups`` (member ids 0..M-1) with ``kv_tokens`` of KV cache per
    member, built by the registered ``scheduler``
    (:data:`moesim.traffic.schedulers.SCHEDULERS`: ``vllm`` | ``sarathi`` |
    ``disaggregated``, where the first ``prefill_groups`` groups prefill, the others decode;
    their KV caches move as flows over ``links``, a topology, between the GPUs
    ``gpus_of[member]``: see :class:`moesim.traffic.disagg.KVTransfer`). The scheduler
    gets the fields it registered: ``max_seqs``, ``token_budget``, ``prefill_groups`` when
    given, else ``options[field]``, else its default. ``layer_windows``: each layer's
    sliding window (0: full attention; None: every layer full), which makes the KV cache
    vLLM's hybrid one (:func:`moesim.traffic.kvcache.kv_groups`)."""
    kind = SCHEDULERS.get(scheduler)
    members = sorted(m for g in groups for m in g)
    if members != list(range(len(members))):
        raise ValueError("members must be numbered 0..M-1")
    windows, size = kv_groups(layer_windows) if layer_windows else ((0,), 1)
    layers = len(layer_windows) if layer_windows else 1
    blocks = max(1, kv_tokens * layers // (size * block_size))

    def cache() -> BlockManager:
        return BlockManager(blocks, block_size, windows, blocks * block_size * size // layers)

    given = {**(options or {}), **{k: v for k, v in (("max_seqs", max_seqs),
                                                     ("token_budget", token_budget),
                                                     ("prefill_groups", prefill_groups))
                                   if v is not None}}
    opts = {f: given.get(f, default) for f, default in kind.fields.items()}
    return kind.factory(Deployment(costs, groups, cache, opts, router, series,
                                   kv_bytes_per_token, links, gpus_of, layer_windows))


def lockstep_groups(layout) -> tuple[list[list[int]], list[int]]:
    """(groups of member ids, first GPU rank of each member): members are TP groups,
    joined when an EP or TP group spans them."""
    world = layout.world
    parent = list(range(world))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for r in range(world):
        for kind in ("tp", "ep"):
            for o in layout.group_of(r, kind):
                a, b = find(r), find(int(o))
                if a != b:
                    parent[b] = a
    lead: dict[int, int] = {}
    for r in range(world):
        t0 = int(min(layout.group_of(r, "tp")))
        lead.setdefault(t0, len(lead))
    first = [0] * len(lead)
    for t0, m in lead.items():
        first[m] = t0
    comp: dict[int, list[int]] = {}
    for t0, m in sorted(lead.items(), key=lambda x: x[1]):
        comp.setdefault(find(t0), []).append(m)
    return list(comp.values()), first


def kv_tokens_per_member(res, cfg, load_cfg) -> int:
    """KV tokens one attention-DP rank holds: (kv_fraction · HBM - weights - activations)
    of a GPU over the KV bytes per token on a GPU (the serving memory table)."""
    if load_cfg.kv_tokens is not None:
        return load_cfg.kv_tokens
    from moesim.serve.memory import table
    cap = float(getattr(res.device, "hbm_bytes", 0.0) or 0.0)
    t = table(res.model, cfg, cap)
    free = load_cfg.kv_fraction * cap - t["weights_bytes"] - t["activations_bytes"]
    per = float(t["kv_per_token_bytes"])
    tokens = int(free // per) if per > 0 else 0
    if tokens < load_cfg.block_size:
        raise InputError(load_cfg.source, "load.kv_fraction", "room for a KV cache after "
                         f"weights and activations ({free / 1e9:.1f} GB free per GPU)",
                         load_cfg.kv_fraction)
    return tokens


def build_for(res, cfg, load_cfg, costs, *, series: bool = True) -> LoadSim:
    """The LoadSim of a resolved serve scenario and its ``load`` section."""
    groups, first = lockstep_groups(res.layout)
    kind = SCHEDULERS.get(load_cfg.scheduler, load_cfg.source)
    opts = load_cfg.scheduler_options()
    if kind.check is not None:
        kind.check(len(groups), opts, load_cfg.source)
    kv = kv_tokens_per_member(res, cfg, load_cfg)
    from moesim.serve.memory import table
    bpt = float(table(res.model, cfg, 0.0)["kv_per_token_bytes"])
    gpus = list(res.topology.gpus)
    gpus_of = [tuple(gpus[r] for r in res.layout.group_of(f, "tp")) for f in first]
    return build_sim(costs, groups, kv, scheduler=load_cfg.scheduler, router=load_cfg.router,
                     block_size=load_cfg.block_size, options=opts, kv_bytes_per_token=bpt,
                     links=res.topology, gpus_of=gpus_of, series=series,
                     layer_windows=windows_of(res.model))


def windows_of(spec) -> list[int] | None:
    """Each layer's sliding window (0: full attention), or None when no layer has one."""
    out = [spec.window if is_window_layer(spec, i) else 0 for i in range(spec.layers)]
    return out if any(out) else None


def load_fits(res, cfg, kv_tokens: int) -> list:
    """The memory verdict of a serving deployment under load (:mod:`moesim.memory.fit`):
    one GPU holds its weights, the activations of a step and ``kv_tokens`` of KV cache
    (the serving memory table's bytes), against the device's memory."""
    from moesim.memory.fit import Fit
    from moesim.serve.memory import table
    cap = float(getattr(res.device, "hbm_bytes", 0.0) or 0.0)
    if cap <= 0:
        return []
    t = table(res.model, cfg, cap)
    need = t["weights_bytes"] + t["activations_bytes"] + kv_tokens * t["kv_per_token_bytes"]
    return [Fit("serving deployment under load", need, cap)]
