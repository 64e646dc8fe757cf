"""A student's training step with a teacher's forward pass: time and memory.

- **student**: the scenario's own training step (``moesim run``,
  :func:`moesim.wiring.simulate`), over ``D x m`` sequences of ``seq_len`` tokens (``D``
  data-parallel replicas, ``m = microbatches x micro_batch_size``);
- **teacher**: its forward pass over those sequences (:mod:`moesim.distill.teacher`);
- **transfer**: its outputs to the student's last pipeline stage
  (:mod:`moesim.distill.transfer`): the network, or HBM where sender and receiver are
  one GPU;
- **loss**: the fused distillation loss on every last-stage rank, once per micro-batch
  (:func:`moesim.distill.outputs.loss_kernel`), and with full logits on a student TP
  group above 1 the two all-reduces (max, sum of exponentials: one fp32 per token each)
  of the teacher's vocabulary-parallel softmax, as Megatron's vocabulary-parallel
  cross-entropy does for the student's own.

``colocated``: the teacher runs on the student's GPUs in series with its step: step =
student + teacher + transfer + loss. ``separate``: the teacher, on its own GPUs, computes
the next step's outputs while the student trains on this one's (a producer one step
ahead): step = max(student + loss, teacher + transfer). Not modelled: the transfer's
contention with the student's own traffic, the teacher's pass on a pipeline.

Memory per GPU, bytes: ``colocated``: the student's peak (``moesim memory``'s table, its
largest stage) + the teacher's weights (:func:`moesim.serve.memory.weight_bytes`) + the
step's outputs the GPU receives; ``separate``: the teacher's GPU holds its weights, the
activations of its pass (:func:`moesim.serve.memory.table`) and the outputs of its
sequences until they are sent; the student's GPU its peak plus what it receives.
"""

from __future__ import annotations

import dataclasses
import math

from moesim.distill import outputs as out
from moesim.distill.teacher import serve_config, teacher_pass, teacher_scenario
from moesim.distill.transfer import pair_bytes_matrix, transfer
from moesim.errors import InputError
from moesim.memory.fit import Fit
from moesim.model import model_from_dict
from moesim.scenario.schema import Scenario
from moesim.scenario.sections.distill import DistillSection
from moesim.wiring import resolve_path
from moesim.wiring.resolve import load_cluster


@dataclasses.dataclass(frozen=True)
class DistillSetup:
    scenario: Scenario          # the student's (its distill section included)
    res: object                 # the student's resolved scenario
    cfg: DistillSection
    teacher: object             # the teacher's ModelSpec
    teacher_gpus: int
    memory: dict = dataclasses.field(default_factory=dict)   # per GPU, bytes (_memory)


def _err(scn: Scenario, field: str, expected: str, got) -> InputError:
    return InputError(scn.source, f"distill.{field}", expected, got)


def distill_setup(path, overrides=()) -> DistillSetup:
    """The student's scenario resolved and its ``distill`` section checked against it:
    the teacher built, its vocabulary the student's, ``k`` at most the vocabulary, its
    layout dividing its GPUs (whole nodes when separate), the teacher and its outputs in
    device memory. An error about a value given by ``--set`` names the command line."""
    from moesim.scenario.blame import blame_overrides

    res = resolve_path(path, overrides)
    try:
        return _setup(res)
    except InputError as err:
        raise blame_overrides(err, res.scenario.source, res.scenario.overrides,
                              lambda ovs: _setup(resolve_path(path, ovs))) from None


