"""A training campaign over wall-clock time: steps run, checkpoints are written, failures
arrive and the job restarts from the last durable checkpoint (pure numpy, no simpy).

Failures of every cause are one Poisson process per cause over wall-clock time (rates
from the campaign file times the units of the cluster: GPUs, nodes or the job), drawn
from the seed alone: two policies run with the same seed meet the same failures, so
their difference is the policy's (common random numbers). Work is measured in seconds of
uninterrupted training (``work / step_s`` steps).

- A checkpoint starts every ``interval_s`` of work. Synchronous: training pauses for the
  whole write and the checkpoint is durable at its end. Asynchronous (PyTorch DCP
  ``async_save``, Megatron-LM's ``--async-save``): training pauses only for the copy to
  host memory, the write runs beside training and the checkpoint is durable when it
  ends; a checkpoint due while the previous write runs waits for it.
- An interruption loses the work since the last durable checkpoint (a pending write is
  lost too), then costs detection (crash or hang), a replacement node when the cause is
  the hardware's (a hot spare if one is free, else a cold node), relaunch, NCCL set-up
  and loading the checkpoint. An interruption during recovery starts recovery again.
- Planned maintenance stops the job after a synchronous checkpoint: no work lost.
- A straggler (``stragglers`` in the campaign file) slows the synchronous job to
  1/slowdown for its duration: counted as a stall of duration·(1 − 1/slowdown), no
  restart, no work lost.
- With ``domain: replica`` a node-scoped failure restarts only its data-parallel replica:
  no work lost; the job stalls through detection and then runs at (dp−1)/dp until the
  replica is back (counted as a stall of detection + rest/dp), the replica's state coming
  from a peer replica at the network rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from moesim.campaign.spec import DAY, Campaign, Cause


@dataclass(frozen=True)
class Costs:
    """What one campaign's steps and checkpoints cost, seconds and bytes."""

    step_s: float
    tokens_per_step: float
    gpus: int
    nodes: int
    dp: int
    ckpt_bytes: float            # the whole checkpoint, every rank's shard
    ckpt_bytes_per_gpu: float    # the largest shard one GPU writes
    pause_s: float               # training stopped per checkpoint
    lag_s: float                 # after the pause, until the checkpoint is durable
    write_s: float               # a full synchronous write (planned stops)
    load_s: float                # reading the checkpoint back on restart
    peer_load_s: float           # a replica's state from a peer (domain: replica)


@dataclass
class Timeline:
    """What happened, for the summary and the plot (wall seconds, work seconds)."""

    points: list[tuple[float, float]] = field(default_factory=list)     # (wall, work)
    checkpoints: list[float] = field(default_factory=list)              # durable at (wall)
    failures: list[tuple[float, str, float, float]] = field(default_factory=list)
    # (wall, cause, work lost s, down s)
    wall_s: float = 0.0
    work_s: float = 0.0
    durable_s: float = 0.0
    paused_s: float = 0.0
    spare_waits: int = 0


def units(cause: Cause, costs: Costs) -> float:
    return {"gpu": costs.gpus, "node": costs.nodes, "job": 1.0}[cause.per]


def failure_stream(camp: Campaign, costs: Costs, seed: int) -> Iterator[tuple[float, int]]:
    """(wall time, cause index) of every interruption, in time order, forever."""
    rates = np.array([c.rate * units(c, costs) for c in camp.causes])
    total = float(rates.sum())
    p = rates / total
    rng = np.random.default_rng(seed)
    t = 0.0
    while True:
        gaps = rng.exponential(1.0 / total, 4096)
        which = rng.choice(len(p), size=4096, p=p)
        for g, w in zip(gaps, which, strict=True):
            t += float(g)
            yield t, int(w)


def recovery_s(camp: Campaign, cause: Cause, costs: Costs, spare: bool | None) -> float:
    """Seconds from the interruption until training runs again (spare: None when no
    node is replaced)."""
    detect = camp.detect_hang_s if cause.detect == "hang" else camp.detect_crash_s
    swap = 0.0 if spare is None else (camp.swap_s if spare else camp.replace_s)
    return detect + swap + camp.relaunch_s + camp.nccl_init_s + costs.load_s


