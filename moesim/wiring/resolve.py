"""Resolve a scenario's named parts into objects: topology, layout, model, routing,
device and compute model (:class:`moesim.scenario.resolved.Resolved`).

The schema (:mod:`moesim.scenario`) reads and checks the file as data; this module asks
the owning packages to build their parts (``moesim.topology.load_topology``,
``moesim.model.model_from_dict``, ``moesim.gating.routing_from_dict``,
``moesim.compute.devices.get_device``, ``moesim.compute.select.compute_model``) and
checks them against each other, before any work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from moesim.compute.calibrated import load_calibration
from moesim.compute.devices import DeviceSpec, get_device
from moesim.compute.select import compute_model
from moesim.errors import InputError
from moesim.gating import routing_from_dict
from moesim.model import model_from_dict, model_warnings
from moesim.model.kernels.reference import for_scenario as reference_kernels
from moesim.scenario.blame import blame_overrides, named_by
from moesim.scenario.checks import (
    check_deepep_hidden,
    check_fp8_recipe,
    check_hot_shares,
    check_node_limit,
    check_seq,
    check_simulated,
    check_sms,
    product_error,
    routing_ignored_warnings,
)
from moesim.scenario.expert_slots import serving_redundant
from moesim.scenario.limits import check_local_experts
from moesim.scenario.read import load_scenario
from moesim.scenario.resolved import Resolved, scenario_layout
from moesim.scenario.schema import Scenario, step_graph_floor_s
from moesim.schedule.a2a_overlap import TRUST_WARNING as A2A_1F1B_WARNING
from moesim.schedule.layout_string import stage_chunks
from moesim.topology import Topology, load_topology
from moesim.topology.machine import machine_topology
from moesim.units import US


def load_cluster(scn: Scenario) -> Topology:
    """The scenario's topology (``moesim.topology.load_topology``)."""
    name = scn.cluster.topology
    if name == "calibration":
        return calibration_cluster(scn)
    p = Path(name)
    if (p.suffix in (".yaml", ".yml") or "/" in name) and not p.is_absolute():
        p = Path(scn.source).parent / p  # a relative path is relative to the scenario file
        name = str(p) if p.is_file() else name
    params = scn.cluster.topology_params()
    try:
        return load_topology(name, **params)
    except InputError as err:
        raise _blame_scenario(err, scn, params) from None


def _blame_scenario(err: InputError, scn: Scenario, params: dict) -> InputError:
    """``err`` from loading the scenario's topology, naming the scenario's field when
    the bad value came from the scenario (its topology name, ``cluster.nodes`` or a
    ``cluster.params`` entry) rather than from the topology file."""
    if not err.field:  # no such topology
        return InputError(scn.source, "cluster.topology", *err.args[2:])
    key = err.field.removeprefix("params.")
    if key == err.field or key not in params:
        return err  # the topology file's own value
    field = "cluster.nodes" if key == "nodes" and scn.cluster.nodes is not None \
        else f"cluster.params.{key}"
    if err.expected.startswith("no parameters"):  # an explicit graph takes none
        return InputError(scn.source, field, f"no {field} with topology "
                          f"{scn.cluster.topology}, an explicit graph with its own nodes "
                          f"(delete {field}, or pass --set {field}=null)", params[key])
    return InputError(scn.source, field, *err.args[2:])


def calibrated_device(device: DeviceSpec, compute: Any, scn: Scenario) -> DeviceSpec:
    """The device entry fed by a calibration (``compute: {kind: calibration}``) recorded
    on that device (the calibration's ``device``: ``cpu`` for gloo recordings, the GPU's
    catalog name for nccl ones): its peak becomes the calibrated GEMM rate, its
    bandwidth the calibrated memory-bound rate and its per-kernel overhead the
    calibrated host gap per op, so MFU and the memory report use the measured machine.
    Other devices are unchanged (a CPU calibration says nothing about an H100)."""
    if not hasattr(compute, "gemm_flops_per_s"):
        return device
    if str(getattr(device, "name", "")).lower() != str(compute.device).lower():
        return device
    return dataclasses.replace(
        device, peak_bf16_flops=compute.gemm_flops_per_s, hbm_Bps=compute.memory_bytes_per_s,
        launch_overhead_s=compute.op_gap_s,
        calibrated_from=f"{scn.compute.file} (moesim calibrate)")


def calibration_cluster(scn: Scenario) -> Topology:
    """``cluster: {topology: calibration, params: {file: calib.json, ranks: N}}``: the
    machine a calibration was recorded on (``moesim.topology.machine.machine_topology``:
    N ranks on one host, links with the calibrated all-to-all latency and bandwidth,
    half duplex for gloo). Pair it with ``compute: {kind: calibration, file: ...}`` and
    ``cluster.device: cpu`` to simulate the recording machine itself. A relative
    ``file`` is taken relative to the scenario file."""
    src = scn.source
    params = dict(scn.cluster.params)
    extra = sorted(set(params) - {"file", "ranks"})
    if extra:
        raise InputError(src, f"cluster.params.{extra[0]}", "only file and ranks for "
                         "topology: calibration", extra[0])
    path, ranks = params.get("file"), params.get("ranks", scn.cluster.nodes)
    if not isinstance(path, str) or not path:
        raise InputError(src, "cluster.params.file", "a calibration file (moesim calibrate "
                         "-o) for topology: calibration", path)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise InputError(src, "cluster.params.ranks", "a positive number of ranks on the "
                         "recording machine", ranks)
    p = Path(path)
    if not p.is_absolute() and Path(src).is_file():
        p = Path(src).parent / p
    comm = load_calibration(p).comm
    if comm is None:
        raise InputError(str(p), "comm", "an all-to-all fit (a GPU calibration has one only "
                         "when its trace had NCCL kernels with byte counts)", "none")
    return machine_topology(ranks, comm)


