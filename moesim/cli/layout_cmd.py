"""``moesim layout SCENARIO [--rank R] [--json]``: the process groups of a rank.

Every group Megatron-Core builds for the rank (``megatron/core/parallel_state.py``):
attention TP, CP, DP, DP×CP (dense gradient reduction) and PP; MoE-layer EP, ETP and
EDP (expert gradient reduction) of the folded expert generator; each member with the
node it sits on (rank r on GPU r, node r // GPUs per node), so a user sees which
collectives cross the network.

A serving scenario (a ``serve:`` section) shows the serving deployment's groups, the
layout ``moesim serve`` runs (moesim.serve.config.serving_scenario): attention TP
(``serve.tp``), attention data parallel over the TP groups and ``serve.ep``, one
pipeline stage. An ``rl:`` scenario places its trainer and rollout engines from
``rl.train`` and ``rl.rollout``, not from ``parallel``: refused in one line.
"""

from __future__ import annotations

import argparse
import json

from moesim.cli.common import add_output_flags
from moesim.errors import InputError
from moesim.scenario import load_scenario
from moesim.scenario.blame import CLI, blame_overrides
from moesim.wiring import resolve

#: group kind -> what Megatron-Core calls it and what runs over it
GROUPS = (
    ("tp", "TENSOR_MODEL_PARALLEL_GROUP", "TP all-reduce / SP reduce-scatter + all-gather"),
    ("cp", "CONTEXT_PARALLEL_GROUP", "ring attention KV exchange"),
    ("dp", "DATA_PARALLEL_GROUP", "data parallel replicas"),
    ("dp_cp", "DATA_PARALLEL_GROUP_WITH_CP", "dense gradient reduction"),
    ("pp", "PIPELINE_MODEL_PARALLEL_GROUP", "activations between stages"),
    ("ep", "EXPERT_MODEL_PARALLEL_GROUP", "token dispatch / combine all-to-all"),
    ("etp", "EXPERT_TENSOR_PARALLEL_GROUP", "expert GEMM all-gather / reduce-scatter"),
    ("edp", "EXPERT_DATA_PARALLEL_GROUP", "expert gradient reduction"),
)


