"""Values checked against what they apply to, once the scenario is resolved and before
any work: a routing share against the model's top-k, hot experts against its experts,
node-limited routing against the nodes an EP group spans, the SMs a communication
kernel holds against the device's. Each failure is one line naming the field the user
wrote (the command line's when it came from ``--set``: the caller blames it, see
:func:`moesim.scenario.blame.blame_overrides`); a value the user never wrote (a
default) is named as such, against the field that made it apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from moesim.ep.messages import deepep_carries, deepep_hidden_expected
from moesim.errors import InputError
from moesim.gating.config import RoutingConfig, with_top_k
from moesim.gating.kinds import hot_ids, keys_by_kind
from moesim.gating.skew import base_shares


def check_seq(source: str, seq_len: int, cp: int) -> None:
    """One-line error unless the sequence splits into 2·cp equal chunks (context
    parallelism, moesim.program.cp)."""
    if cp > 1 and seq_len % (2 * cp):
        raise InputError(source, "schedule.seq_len", f"a multiple of 2*cp = {2 * cp} (each "
                         "context-parallel rank holds two load-balanced chunks)", seq_len)


def check_hot_shares(src: str, policy: Mapping[str, Any], routing: RoutingConfig,
                     n_experts: int, top_k: int) -> None:
    """Hot routing: the hot experts exist, and no expert is given more than 1/top_k of
    the assignments (a token picks an expert at most once)."""
    if routing.kind != "hot" or n_experts <= 0 or top_k <= 0:
        return
    ids = hot_ids(routing, n_experts, src)
    cfg = with_top_k(routing, top_k)
    q = base_shares(cfg, n_experts, 0, 0, src)
    if not np.any(q * top_k > 1.0 + 1e-12):
        return
    limit = f"1/top_k = {1.0 / top_k:.4g}"
    if policy.get("hot_token_fraction") is not None:
        raise InputError(src, "routing.hot_token_fraction", f"at most the {len(ids)} hot "
                         f"expert(s) (a share per hot expert <= {limit} of the assignments: "
                         "a token picks an expert at most once)", routing.hot_token_fraction)
    if policy.get("hot_fraction") is not None:
        raise InputError(src, "routing.hot_fraction", f"a share per hot expert <= {limit} "
                         "(a token picks an expert at most once)", float(q.max()))
    raise InputError(src, "routing.kind", f"hot routing that top_k={top_k} allows: the "
                     f"default routing.hot_fraction {routing.hot_fraction:g} over "
                     f"{len(ids)} hot expert(s) gives one more than {limit} of the "
                     "assignments; set routing.hot_fraction (or hot_token_fraction)",
                     routing.kind)


def check_sms(src: str, scn: Any, device: Any) -> None:
    """The SMs a communication kernel holds, against the device's (the same rule as
    ``moesim collective --sms``): DeepEP's normal kernels an even number >= 2, and
    every count fewer than the device has (compute needs some)."""
    dev_sms = int(getattr(device, "sms", 0) or 0)
    backend = scn.parallel.ep_backend
    if backend.sms is not None and backend.kind == "deepep" and (
            backend.sms < 2 or backend.sms % 2):
        raise InputError(src, "parallel.ep_backend.sms", "an even number of SMs >= 2 "
                         "(DeepEP runs 2 SMs per channel)", backend.sms)
    name = getattr(device, "name", device)
    for field, v in (("parallel.ep_backend.sms", backend.sms),
                     ("overlap.nccl_sms", scn.overlap.nccl_sms)):
        if v and dev_sms and v >= dev_sms:
            raise InputError(src, field, f"fewer than the device's {dev_sms} SMs ({name})", v)


def check_deepep_hidden(src: str, scn: Any, model: Any) -> None:
    """An EP exchange on DeepEP's kernels needs a hidden size they carry (a serving
    step's ``ep_backend: auto`` picks NCCL instead: moesim.serve.config)."""
    kind = scn.parallel.ep_backend.kind
    hidden = int(getattr(model, "hidden", 0) or 0)
    if kind in ("deepep", "deepep-ll", "hybridep") and scn.parallel.ep > 1 \
            and not deepep_carries(hidden):
        raise InputError(src, "parallel.ep_backend.kind",
                         "nccl " + deepep_hidden_expected(hidden), kind)