def resolve(scn: Scenario) -> Resolved:
    """Check the scenario against its cluster and build every named part. An error
    about a value given by ``--set`` names the command line."""
    try:
        return _resolve(scn)
    except InputError as err:
        err = blame_overrides(err, scn.source, scn.overrides, _recheck(scn))
        raise named_by(err, scn.source, "named by") from None


def _recheck(scn: Scenario):
    """The same checks on the scenario's file with some of its overrides (see
    :func:`moesim.scenario.blame.blame_overrides`); None for a scenario a command built
    from another (a serving step, an RL trainer: their own callers blame)."""
    if scn.serve is not None or scn.rl is not None or not Path(scn.source).is_file():
        return None

    def check(overrides):
        _resolve(dataclasses.replace(load_scenario(scn.source, overrides),
                                     overrides=tuple(overrides)))
    return check


def _resolve(scn: Scenario) -> Resolved:
    src = scn.source
    check_simulated(scn)
    topo = load_cluster(scn)
    world = len(topo.gpus)
    gpn = getattr(topo, "gpus_per_node", None)
    par = scn.parallel
    if par.dp is None and world is not None:
        if world % par.tp:
            raise InputError(src, "parallel.tp", f"a divisor of the world size {world}", par.tp)
        if world % (par.tp * par.cp * par.pp):
            raise product_error(src, par, world, scn.overrides)
        par = dataclasses.replace(par, dp=world // (par.tp * par.cp * par.pp))
    scn = dataclasses.replace(scn, parallel=par, world=world, gpus_per_node=gpn)
    layout, warns = scenario_layout(scn)
    check_seq(src, scn.schedule.seq_len, layout.cp)   # before any command lays it out
    scn = dataclasses.replace(scn, world=layout.world, parallel=dataclasses.replace(
        par, dp=layout.dp))

    model = model_from_dict(scn.model, src)
    # a model read from a Hugging Face config.json: the fields it could not map
    warns = [*warns, *model_warnings(scn.model, src)]
    if getattr(model, "n_experts", 0):
        check_local_experts(src, model.n_experts, layout.ep)
        layout.check_experts(model.n_experts, serving_redundant(scn))
    chunks = par.pp * par.vpp
    if model.layers < par.pp:
        raise InputError(src, "parallel.pp", f"at most the model's {model.layers} layers",
                         par.pp)
    if model.layers < chunks and not par.pipeline_layout:   # a layout's stages may hold no layer
        raise InputError(src, "parallel.vpp", f"pp*vpp <= the model's {model.layers} "
                         f"layers (pp={par.pp})", par.vpp)
    # the pipeline layout and the MTP layers' place, checked before any work
    dual = scn.schedule.kind in ("dualpipe", "dualpipev")
    stage_chunks(scn, model, 2 * par.pp if dual else
                 par.pp * (par.vpp if scn.schedule.kind == "interleaved" else 1), dual)

    routing = routing_from_dict(dict(scn.routing.policy), src)
    if getattr(model, "n_experts", 0):
        check_hot_shares(src, scn.routing.policy, routing, model.n_experts,
                         routing.top_k or model.top_k)
    limit = check_node_limit(src, routing, layout, scn.gpus_per_node, warn=scn.rl is not None)
    warns = [*warns, *([limit] if limit else []),
             *routing_ignored_warnings(scn.routing.policy),
             *([A2A_1F1B_WARNING] if scn.overlap.kind == "a2a-1f1b" else [])]

    device = compute = None
    name = scn.cluster.device or getattr(topo, "device", None)
    if isinstance(name, str):
        device = get_device(name, src, field="cluster.device")
    elif name is not None:
        device = name  # the topology already holds a device object
    # compute.model: catalog (default, where the catalog covers the device) or roofline
    if device is not None:
        cd = scn.compute.as_dict()
        floor = step_graph_floor_s(scn, device)
        if floor is not None and cd.get("kind") != "calibration":
            # a step replayed from one CUDA graph: every kernel costs the graph floor
            cd["launch_overhead_us"] = floor / US
        compute = compute_model(cd, src, device)
        device = calibrated_device(device, compute, scn)
        check_sms(src, scn, device)
    check_deepep_hidden(src, scn, model)
    prec = scn.compute.precision
    if prec in ("bf16", "fp8") and getattr(model, "precision", prec) != prec:
        model = dataclasses.replace(model, precision=prec)   # the FP8 recipe's kernels
    check_fp8_recipe(src, scn)
    if scn.compute.fp8_recipe != "blockwise":    # model.kernels.tensorwise
        model = dataclasses.replace(model, fp8_recipe=scn.compute.fp8_recipe)
    if scn.compute.fusion:       # compute.fusion: the fused kernels (model.kernels.fusion)
        model = dataclasses.replace(model, fusion=tuple(scn.compute.fusion))
    # Megatron's sort_chunks_by_idxs: its all-to-all dispatcher, > 1 local expert, training
    sort = (scn.serve is None and scn.rl is None and scn.parallel.ep_backend.kind == "nccl"
            and getattr(model, "n_experts", 0) // max(scn.parallel.ep, 1) > 1)
    refs = reference_kernels(scn.compute.memory_kernels, scn.compute.precision,
                             scn.memory.activation_dtype, scn.routing.dispatch_dtype, sort)
    if refs:                     # model.kernels.reference: listed beside published rates
        model = dataclasses.replace(model, reference_kernels=refs)
    return Resolved(scn, layout, tuple(warns), topo, model, routing, device, compute)