#: a serving step's groups: what runs over each (no gradients, one pipeline stage)
SERVE_GROUPS = (
    ("tp", "TENSOR_MODEL_PARALLEL_GROUP", "attention TP all-reduce (serve.tp)"),
    ("dp", "DATA_PARALLEL_GROUP", "attention data parallel: each TP group its own requests"),
    ("ep", "EXPERT_MODEL_PARALLEL_GROUP", "token dispatch / combine all-to-all (serve.ep)"),
    ("edp", "EXPERT_DATA_PARALLEL_GROUP", "ranks holding the same experts (no gradients)"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file or shipped name (e.g. toy-cpu)")
    p.add_argument("--rank", type=int, default=0, help="global rank to show (default 0)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set parallel.ep=16 (repeatable)")
    add_output_flags(p, json_help="print the groups as JSON", strict=False, quiet=False)


def rank_groups(lay, rank: int, gpus_per_node: int | None, groups=GROUPS) -> dict:
    """JSON-able groups of ``rank``: per kind the members, their nodes and whether the
    group spans more than one node."""
    c = lay.coord(rank)
    out = {"rank": rank, "node": rank // gpus_per_node if gpus_per_node else None,
           "order": lay.megatron_order, "sizes": lay.describe(),
           "coords": {"tp": c.tp, "cp": c.cp, "dp": c.dp, "pp": c.pp, "ep": c.ep,
                      "etp": c.etp, "edp": c.edp},
           "groups": {}}
    out["sizes"].update(cp=lay.cp, etp=lay.etp)
    for kind, megatron, use in groups:
        g = lay.group_of(rank, kind)
        nodes = [r // gpus_per_node for r in g] if gpus_per_node else None
        out["groups"][kind] = {"megatron": megatron, "carries": use, "ranks": list(g),
                               "nodes": nodes,
                               "crosses_nodes": bool(nodes and len(set(nodes)) > 1)}
    return out


def _ranges(xs: list[int]) -> str:
    """Compact ranks: 0-31 for a run, 1,3,5 otherwise (strides shown as a:b:step)."""
    if len(xs) <= 2:
        return ",".join(map(str, xs))
    step = xs[1] - xs[0]
    if step > 0 and all(b - a == step for a, b in zip(xs, xs[1:], strict=False)):
        return f"{xs[0]}-{xs[-1]}" if step == 1 else f"{xs[0]}-{xs[-1]} step {step}"
    return ",".join(map(str, xs))


def format_groups(name: str, t: dict) -> str:
    s = t["sizes"]
    if "serve" in t:
        sv = t["serve"]
        ld = sv.get("load")
        what = (f"serving step ({sv['phase']})" if not ld else
                f"serving deployment under load ({ld['scheduler']}" + (
                    f": {ld['prefill_groups']} of its {ld['lockstep_groups']} lockstep "
                    "groups prefill" if "prefill_groups" in ld else "") + ")")
        head = (f"scenario {name}: {what} on {s['world']} GPUs: attention tp={s['tp']} x "
                f"attention dp={s['dp']}, MoE ep={s['ep']} edp={s['edp']}, one pipeline "
                "stage (serve.tp, serve.ep)")
    else:
        head = (f"scenario {name}: {s['world']} ranks, order {t['order']} (innermost "
                f"first); attention tp={s['tp']} cp={s['cp']} dp={s['dp']} pp={s['pp']}, "
                f"MoE etp={s['etp']} ep={s['ep']} edp={s['edp']}")
    lines = [head,
             f"rank {t['rank']}" + (f" on node {t['node']}" if t["node"] is not None else "")
             + ": " + " ".join(f"{k}={v}" for k, v in t["coords"].items()),
             f"{'group':<6} {'size':>4}  {'ranks':<28} {'nodes':<28} carries"]
    for kind, g in t["groups"].items():
        nodes = sorted(set(g["nodes"])) if g["nodes"] is not None else []
        where = (_ranges(nodes) + (" (crosses nodes)" if g["crosses_nodes"] else "")
                 if g["nodes"] is not None else "-")
        lines.append(f"{kind:<6} {len(g['ranks']):>4}  {_ranges(g['ranks']):<28} "
                     f"{where:<28} {g['carries']}")
    return "\n".join(lines)


def refuse_rl(scn, target: str, overrides: list[str], command: str = "layout",
              what: str = "show the parallel: section's layout") -> None:
    """An ``rl:`` scenario: its layouts are ``rl.train`` and ``rl.rollout``'s. Blamed on
    the file when it has the section, else on the ``--set`` that added it."""
    if not scn.rl:
        return
    keys = [o.split("=", 1)[0].strip() for o in overrides]
    given = [k for k in keys if k == "rl" or k.startswith("rl.")]
    if given and load_scenario(target, ()).rl:
        given = []
    raise InputError(CLI if given else scn.source, f"--set {given[0]}" if given else "rl",
                     "a training or serving scenario (an rl: section places its trainer "
                     f"and rollout engines from rl.train and rl.rollout; `moesim {command}` "
                     f"would ignore them and {what})",
                     "an rl: section")


def _under_load(res, overrides: list[str]) -> dict:
    """A ``load:`` section's scheduler; disaggregated: how many lockstep groups (TP
    groups joined by their EP groups, moesim.traffic.deploy) prefill, checked as
    ``moesim serve`` checks it."""
    from moesim.traffic.deploy import lockstep_groups
    from moesim.traffic.schedulers import POLICY_FIELDS, SCHEDULERS
    from moesim.traffic.session import load_config

    scn = res.scenario
    lc = load_config(res, overrides, requests=False)
    try:
        out: dict = {"scheduler": lc.scheduler}
        kind = SCHEDULERS.get(lc.scheduler, scn.source, "load.scheduler")
        if kind.check is not None:          # a scheduler that needs a layout (its registry)
            groups = len(lockstep_groups(res.layout)[0])
            opts = lc.scheduler_options()
            kind.check(groups, opts, scn.source)
            out.update({k: v for k, v in opts.items() if k not in POLICY_FIELDS},
                       lockstep_groups=groups)
    except InputError as err:
        raise blame_overrides(err, scn.source, overrides) from None
    return out


def run(args: argparse.Namespace) -> int:
    scn = load_scenario(args.scenario, args.overrides)
    refuse_rl(scn, args.scenario, args.overrides)
    cfg = None
    if scn.serve:
        from moesim.serve.run import resolve_serve
        res, cfg = resolve_serve(args.scenario, args.overrides)
    else:
        res = resolve(scn)
    lay = res.layout
    if not 0 <= args.rank < lay.world:
        raise InputError("command line", "--rank", f"a rank in 0..{lay.world - 1}", args.rank)
    t = rank_groups(lay, args.rank, res.scenario.gpus_per_node,
                    GROUPS if cfg is None else SERVE_GROUPS)
    if cfg is not None:
        t["coords"] = {k: t["coords"][k] for k in ("tp", "dp", "ep", "edp")}
        t["serve"] = {"phase": cfg.phase, "tp": cfg.tp, "attn_dp": lay.world // cfg.tp,
                      "ep": cfg.ep}
        if res.scenario.load:
            t["serve"]["load"] = _under_load(res, args.overrides)
    if args.json:
        print(json.dumps(t, indent=1))
    else:
        print(format_groups(res.scenario.name, t))
    return 0