def _setup(res) -> DistillSetup:
    scn = res.scenario
    cfg = scn.distill
    if cfg is None:
        raise InputError(scn.source, "distill", "a distill section (docs/distillation.md), "
                         "e.g. distill: {teacher: qwen3-235b-a22b, outputs: topk, k: 64}")
    try:
        teacher = model_from_dict(cfg.teacher.as_dict(), scn.source)
    except InputError as err:
        field = err.field.removeprefix("model.").removeprefix("model")
        raise InputError(scn.source, "distill.teacher" + (f".{field}" if field else ""),
                         *err.args[2:]) from None
    student = res.model
    if teacher.vocab != student.vocab:
        raise _err(scn, "teacher", f"a teacher with the student's vocabulary "
                   f"({student.vocab:,} entries): logits are compared token by token",
                   f"{teacher.name} with {teacher.vocab:,}")
    if cfg.outputs == "topk" and cfg.k > teacher.vocab:
        raise _err(scn, "k", f"at most the vocabulary ({teacher.vocab:,})", cfg.k)
    gpn = scn.gpus_per_node or len(res.topology.gpus)
    gpus = res.layout.world if cfg.placement == "colocated" else cfg.teacher_gpus
    if cfg.placement == "separate" and gpus >= gpn and gpus % gpn:
        raise _err(scn, "teacher_gpus", f"whole nodes of {gpn} GPUs (or fewer than one "
                   "node)", gpus)
    if cfg.placement == "separate" and gpus < gpn and res.layout.world % gpn:
        raise _err(scn, "teacher_gpus", "whole nodes beside a student on part of a node",
                   gpus)
    for name, v in (("teacher_tp", cfg.teacher_tp), ("teacher_ep", cfg.teacher_ep)):
        if gpus % v:
            raise _err(scn, name, f"a divisor of the teacher's {gpus} GPUs", v)
    if not teacher.moe and cfg.teacher_ep > 1:
        raise _err(scn, "teacher_ep", f"1 for a dense teacher ({teacher.name})",
                   cfg.teacher_ep)
    if teacher.moe and teacher.n_experts % cfg.teacher_ep:
        raise _err(scn, "teacher_ep", f"a divisor of the teacher's {teacher.n_experts} "
                   "experts", cfg.teacher_ep)
    if cfg.teacher_ep > 1 and cfg.teacher_ep % cfg.teacher_tp:
        raise _err(scn, "teacher_ep", f"1 or a multiple of teacher_tp ({cfg.teacher_tp})",
                   cfg.teacher_ep)
    setup = DistillSetup(scn, res, cfg, teacher, gpus)
    return dataclasses.replace(setup, memory=_memory(setup))


def step_shape(res) -> dict:
    """Sequences and tokens of the student's step."""
    sch, lay = res.scenario.schedule, res.layout
    m = sch.microbatches * sch.micro_batch_size
    return {"replicas": lay.dp, "sequences_per_replica": m, "sequences": lay.dp * m,
            "seq_len": sch.seq_len, "tokens": lay.dp * m * sch.seq_len}


def _loss(setup: DistillSetup, shape: dict) -> dict:
    """The loss on one last-stage rank over the step, and its all-reduces."""
    from moesim.collectives.simulate import simulate_collective

    res, cfg = setup.res, setup.cfg
    lay, sch = res.layout, res.scenario.schedule
    tokens = sch.micro_batch_size * sch.seq_len // lay.cp      # per micro-batch, per rank
    k = out.loss_kernel(cfg.outputs, tokens, setup.teacher.vocab, lay.tp, cfg.k,
                        cfg.value_bytes)
    kernel_s = sch.microbatches * res.compute.time_s(k)
    reduce_s = 0.0
    if cfg.outputs == "logits" and lay.tp > 1:
        group = [r for r in range(lay.world) if lay.coords["dp"][r] == 0
                 and lay.coords["pp"][r] == lay.pp - 1 and lay.coords["cp"][r] == 0]
        one = simulate_collective(res.topology, "all_reduce", tokens * out.STAT_BYTES,
                                  ranks=group)["time_s"]
        reduce_s = sch.microbatches * 2 * float(one)
    return {"kernel_s": kernel_s, "all_reduce_s": reduce_s, "time_s": kernel_s + reduce_s,
            "bytes_per_rank": sch.microbatches * k.bytes}


def _transfer(setup: DistillSetup, shape: dict, seq_bytes: float) -> dict:
    res, cfg, scn = setup.res, setup.cfg, setup.scenario
    if cfg.placement == "colocated":
        topo = res.topology
        teacher_gpus = list(range(res.layout.world))
    else:
        gpn = scn.gpus_per_node or len(res.topology.gpus)
        nodes = math.ceil(res.layout.world / gpn) + math.ceil(setup.teacher_gpus / gpn)
        topo = load_cluster(dataclasses.replace(
            scn, cluster=dataclasses.replace(scn.cluster, nodes=nodes)))
        first = res.layout.world if res.layout.world % gpn == 0 else gpn
        teacher_gpus = list(range(first, first + setup.teacher_gpus))
    pairs = pair_bytes_matrix(res.layout, teacher_gpus, cfg.teacher_tp, seq_bytes,
                              shape["sequences_per_replica"])
    return transfer(topo, pairs)


