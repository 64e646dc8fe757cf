"""Load a scenario YAML file into a validated :class:`Scenario`.

``load_scenario(path, overrides)`` reads the file (:mod:`moesim.yamlio`), applies
``--set dotted.key=value`` overrides (value parsed as a YAML scalar or list),
and checks every field and the sections against each other. Every problem is an
:class:`InputError` naming the file, the ``section.field``, the expectation and what was
found. The sections with keys of their own are typed and checked here too (``model``,
``compute``: the lower packages' parsers; ``serve``, ``rl``, ``load``:
:mod:`moesim.scenario.sections`). The scenario read here is data: the names the
registries above hold (schedulers, balancers, RL algorithms, length distributions) are
checked by those packages when they run a section, the routing policy, device, compute
model's files and topology when :func:`moesim.wiring.resolve` builds them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import yaml

from moesim.compute.select import parse as parse_compute
from moesim.errors import InputError
from moesim.model.read import parse as parse_model
from moesim.outputs import check_name
from moesim.paths import shown
from moesim.scenario.blame import CLI, blame_overrides
from moesim.scenario.limits import check_field, check_tokens
from moesim.scenario.schema import (
    ACTIVATION_DTYPES,
    ATTENTION_KERNELS,
    CUDA_GRAPH_MODULES,
    DICT_SECTIONS,
    DTYPES,
    ENGINE_MODES,
    EP_BACKENDS,
    GRAD_DTYPES,
    NETWORK_MODELS,
    OVERLAP_GEMM_SMS,
    OVERLAP_KINDS,
    PARAM_DTYPES,
    PP_COMMS,
    RECOMPUTE,
    RECOMPUTE_MODULES,
    REPLICA_MODES,
    SCHEDULE_KINDS,
    SECTIONS,
    TOP_LEVEL,
    ClusterConfig,
    EngineConfig,
    EPBackendConfig,
    MemoryConfig,
    OverlapConfig,
    ParallelConfig,
    RoutingSection,
    Scenario,
    ScheduleConfig,
)
from moesim.scenario.sections.distill import distill_from_dict
from moesim.scenario.sections.load import load_from_dict
from moesim.scenario.sections.rl import rl_from_dict
from moesim.scenario.sections.serve import serve_from_dict
from moesim.schedule.dualpipe import check as dual_check
from moesim.yamlio import check_finite, load_text, read_yaml

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"

# field -> (kind, detail). kinds: pos (int >= 1), nonneg (int >= 0), range (int in
# detail), optpos (None or int >= 1), posnum (number > 0), bool, str, optstr,
# choice (one of detail), order, dict.
_RULES: dict[str, tuple[str, Any]] = {
    "cluster.topology": ("str", None), "cluster.nodes": ("optpos", None),
    "cluster.device": ("optstr", None), "cluster.network": ("choice", NETWORK_MODELS),
    "cluster.params": ("dict", None),
    "parallel.tp": ("pos", None), "parallel.pp": ("pos", None), "parallel.dp": ("optpos", None),
    "parallel.ep": ("pos", None), "parallel.zero": ("range", (0, 3)), "parallel.vpp": ("pos", None),
    "parallel.cp": ("pos", None), "parallel.etp": ("pos", None),
    "parallel.sequence_parallel": ("bool", None),
    "parallel.pipeline_layout": ("optstr", None),
    "parallel.decoder_first_pipeline_num_layers": ("optnonneg", None),
    "parallel.decoder_last_pipeline_num_layers": ("optnonneg", None),
    "parallel.order": ("order", None), "parallel.ep_backend": ("ep_backend", None),
    "parallel.ep_backend.kind": ("choice", EP_BACKENDS),
    "parallel.ep_backend.sms": ("optnonneg", None),
    "overlap.nccl_sms": ("nonneg", None),
    "schedule.kind": ("choice", SCHEDULE_KINDS), "schedule.microbatches": ("pos", None),
    "schedule.micro_batch_size": ("pos", None), "schedule.seq_len": ("pos", None),
    "schedule.step": ("nonneg", None), "schedule.dp_bucket_MB": ("posnum", None),
    "schedule.zero3_prefetch": ("pos", None), "schedule.pp_comm": ("choice", PP_COMMS),
    "overlap.ep_comm_overlap": ("bool", None), "overlap.dp_overlap": ("bool", None),
    "overlap.kind": ("choice", OVERLAP_KINDS), "overlap.shared_expert": ("bool", None),
    "overlap.tp_comm": ("bool", None),
    "overlap.nccl_tuning": ("bool", None),
    "overlap.collective_launch": ("bool", None),
    "overlap.gemm_sms": ("choice", OVERLAP_GEMM_SMS),
    "memory.recompute": ("choice", RECOMPUTE),
    "memory.attention": ("choice", ATTENTION_KERNELS),
    "memory.grad_dtype": ("choice", GRAD_DTYPES), "memory.param_dtype": ("choice", PARAM_DTYPES),
    "memory.activation_dtype": ("choice", ACTIVATION_DTYPES),
    "memory.recompute_modules": ("modules", RECOMPUTE_MODULES),
    "overlap.cuda_graphs": ("modules", CUDA_GRAPH_MODULES),
    "memory.recompute_method": ("choice", ("uniform", "block")),
    "memory.recompute_num_layers": ("pos", None),
    "engine.mode": ("choice", ENGINE_MODES), "engine.replicas": ("choice", REPLICA_MODES),
    "engine.coalesce_rtol": ("unit", None),
    "engine.workers": ("optpos", None), "engine.sampled_replicas": ("optpos", None),
    "routing.dispatch_dtype": ("choice", DTYPES), "routing.combine_dtype": ("choice", DTYPES),
    "routing.grad_dispatch_dtype": ("choice", DTYPES),
    "routing.a2a_algo": ("choice", ("direct", "hierarchical")),
}


def _field_names(section: str) -> list[str]:
    return [f.name for f in dataclasses.fields(SECTIONS[section])]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(src: str, key: str, v: Any) -> Any:
    kind, detail = _RULES[key]
    if kind == "pos" and not (_is_int(v) and v >= 1):
        raise InputError(src, key, "an integer >= 1", v)
    if kind == "nonneg" and not (_is_int(v) and v >= 0):
        raise InputError(src, key, "an integer >= 0", v)
    if kind == "range" and not (_is_int(v) and detail[0] <= v <= detail[1]):
        raise InputError(src, key, f"an integer from {detail[0]} to {detail[1]}", v)
    if kind == "optpos" and v is not None and not (_is_int(v) and v >= 1):
        raise InputError(src, key, "an integer >= 1 (or omit it)", v)
    if kind == "posnum" and (isinstance(v, bool) or not isinstance(v, int | float)
                             or not 0 < v < math.inf):
        raise InputError(src, key, "a finite number > 0", v)
    if kind == "unit" and (isinstance(v, bool) or not isinstance(v, int | float)
                           or not 0 <= v < 1):
        raise InputError(src, key, "a number in [0, 1)", v)
    if kind == "bool" and not isinstance(v, bool):
        raise InputError(src, key, "true or false", v)
    if kind == "str" and not (isinstance(v, str) and v):
        raise InputError(src, key, "a non-empty string", v)
    if kind == "optstr" and v is not None and not (isinstance(v, str) and v):
        raise InputError(src, key, "a name (or omit it)", v)
    if kind == "choice" and v not in detail:
        raise InputError(src, key, f"one of {list(detail)}", v)
    if kind == "dict" and not isinstance(v, dict):
        raise InputError(src, key, "a mapping of key: value", v)
    if kind == "optnonneg" and v is not None and not (_is_int(v) and v >= 0):
        raise InputError(src, key, "an integer >= 0 (or omit it)", v)
    if kind == "ep_backend":
        return _ep_backend(src, key, v)
    if kind == "modules":
        if v is None:
            return () if key == "overlap.cuda_graphs" else None
        if not (isinstance(v, list | tuple) and all(x in detail for x in v)):
            raise InputError(src, key, f"a list of {', '.join(detail)} (or omit it)", v)
        return tuple(v)
    if kind == "order":
        names = sorted(map(str, v)) if isinstance(v, list | tuple) else None
        if names not in (["dp", "ep", "pp", "tp"], ["cp", "dp", "ep", "pp", "tp"]):
            raise InputError(src, key, "a list ordering tp, ep, dp, pp, optionally cp "
                             "(innermost first, e.g. [tp, cp, ep, dp, pp])", v)
        return tuple(v)
    return v


def _ep_backend(src: str, key: str, v: Any) -> EPBackendConfig:
    """``{kind: deepep, sms: 20}``, or just the kind's name."""
    if isinstance(v, EPBackendConfig):
        return v
    if isinstance(v, str):
        v = {"kind": v}
    if not isinstance(v, dict):
        raise InputError(src, key, "a mapping {kind: nccl|deepep|deepep-ll, sms: N}", v)
    valid = [f.name for f in dataclasses.fields(EPBackendConfig)]
    for k, x in v.items():
        if k not in valid:
            raise InputError(src, f"{key}.{k}", f"one of the {key} keys {valid}", k)
        _check(src, f"{key}.{k}", x)
    return EPBackendConfig(**v)