def simulate_campaign(camp: Campaign, costs: Costs, *, days: float | None = None,
                      target_work_s: float | None = None, seed: int = 0,
                      interval_s: float | None = None,
                      progress: Callable[[float], None] | None = None,
                      keep_points: bool = True) -> Timeline:
    """Run until ``days`` of wall clock or ``target_work_s`` of work, whichever first."""
    interval = camp.interval_s if interval_s is None else interval_s
    t_end = math.inf if days is None else days * DAY
    target = math.inf if target_work_s is None else target_work_s
    tl = Timeline()
    fails = failure_stream(camp, costs, seed)
    tf, ci = next(fails)
    t = work = durable = 0.0
    pending: tuple[float, float] | None = None      # (durable at wall, work snapshot)
    next_ck = interval
    spares_back: list[float] = []                    # when busy spares return
    next_day = DAY
    pt = tl.points.append if keep_points else (lambda _x: None)
    pt((0.0, 0.0))
    while True:
        t_ck = t + (next_ck - work)
        t_pend = pending[0] if pending else math.inf
        t_stop = min(t_end, t + (target - work))
        tn = min(t_ck, t_pend, tf, t_stop)
        work += tn - t
        t = tn
        if progress is not None and t >= next_day:
            progress(t / DAY)
            next_day = (math.floor(t / DAY) + 1) * DAY
        if t >= t_stop:
            break
        if t == tf:
            cause = camp.causes[ci]
            t, work, durable, tf, ci = _interrupt(camp, costs, tl, cause, t, work, durable,
                                                  fails, spares_back, pt)
            pending = None
            next_ck = work + interval
            if t >= t_end:
                t = t_end
                break
        elif t == t_pend:
            durable = pending[1]
            pending = None
            tl.checkpoints.append(t)
        else:   # a checkpoint is due
            if pending:     # the previous write still runs: wait for it, training on
                next_ck = work + (t_pend - t)
                continue
            pause = costs.pause_s
            if tf < t + pause:      # interrupted while paused: this checkpoint is lost
                tl.paused_s += tf - t
                t = tf
                continue
            t += pause
            tl.paused_s += pause
            pt((t, work))
            if camp.mode == "sync":
                durable = work
                tl.checkpoints.append(t)
            else:
                pending = (t + costs.lag_s, work)
            next_ck = work + interval
    tl.wall_s, tl.work_s, tl.durable_s = t, work, durable
    pt((t, work))
    return tl


def _interrupt(camp, costs, tl, cause, t, work, durable, fails, spares_back, pt):
    """One interruption at ``t`` and the recovery after it (and any interruption during
    recovery): the new (t, work, durable, next failure time, its cause)."""
    pt((t, work))
    if cause.slow_s > 0:        # a straggler: the job runs slower for a while, no restart
        down, lost = cause.slow_s, 0.0
    elif cause.planned:         # stopped after a checkpoint: nothing lost
        down = costs.write_s + recovery_s(camp, cause, costs, None)
        durable = work
        lost = 0.0
    elif camp.domain == "replica" and cause.scope == "node" and costs.dp > 1:
        spare = _take_spare(camp, t, spares_back, tl) if cause.per != "job" else None
        detect = camp.detect_hang_s if cause.detect == "hang" else camp.detect_crash_s
        rest = recovery_s(camp, cause, costs, spare) - detect - costs.load_s \
            + costs.peer_load_s
        down = detect + rest / costs.dp
        lost = 0.0
    else:
        spare = _take_spare(camp, t, spares_back, tl) if cause.per != "job" else None
        down = recovery_s(camp, cause, costs, spare)
        lost = work - durable
        work = durable
    tl.failures.append((t, cause.name, lost, down))
    resume = t + down
    tf, ci = next(fails)
    while tf < resume:          # interrupted again while recovering: recover again
        c2 = camp.causes[ci]
        if c2.slow_s > 0:       # a straggler while the job is down costs nothing
            tf, ci = next(fails)
            continue
        spare = _take_spare(camp, tf, spares_back, tl) if (c2.per != "job" and not
                                                           c2.planned) else None
        d2 = recovery_s(camp, c2, costs, spare)
        tl.failures.append((tf, c2.name, 0.0, d2))
        resume = max(resume, tf + d2)
        tf, ci = next(fails)
    pt((resume, work))
    return resume, work, durable, tf, ci


def _take_spare(camp: Campaign, t: float, spares_back: list[float], tl: Timeline) -> bool:
    """Whether a hot spare replaces the failed node (it returns after repair)."""
    if camp.spare_nodes <= 0:
        return False
    spares_back[:] = [b for b in spares_back if b > t]
    if len(spares_back) >= camp.spare_nodes:
        tl.spare_waits += 1
        return False
    spares_back.append(t + camp.repair_s)
    return True