def _memory(setup: DistillSetup) -> dict:
    """Bytes per GPU (module docstring); a teacher, or outputs, that do not fit beside a
    student that fits alone is one line."""
    from moesim.memory.report import memory_table
    from moesim.serve.memory import table, weight_bytes

    res, cfg = setup.res, setup.cfg
    shape = step_shape(res)
    seq_bytes = out.output_bytes(cfg.outputs, shape["seq_len"], setup.teacher.vocab, cfg.k,
                                 cfg.value_bytes)
    per_group = math.ceil(shape["sequences"] / (setup.teacher_gpus // cfg.teacher_tp))
    first = 0 if cfg.placement == "colocated" else res.layout.world
    pairs = pair_bytes_matrix(res.layout, list(range(first, first + setup.teacher_gpus)),
                              cfg.teacher_tp, seq_bytes, shape["sequences_per_replica"])
    received: dict[int, float] = {}
    for (_src, dst), b in pairs.items():
        received[dst] = received.get(dst, 0.0) + b
    stages = memory_table(res)["stages"]
    student_peak = max(s["peak_bytes"] for s in stages)
    cap = float(res.device.hbm_bytes)
    tw = weight_bytes(setup.teacher, cfg.teacher_tp, cfg.teacher_ep)
    tcfg = serve_config(setup.scenario, cfg, shape["seq_len"])
    tact = table(setup.teacher, tcfg, cap)["activations_bytes"]
    row = {"student_peak_bytes": student_peak, "teacher_weights_bytes": tw,
           "teacher_activations_bytes": tact,
           # full logits: a rank holds its vocabulary slice; top k: every rank the merged k
           "teacher_outputs_held_bytes": per_group * seq_bytes / (
               cfg.teacher_tp if cfg.outputs == "logits" else 1),
           "student_received_bytes": max(received.values(), default=0.0),
           "capacity_bytes": cap}
    got = row["student_received_bytes"]
    if cfg.placement == "colocated":
        fits = [Fit("student with a colocated teacher", student_peak + tw + got, cap)]
    else:
        fits = [Fit(f"teacher (tp {cfg.teacher_tp} ep {cfg.teacher_ep})",
                    tw + tact + row["teacher_outputs_held_bytes"], cap),
                Fit("student receiving the teacher's outputs", student_peak + got, cap)]
    row["checks"] = [f.to_dict() for f in fits]
    bad = [f for f in fits if f.oom]
    if bad and not student_peak > cap:
        field = "placement" if cfg.placement == "colocated" else (
            "teacher_gpus" if bad[0].what.startswith("teacher") else "outputs")
        raise _err(setup.scenario, field, "a teacher and outputs that fit in device memory",
                   bad[0].text())
    return row


def simulate_distill(setup: DistillSetup, student_step_s: float | None = None) -> dict:
    """The step's parts (seconds), bytes and memory; ``student_step_s`` skips the
    student's simulation (a test's or a study's known value)."""
    from moesim.wiring import simulate

    res, cfg, scn = setup.res, setup.cfg, setup.scenario
    shape = step_shape(res)
    L, V = shape["seq_len"], setup.teacher.vocab
    seq_bytes = out.output_bytes(cfg.outputs, L, V, cfg.k, cfg.value_bytes)
    tscn = teacher_scenario(scn, cfg, setup.teacher_gpus,
                            scn.gpus_per_node or len(res.topology.gpus))
    tpass = teacher_pass(tscn, scn, cfg, L, shape["sequences"], setup.teacher_gpus)
    xfer = _transfer(setup, shape, seq_bytes)
    mem = setup.memory
    loss = _loss(setup, shape)
    student = (float(simulate(res).summary["step_time_s"]) if student_step_s is None
               else float(student_step_s))
    if cfg.placement == "colocated":
        step = student + tpass["time_s"] + xfer["time_s"] + loss["time_s"]
    else:
        step = max(student + loss["time_s"], tpass["time_s"] + xfer["time_s"])
    toks = shape["tokens"]
    return {
        "teacher": setup.teacher.name, "placement": cfg.placement, "outputs": cfg.outputs,
        "k": cfg.k if cfg.outputs == "topk" else None, "logit_dtype": cfg.logit_dtype,
        "teacher_gpus": setup.teacher_gpus, "teacher_tp": cfg.teacher_tp,
        "teacher_ep": cfg.teacher_ep, "vocab": V, **shape,
        "bytes": {
            "outputs_per_step": out.output_bytes(cfg.outputs, toks, V, cfg.k,
                                                 cfg.value_bytes),
            "full_logits_per_step": out.full_logits_bytes(toks, V, cfg.value_bytes),
            "topk_per_step": out.topk_bytes(toks, cfg.k, cfg.value_bytes),
            "over_network": xfer["network_bytes"], "read_from_hbm": xfer["hbm_bytes"],
            "all_gather_per_step": tpass["all_gather_bytes_per_sequence"]
            * shape["sequences"],
            "loss_per_rank": loss["bytes_per_rank"]},
        "time_s": {
            "student_step": student, "teacher_forward": tpass["time_s"],
            "teacher_per_sequence": tpass["per_sequence_s"],
            "transfer": xfer["time_s"], "loss": loss["time_s"],
            "loss_all_reduce": loss["all_reduce_s"], "step": step, "added": step - student},
        "sequences_per_teacher_group": tpass["sequences_per_group"],
        "flows": xfer["flows"],
        "memory": mem,
    }
