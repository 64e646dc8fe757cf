"""The RL timeline as a Chrome/Perfetto trace: one process per pool, one thread per phase,
and counter tracks on the rollout pool of its running batch (sequences, all replicas)
and KV use (mean over replicas of the fullest rank's KV fraction, moesim.traffic's series).
Open it in https://ui.perfetto.dev."""

from __future__ import annotations

import json
from pathlib import Path

from moesim.rl.algorithms import algorithm

PIDS = {"rollout": 1, "train": 2}


def pool_counters(run) -> list[tuple[float, int, float]]:
    """(t_s, running sequences, KV fraction) of the rollout pool at every change (KV:
    the mean over replicas of each replica's fullest rank)."""
    reps = run.setup.cfg.rollout.replicas
    events = []
    for s, w in enumerate(run.works):
        t0 = run.timeline.gen_start_s[s]
        for r, ser in enumerate(w.generation.series):
            events += [(t0 + t, r, b, kv) for t, b, kv in ser]
    events.sort(key=lambda e: (e[0], e[1]))
    cur_b = [0] * reps
    cur_kv = [0.0] * reps
    out: list[tuple[float, int, float]] = []
    for t, r, b, kv in events:
        cur_b[r], cur_kv[r] = b, kv
        row = (t, sum(cur_b), sum(cur_kv) / reps)
        if out and out[-1][0] == t:
            out[-1] = row
        elif not out or out[-1][1:] != row[1:]:
            out.append(row)
    return out


def trace_events(run) -> list[dict]:
    cfg = run.setup.cfg
    phases = algorithm(cfg.algorithm).report
    names = ({"rollout": f"pool ({cfg.rollout.gpus} GPUs, colocated)",
              "train": f"pool ({cfg.train.gpus} GPUs, colocated): training"}
             if cfg.colocated else
             {"rollout": f"rollout pool ({cfg.rollout.gpus} GPUs, "
                         f"{cfg.rollout.replicas} engine replicas)",
              "train": f"train pool ({cfg.train.gpus} GPUs)"})
    ev: list[dict] = []
    for pool, pid in PIDS.items():
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": names[pool]}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                   "args": {"sort_index": pid}})
        for tid, phase in enumerate(phases, 1):
            ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": phase}})
    tids = {p: i for i, p in enumerate(phases, 1)}
    for sp in run.timeline.spans:
        args = {"step": sp.step}
        if sp.version is not None:
            args["policy_version"] = sp.version
        ev.append({"ph": "X", "name": f"{sp.phase} {sp.step}", "cat": sp.phase,
                   "pid": PIDS[sp.pool], "tid": tids[sp.phase], "ts": sp.start_s * 1e6,
                   "dur": (sp.end_s - sp.start_s) * 1e6, "args": args})
    for t, batch, kv in pool_counters(run):
        ev.append({"ph": "C", "name": "rollout batch", "pid": 1, "ts": t * 1e6,
                   "args": {"sequences": batch}})
        ev.append({"ph": "C", "name": "KV use", "pid": 1, "ts": t * 1e6,
                   "args": {"fraction": round(kv, 6)}})
    return ev


def write_trace(run, path: Path) -> None:
    doc = {"traceEvents": trace_events(run), "displayTimeUnit": "ms"}
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
