"""A campaign's step and checkpoint costs from a scenario: the step time from one
simulated step (:func:`moesim.wiring.simulate`) or given, tokens per step from the
schedule and layout, checkpoint bytes from the memory model.

A checkpoint holds each parameter's weight and its optimizer state (fp32 master, Adam m
and v: :data:`moesim.memory.model.OPTIMIZER_BYTES`), written once: each rank writes its
shard as ZeRO-3 would place it (non-expert parameters over DP·CP, expert parameters over
the expert-data-parallel group), as PyTorch Distributed Checkpoint and Megatron-Core's
distributed checkpoints save replicated tensors once. So a rank's bytes are the
``weights + optimizer`` of :func:`moesim.memory.model.memory_per_rank` with ``zero=3``.
"""

from __future__ import annotations

from moesim.campaign.simulate import Costs
from moesim.campaign.spec import Campaign
from moesim.errors import InputError


def checkpoint_shards(res) -> tuple[float, float]:
    """(whole checkpoint bytes, the largest shard one rank writes) of a resolved scenario."""
    from moesim.memory.report import StageMemory

    sm = StageMemory(res)
    sm.common = dict(sm.common, zero=3)     # each rank's shard of weights and optimizer
    pp = res.scenario.parallel.pp
    per_stage = [sm.row(s) for s in range(pp)]
    shard = [r["weights"] + r["optimizer"] for r in per_stage]
    ranks_per_stage = res.layout.world // pp
    return float(sum(shard) * ranks_per_stage), float(max(shard))


def tokens_per_step(res) -> int:
    """Tokens one step trains on: micro-batch tokens × micro-batches × data-parallel
    replicas."""
    sch = res.scenario.schedule
    return int(sch.tokens_per_microbatch * sch.microbatches * res.layout.dp)


def scenario_costs(camp: Campaign, res, step_s: float | None) -> tuple[Costs, dict]:
    """The campaign's costs on a resolved scenario (``res`` None: all from the campaign
    file) and where each came from."""
    src: dict[str, str] = {}
    if res is not None:
        world = res.layout.world
        gpn = res.scenario.gpus_per_node or 1
        dp = res.layout.dp
        src["gpus"] = f"the scenario ({world} ranks)"
    else:
        world, gpn, dp = camp.gpus, camp.gpus_per_node or 8, camp.dp or 1
        src["gpus"] = f"{camp.source}: cluster.gpus"
    if camp.gpus is not None and res is not None and camp.gpus != world:
        src["gpus"] = f"{camp.source}: cluster.gpus (the failure model; the step is the " \
                      f"scenario's {world} ranks)"
        world = camp.gpus
        dp = camp.dp or dp
    if world is None:
        raise InputError(camp.source, "cluster.gpus", "the cluster's GPUs (or a scenario)",
                         None)
    gpn = camp.gpus_per_node or gpn
    if camp.ckpt_bytes is not None:
        total = camp.ckpt_bytes
        per_gpu = total / world
        src["checkpoint"] = f"{camp.source}: checkpoint.bytes, spread evenly over the GPUs"
    elif res is not None:
        total, per_gpu = checkpoint_shards(res)
        if world != res.layout.world:
            total *= world / res.layout.world
        src["checkpoint"] = "memory model: weights + optimizer state, sharded as ZeRO-3 " \
                            "places them"
    else:
        raise InputError(camp.source, "checkpoint.bytes", "the checkpoint size (or a "
                         "scenario whose memory model gives it)", None)
    if total > camp.capacity_B:
        raise InputError(camp.source, "storage.capacity", f"room for one checkpoint of "
                         f"{total / 1e12:.3f} TB", f"{camp.capacity_B / 1e12:.3f} TB")
    if step_s is None:
        step_s = camp.step_s
        src["step"] = f"{camp.source}: step.seconds" if step_s is not None else ""
    else:
        src["step"] = src.get("step_given", "given")
    tokens = camp.step_tokens
    src["tokens"] = f"{camp.source}: step.tokens"
    if tokens is None:
        if res is None:
            raise InputError(camp.source, "step.tokens", "the tokens of one step (or a "
                             "scenario)", None)
        tokens = tokens_per_step(res) * (world / res.layout.world)
        src["tokens"] = "the scenario: micro-batch tokens × micro-batches × DP"
    if camp.target == "memory":     # Gemini: replicas in peers' CPU memory
        copy = per_gpu / camp.host_copy_Bps
        write = per_gpu / camp.peer_Bps
        load = per_gpu / camp.peer_Bps
    else:
        copy = per_gpu / camp.host_copy_Bps
        write = total / camp.write_Bps
        load = total / camp.read_Bps
    if camp.mode == "async":
        pause, lag = copy, write
    else:
        pause, lag = (copy + write if camp.target == "memory" else write), 0.0
    costs = Costs(step_s=float(step_s or 0.0), tokens_per_step=float(tokens), gpus=int(world),
                  nodes=max(int(world) // int(gpn), 1), dp=int(dp), ckpt_bytes=float(total),
                  ckpt_bytes_per_gpu=float(per_gpu), pause_s=pause, lag_s=lag,
                  write_s=total / camp.write_Bps, load_s=load,
                  peer_load_s=per_gpu / camp.peer_Bps)
    return costs, src