def check_fp8_recipe(src: str, scn: Any) -> None:
    """``compute.fp8_recipe: tensorwise`` is Transformer Engine's per-tensor current
    scaling of an FP8 training step (inert under BF16 GEMMs): it quantises after the
    dispatch and keeps activations in BF16, so DeepSeek-V3's FP8 dispatch and FP8
    activation caches (and its launch list) belong to the blockwise recipe only."""
    if scn.compute.fp8_recipe != "tensorwise" or scn.compute.precision != "fp8":
        return
    for bad, field, expected, value in (
            (scn.serve is not None or scn.rl is not None, "compute.fp8_recipe",
             "blockwise in a serving or RL scenario (tensorwise is Transformer Engine's "
             "training recipe: moesim run and moesim train)", scn.compute.fp8_recipe),
            (scn.routing.dispatch_dtype != "bf16", "routing.dispatch_dtype",
             "bf16 with compute.fp8_recipe tensorwise (Transformer Engine quantises after "
             "the dispatch)", scn.routing.dispatch_dtype),
            (scn.memory.activation_dtype == "fp8", "memory.activation_dtype",
             "bf16 with compute.fp8_recipe tensorwise (DeepSeek-V3's FP8 activation caches "
             "are the blockwise recipe's)", scn.memory.activation_dtype),
            (scn.compute.memory_kernels == "deepseek", "compute.memory_kernels",
             "not deepseek with compute.fp8_recipe tensorwise (DeepSeek's launch list)",
             scn.compute.memory_kernels)):
        if bad:
            raise InputError(src, field, expected, value)


def check_node_limit(src: str, routing: RoutingConfig, layout: Any,
                     gpus_per_node: int | None, warn: bool = False) -> str | None:
    """Node-limited routing picks at most ``max_nodes`` of the nodes an EP group spans: a
    limit above what the group spans would limit nothing, so it is refused, as
    ``moesim collective --max-nodes`` refuses it. ``warn``: said in the returned
    warning instead (an RL scenario's one routing section serves its trainer's and its
    rollout engines' EP groups, which span different nodes)."""
    if routing.max_nodes is None or not gpus_per_node or layout.ep < 2:
        return None
    group = layout.group_of(0, "ep")
    nodes = len({int(r) // gpus_per_node for r in group})
    if routing.max_nodes <= nodes:
        return None
    if warn:
        return (f"routing.max_nodes {routing.max_nodes} limits nothing: an EP group of "
                f"{len(group)} ranks spans {nodes} node(s) ({gpus_per_node} GPUs per node)")
    raise InputError(src, "routing.max_nodes", f"at most the {nodes} node(s) an EP group "
                     f"of {len(group)} ranks spans ({gpus_per_node} GPUs per node; "
                     "node-limited routing picks among them; null for no limit)", routing.max_nodes)


def routing_ignored_warnings(policy: Mapping[str, Any]) -> list[str]:
    """Keys of the ``routing:`` section that the chosen kind does not read (a hot
    scenario's ``hot_fraction`` under ``--set routing.kind=uniform``): said in a warning,
    not dropped silently."""
    kind = policy.get("kind", "uniform")
    return [f"routing.{key} applies to routing.kind {' or '.join(kinds)} only: ignored "
            f"with kind {kind}" for key, kinds in keys_by_kind().items()
            if policy.get(key) is not None and kind not in kinds]


def check_simulated(scn: Any) -> None:
    """What the DualPipe programs (moesim.program.dualpipe_build) do not build stops here,
    in one line: ZeRO-3 with two model copies per rank, and context or expert tensor
    parallelism (their B/W split is not written for CP's KV ring or ETP's sharded
    experts); the fast engine's overlapped pairs have no ZeRO-3 gathers."""
    kind, par = scn.schedule.kind, scn.parallel
    if kind in ("dualpipe", "dualpipev"):
        if par.zero == 3:
            raise InputError(scn.source, "parallel.zero", f"0, 1 or 2 with schedule.kind "
                             f"{kind} (ZeRO-3 weight gathers are not built for "
                             "ranks holding two stages)", par.zero)
        for name in ("cp", "etp"):
            if getattr(par, name, 1) > 1:
                raise InputError(scn.source, f"parallel.{name}", f"1 with schedule.kind "
                                 f"{kind} (not modelled together)", getattr(par, name))
    paired = scn.overlap.kind != "none" or scn.overlap.ep_comm_overlap
    if par.zero == 3 and paired and scn.engine.mode == "fast":
        raise InputError(scn.source, "engine.mode", "exact for ZeRO-3 with overlapped pairs "
                         "(the fast engine's pair model has no ZeRO-3 gathers)", "fast")


def product_error(src: str, par: Any, world: int, overrides: tuple[str, ...]) -> InputError:
    """tp*cp*pp does not divide ``world``: blame the factor without which it would (one
    given with --set first, then cp, then pp), naming the others."""
    given = [k.split("=", 1)[0].strip().removeprefix("parallel.") for k in overrides]
    sizes = {"tp": par.tp, "cp": par.cp, "pp": par.pp}
    names = [n for n in given if n in sizes and sizes[n] > 1] + ["cp", "pp"]
    culprit = next((n for n in names if sizes[n] > 1 and world % (
        par.tp * par.cp * par.pp // sizes[n]) == 0), "pp")
    shown = [n for n in ("tp", "cp", "pp") if n != culprit and (n != "cp" or par.cp > 1)]
    what = "*".join(n for n in ("tp", "cp", "pp") if n != "cp" or par.cp > 1)
    return InputError(src, f"parallel.{culprit}", f"{what} to divide the world size {world} "
                      f"({', '.join(f'{n}={sizes[n]}' for n in shown)})", sizes[culprit])