#: fixed-section fields that are themselves small sections (``--set a.b.c=v`` reaches them)
NESTED = {"parallel.ep_backend": EPBackendConfig}


# ---------------------------------------------------------------- reading

def _find(path: str | Path) -> Path:
    p = Path(path)
    if p.is_file():
        return p
    preset = SCENARIO_DIR / f"{p.name}.yaml"
    if p.suffix == "" and p.parent == Path(".") and preset.is_file():
        return shown(preset)
    if p.is_dir():
        raise InputError(str(path), "", "a scenario YAML file (or a shipped scenario name)",
                         "a directory")
    shipped = sorted(q.stem for q in SCENARIO_DIR.glob("*.yaml"))
    raise InputError(str(path), "", f"an existing scenario file or one of {shipped}",
                     "no such file")


def _read(p: Path) -> dict:
    return read_yaml(p, "a mapping of sections (name, cluster, model, ...)", empty_ok=True)


# ---------------------------------------------------------------- overrides

def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Return a copy of ``data`` with each ``dotted.key=value`` applied.

    The key must name a known section and, for fixed sections, one of its fields;
    the value is parsed as YAML (``4``, ``true``, ``fp8``, ``[tp, ep, dp, pp]``).
    Errors name the command line; so do later errors about a value set here
    (:func:`load_scenario`).
    """
    out = _deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise InputError(CLI, f"--set {item}", "key=value (e.g. parallel.ep=4)", item)
        key, raw = item.split("=", 1)
        key = key.strip()
        where = f"--set {key}"
        try:
            value = load_text(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise InputError(CLI, where, "a YAML scalar or list as value", raw) from None
        check_finite(value, CLI, where)
        parts = key.split(".")
        if any(not p for p in parts):
            raise InputError(CLI, where, "a dotted key such as schedule.microbatches", key)
        if parts[0] not in TOP_LEVEL:
            raise InputError(CLI, where, f"a key in one of the sections {list(TOP_LEVEL)}",
                             parts[0])
        if parts[0] in ("name", "seed") and len(parts) > 1:
            raise InputError(CLI, where, f"{parts[0]} is a plain value", key)
        if parts == ["name"]:
            check_name("command line", "--set name", value)
        if len(parts) == 1 and parts[0] not in ("name", "seed") and not isinstance(
                value, dict | None):
            raise InputError(CLI, where, f"a mapping of key: value (or --set "
                             f"{parts[0]}.KEY=VALUE)", value)
        if parts[0] in SECTIONS and not (len(parts) == 1 and isinstance(value, dict | None)):
            if len(parts) < 2 or parts[1] not in _field_names(parts[0]):
                raise InputError(CLI, where,
                                 f"one of the {parts[0]} keys {_field_names(parts[0])}",
                                 parts[1] if len(parts) > 1 else key)
            nested = NESTED.get(".".join(parts[:2]))
            if nested is not None and len(parts) > 2:
                valid = [f.name for f in dataclasses.fields(nested)]
                if len(parts) != 3 or parts[2] not in valid:
                    raise InputError(CLI, where, f"one of the {parts[0]}.{parts[1]} keys "
                                     f"{valid}", ".".join(parts[2:]))
                node = out.setdefault(parts[0], {})
                if not isinstance(node, dict):
                    node = out[parts[0]] = {}
                sub = node.get(parts[1])
                if isinstance(sub, str):
                    sub = {"kind": sub}
                node[parts[1]] = {**(sub if isinstance(sub, dict) else {}), parts[2]: value}
                continue
            if len(parts) > 2 and parts[:2] != ["cluster", "params"]:
                raise InputError(CLI, where, f"{parts[0]}.{parts[1]} is a plain value", key)
        node = out
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return out


def _deepcopy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _deepcopy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deepcopy(v) for v in x]
    return x


# ---------------------------------------------------------------- building

def _section(src: str, data: dict, name: str) -> dict:
    d = data.get(name, {})
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise InputError(src, name, "a mapping of key: value", d)
    return d


def _fixed(src: str, data: dict, name: str, cls: type) -> Any:
    d = _section(src, data, name)
    valid = _field_names(name)
    kwargs = {}
    for k, v in d.items():
        if k not in valid:
            raise InputError(src, f"{name}.{k}", f"one of the {name} keys {valid}", k)
        kwargs[k] = _check(src, f"{name}.{k}", v)
        check_field(src, f"{name}.{k}", v)
    return cls(**kwargs)


def build_scenario(data: dict, source: str = "<scenario>",
                   default_name: str = "scenario") -> Scenario:
    """Validate a raw dict (as read from YAML) into a :class:`Scenario` (unresolved: see
    :func:`moesim.wiring.resolve`)."""
    src = source
    for k in data:
        if k not in TOP_LEVEL:
            raise InputError(src, str(k), f"one of the sections {list(TOP_LEVEL)}", k)
    name = check_name(src, "name", data.get("name", default_name))
    seed = data.get("seed", 0)
    if not (_is_int(seed) and seed >= 0):
        raise InputError(src, "seed", "an integer >= 0", seed)
    for k in DICT_SECTIONS:
        _section(src, data, k)
    if not _section(src, data, "model"):
        raise InputError(src, "model", "a model section, e.g. model: {preset: mixtral-8x7b}")
    if "topology" not in _section(src, data, "cluster"):
        raise InputError(src, "cluster.topology",
                         "a topology preset name (topologies/*.yaml) or a YAML file path")
    rdict = dict(_section(src, data, "routing"))
    dtypes = {k: _check(src, f"routing.{k}", rdict.pop(k))
              for k in ("dispatch_dtype", "combine_dtype", "grad_dispatch_dtype", "a2a_algo")
              if k in rdict}
    scn = Scenario(
        name=name, seed=seed,
        cluster=_fixed(src, data, "cluster", ClusterConfig),
        routing=RoutingSection(policy=rdict, **dtypes),
        parallel=_fixed(src, data, "parallel", ParallelConfig),
        schedule=_fixed(src, data, "schedule", ScheduleConfig),
        overlap=_fixed(src, data, "overlap", OverlapConfig),
        memory=_fixed(src, data, "memory", MemoryConfig),
        engine=_fixed(src, data, "engine", EngineConfig),
        source=src,
    )
    _check_schedule(scn)
    return _sections(_check_overlap(scn), data)


def _sections(scn: Scenario, data: dict) -> Scenario:
    """The sections with keys of their own, typed and checked (the names registered by
    the packages above, RL algorithms and serving schedulers, are checked by those
    packages when they run the section)."""
    src = scn.source
    serve = _section(src, data, "serve")
    return dataclasses.replace(
        scn, model=parse_model(_section(src, data, "model"), src),
        compute=parse_compute(_section(src, data, "compute"), src),
        serve=serve_from_dict(serve, src) if serve else None,
        rl=rl_from_dict(_section(src, data, "rl"), src),
        load=load_from_dict(_section(src, data, "load"), src, scn.seed),
        distill=distill_from_dict(_section(src, data, "distill"), src))


def _check_schedule(scn: Scenario) -> None:
    src, par, sch = scn.source, scn.parallel, scn.schedule
    check_tokens(src, sch.micro_batch_size, sch.seq_len)
    if par.vpp > 1 and sch.kind != "interleaved":
        raise InputError(src, "parallel.vpp", "1 unless schedule.kind is interleaved", par.vpp)
    if sch.kind in ("dualpipe", "dualpipev"):
        why = dual_check(sch.kind, par.pp, sch.microbatches)
        if why:   # deepseek-ai/DualPipe asserts these in step()
            field, got = (("parallel.pp", par.pp) if why[0] == "ranks" else
                          ("schedule.microbatches", sch.microbatches))
            raise InputError(src, field, why[1].replace("ranks", "parallel.pp"), got)
    if sch.kind == "interleaved":
        if par.pp < 2:
            raise InputError(src, "parallel.pp", "at least 2 stages for an interleaved schedule",
                             par.pp)
        if sch.microbatches % par.pp:
            raise InputError(src, "schedule.microbatches",
                             f"a multiple of parallel.pp={par.pp} for the interleaved schedule",
                             sch.microbatches)
        if par.vpp < 2:  # v = 1 is plain 1F1B: say so rather than run it under another name
            raise InputError(src, "parallel.vpp", "vpp >= 2 for schedule.kind interleaved "
                             "(vpp 1 is 1f1b)", par.vpp)


def _check_overlap(scn: Scenario) -> Scenario:
    """``ep_comm_overlap: true`` and ``kind: static`` name the same pairing: set both.
    ``a2a-1f1b`` follows Megatron-Core's assertions (transformer_config.py: EP > 1, a
    virtual pipeline when PP > 1; DualPipe brings its own overlap)."""
    src, ov, par, sch = scn.source, scn.overlap, scn.parallel, scn.schedule
    if ov.ep_comm_overlap and ov.kind not in ("none", "static"):
        raise InputError(src, "overlap.ep_comm_overlap",
                         f"false (or omitted) with overlap.kind {ov.kind}", True)
    if ov.kind == "a2a-1f1b":
        if sch.kind in ("gpipe", "dualpipe", "dualpipev"):
            raise InputError(src, "schedule.kind", "1f1b or interleaved with overlap.kind "
                             "a2a-1f1b", sch.kind)
        if par.pp > 1 and sch.kind != "interleaved":
            raise InputError(src, "schedule.kind", "interleaved with overlap.kind a2a-1f1b "
                             "when parallel.pp > 1 (Megatron-Core needs a virtual pipeline)",
                             sch.kind)
        if par.ep < 2:
            raise InputError(src, "parallel.ep", "at least 2 with overlap.kind a2a-1f1b",
                             par.ep)
    static = ov.ep_comm_overlap or ov.kind == "static"
    if ov.shared_expert and (ov.kind != "none" or static
                             or sch.kind in ("dualpipe", "dualpipev")):
        # those schedules already place the shared experts beside another
        # micro-batch's all-to-all (moesim.program.shared_overlap)
        raise InputError(src, "overlap.shared_expert", "false with overlap.kind "
                         f"{'static' if static else ov.kind} or schedule.kind {sch.kind} "
                         "(it overlaps one micro-batch's shared experts with its own "
                         "all-to-all, under gpipe, 1f1b or interleaved)", True)
    if static and par.pp == 1 and sch.kind in ("1f1b", "interleaved"):
        # 1F1B on one stage runs F0 B0 F1 B1 ...: no adjacent items of different
        # micro-batches to pair (moesim.program.overlap.PairRule), so the pairing would
        # change nothing. Megatron-Core overlaps there with its combined 1F1B
        # (combined_1f1b_schedule_for_no_pipelining: F(i+1) with B(i)) = a2a-1f1b.
        field = "overlap.kind" if ov.kind == "static" else "overlap.ep_comm_overlap"
        raise InputError(src, field, f"no static pairing with {sch.kind} on one pipeline "
                         "stage (F0 B0 F1 B1 ... has no adjacent items of different "
                         "micro-batches, so it would change nothing): overlap.kind a2a-1f1b "
                         "(Megatron-Core's combined 1F1B, F(i+1) with B(i)) or "
                         "schedule.kind gpipe", "static" if ov.kind == "static" else True)
    if ov.tp_comm:
        _check_tp_comm(scn, static)
    if static:
        scn = dataclasses.replace(scn, overlap=dataclasses.replace(
            ov, ep_comm_overlap=True, kind="static"))
    return scn


def _check_tp_comm(scn: Scenario, static: bool) -> None:
    """TE userbuffers need sequence parallelism over TP > 1 (Megatron's
    --tp-comm-overlap asserts --sequence-parallel); moesim pairs them on the 1F1B, GPipe
    and interleaved programs without EP overlap, CP or ZeRO-3."""
    src, ov, par, sch = scn.source, scn.overlap, scn.parallel, scn.schedule
    for bad, field, want, got in (
            (par.tp < 2, "parallel.tp", "at least 2", par.tp),
            (not par.sequence_parallel, "parallel.sequence_parallel", "true", False),
            (sch.kind in ("dualpipe", "dualpipev"), "schedule.kind", "gpipe, 1f1b or "
             "interleaved", sch.kind),
            (static or ov.kind != "none", "overlap.kind", "none",
             "static" if static else ov.kind),
            (par.cp > 1, "parallel.cp", "1", par.cp), (par.zero == 3, "parallel.zero",
                                                       "0, 1 or 2", 3)):
        if bad:
            raise InputError(src, field, f"{want} with overlap.tp_comm (Transformer "
                             "Engine's TP communication overlap, moesim.program."
                             "tp_overlap)", got)


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Read, override, validate (unresolved: :func:`moesim.wiring.resolve` builds its
    parts). ``path`` may be a file or a shipped scenario name."""
    p = _find(path)
    raw = _read(p)
    data = apply_overrides(raw, overrides)

    def build(ov):
        return build_scenario(apply_overrides(raw, ov), source=str(p), default_name=p.stem)
    try:
        scn = build_scenario(data, source=str(p), default_name=p.stem)
    except InputError as err:
        raise blame_overrides(err, str(p), overrides, build) from None
    return dataclasses.replace(scn, overrides=tuple(overrides))
