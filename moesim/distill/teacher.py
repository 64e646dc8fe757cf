"""The teacher's forward pass over a student step's sequences, on its GPUs.

A teacher pass is priced as ``moesim rl`` prices a log-prob pass (docs/rl.md): a
``moesim serve`` prefill step (:func:`moesim.serve.run.simulate_serve`) of one sequence
per GPU on the teacher's layout (``teacher_tp``, ``teacher_ep``, attention data parallel
over the TP groups, one pipeline stage), so a TP group computes ``tp`` sequences in one
step; then, per sequence, the LM head over every token (a prefill computes the last
token's only: :func:`moesim.serve.costs.head_kernels` without the sampler) and the
outputs' kernels (:func:`moesim.distill.outputs.teacher_output_kernels`), plus, for top-k,
the distributed top-k's all-gather over the TP group as a collective on the teacher's
topology (:func:`moesim.collectives.simulate.simulate_collective`, every member arriving
together). A pool of ``G = gpus / tp`` groups takes ``ceil(sequences / G)`` sequences per
group. The routed experts run one launch per expert (Megatron-Core's GroupedLinear), as a
trainer's forward does.
"""

from __future__ import annotations

import dataclasses
import math

from moesim.distill.outputs import allgather_bytes, teacher_output_kernels
from moesim.scenario.schema import ParallelConfig, Scenario
from moesim.scenario.sections.distill import DistillSection
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve.config import serving_scenario
from moesim.serve.costs import head_kernels
from moesim.serve.run import simulate_serve
from moesim.wiring import resolve


def teacher_scenario(scn: Scenario, cfg: DistillSection, gpus: int,
                     gpus_per_node: int) -> Scenario:
    """The scenario the teacher's pass runs on: the student's cluster kind cut to the
    teacher's ``gpus``, the teacher's model, no layout of the student's (the serving
    step sets it), experts launched one by one."""
    t = dataclasses.replace(
        scn, model=cfg.teacher, cluster=scn.cluster.pool(gpus, gpus_per_node),
        parallel=ParallelConfig(order=scn.parallel.order,
                                ep_backend=scn.parallel.ep_backend),
        serve=None, rl=None, load=None, distill=None)
    return dataclasses.replace(t, compute=t.compute.with_default(
        "expert_launches", "per_expert", scn.source))


def serve_config(scn: Scenario, cfg: DistillSection, seq_len: int) -> ServeConfig:
    backend = scn.parallel.ep_backend.kind if cfg.teacher_ep > 1 else "nccl"
    return ServeConfig(phase="prefill", batch_per_gpu=1, prompt=seq_len, output=1,
                       tp=cfg.teacher_tp, ep=cfg.teacher_ep, ep_backend=backend)


def teacher_pass(tscn: Scenario, scn: Scenario, cfg: DistillSection, seq_len: int,
                 sequences: int, gpus: int) -> dict:
    """Seconds of the teacher's pass over ``sequences`` sequences of ``seq_len`` tokens
    on ``gpus`` GPUs, by part (per sequence and in all), and the all-gather's bytes."""
    from moesim.collectives.simulate import simulate_collective

    scfg = serve_config(scn, cfg, seq_len)
    res = resolve(serving_scenario(tscn, scfg))
    step = float(simulate_serve(res, scfg, record_series=False, spans=False)
                 .summary["step_time_s"])
    tp, spec = cfg.teacher_tp, res.model
    head = [k for k in head_kernels(spec, seq_len, tp) if k.name != "sampler"]
    outs = teacher_output_kernels(cfg.outputs, seq_len, spec.vocab, tp, cfg.k,
                                  cfg.value_bytes)
    gather = allgather_bytes(seq_len, cfg.k, tp, cfg.value_bytes)
    gather_s = 0.0
    if cfg.outputs == "topk" and tp > 1:
        gather_s = float(simulate_collective(res.topology, "all_gather",
                                             gather["size_bytes"],
                                             ranks=list(range(tp)))["time_s"])
    per = {"forward_s": step / tp, "lm_head_s": sum(res.compute.time_s(k) for k in head),
           "outputs_kernels_s": sum(res.compute.time_s(k) for k in outs),
           "topk_all_gather_s": gather_s}
    groups = gpus // tp
    per_group = math.ceil(sequences / groups)
    return {"per_sequence_s": per, "sequences_per_group": per_group, "groups": groups,
            "time_s": per_group * sum(per.values()),
            "kernels": [k.name for k in outs],
            "all_gather_bytes_per_sequence": gather["size_bytes"] if cfg.outputs == "topk"
            and tp > 1 else 0, "spec": spec, "res": res}
