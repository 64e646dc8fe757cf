"""The RL run's summary (``summary.json``, ``moesim rl --json``) and its text form.

Keys (docs/rl.md): ``step_time_s`` (mean over the steady-state steps: all but the first
and the last ``max_lag``, which fill and drain the pipeline; with ``2 * max_lag`` steps or
fewer there is no steady state and it is the mean over every step), ``step_time_kind``
(``steady_state`` or ``fill_and_drain``), ``steps_averaged`` (the first and last step of
that mean), ``phases_s`` (mean wall
time of each phase per step), ``samples_per_s``, ``tokens_per_s_per_gpu`` (prompt +
response tokens trained per second per GPU of both pools, each token counted once
whatever the epochs), ``utilization`` (busy fraction of
each pool over the run), ``staleness`` (samples per lag in versions), ``long_tail_s``
(mean over steps: 90 % of samples done to the last), ``steps`` (one row per step).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from moesim.memory.fit import fit_line, fit_summary
from moesim.rl.algorithms import algorithm
from moesim.scenario.sections.rl import summary_dict

KEYS = ("step_time_s", "step_time_kind", "steps_averaged", "phases_s", "samples_per_s",
        "tokens_per_s_per_gpu", "utilization", "staleness", "long_tail_s", "steps", "fit",
        "oom")


def _busy(spans, pool: str, phases=None) -> float:
    return sum(sp.end_s - sp.start_s for sp in spans
               if sp.pool == pool and (phases is None or sp.phase in phases))


#: ``step_time_kind``: the mean is over the steady state (the first and last ``max_lag``
#: steps left out) or, with too few steps for one, over every step (fill and drain)
STEADY, FILL_AND_DRAIN = "steady_state", "fill_and_drain"


def step_window(n: int, max_lag: int) -> tuple[str, int, int]:
    """(kind, first, last step averaged): the steady state, steps ``max_lag`` ..
    ``n - 1 - max_lag``, when there is one (``n > 2 * max_lag``: the first ``max_lag``
    steps fill the pipeline, the last ``max_lag`` drain it); else every step."""
    if n > 2 * max_lag:
        return STEADY, max_lag, n - 1 - max_lag
    return FILL_AND_DRAIN, 0, n - 1


def steps_for_steady_state(max_lag: int) -> int:
    """The fewest steps with a steady state: ``2 * max_lag + 1``."""
    return 2 * max_lag + 1


def step_label(summary: dict, max_lag: int) -> str:
    """How the text summary names ``step_time_s``."""
    first, last = summary["steps_averaged"]
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    if summary["step_time_kind"] == STEADY:
        return f"steady state, mean of {span}"
    return (f"fill and drain, mean of {span}: with max_lag {max_lag}, "
            f"--steps {steps_for_steady_state(max_lag)} or more leave steps between the "
            "fill and the drain")


def summarize(run) -> dict:
    cfg = run.setup.cfg
    tl = run.timeline
    n = len(run.works)
    ends = tl.step_end_s
    times = [ends[0]] + [ends[i] - ends[i - 1] for i in range(1, n)]
    kind, first, last = step_window(n, cfg.max_lag)
    step = float(np.mean(times[first:last + 1]))
    algo = algorithm(cfg.algorithm)
    phases = {p: 0.0 for p in algo.report}
    for w in run.works:
        d = w.durations
        for p in algo.report:
            phases[p] += d.of(p)
    phases = {p: v / n for p, v in phases.items()}
    span = tl.makespan_s or 1.0
    if cfg.colocated:
        util = {"rollout": _busy(tl.spans, "rollout", ("generate",)) / span,
                "train": _busy(tl.spans, "train", algo.trainer_phases) / span}
    else:
        util = {"rollout": _busy(tl.spans, "rollout") / span,
                "train": _busy(tl.spans, "train") / span}
    lags = Counter()
    for s, lag in enumerate(tl.lags()):
        if tl.first_version is not None:     # partial rollouts: each sample's oldest
            lags.update((s - tl.first_version[s]).tolist())
        else:
            lags[lag] += len(run.batches[s].response)
    tokens = np.mean([b.tokens for b in run.batches])
    rows = []
    for s, w in enumerate(run.works):
        d, b = w.durations, run.batches[s]
        rows.append({
            "step": s, "end_s": ends[s], "time_s": times[s],
            "generate_start_s": tl.gen_start_s[s], "policy_version": tl.gen_version[s],
            "lag": s - tl.gen_version[s], "samples": int(len(b.response)),
            "prompt_tokens": int(b.prompt.sum()), "response_tokens": int(b.response.sum()),
            "rows": w.rows, "mini_batch_rows": w.mini_batch_rows,
            **({} if tl.first_version is None else {
                "last_version": int(tl.last_version[s].max()),
                "two_version_samples": int((tl.first_version[s]
                                            != tl.last_version[s]).sum())}),
            "long_tail_s": w.generation.long_tail_s,
            "phases_s": {p: d.of(p) for p in algo.report},
        })
    return {
        "step_time_s": step,
        "step_time_kind": kind,
        "steps_averaged": [first, last],
        "phases_s": phases,
        "samples_per_s": cfg.samples_per_step / step if step > 0 else 0.0,
        "tokens_per_s_per_gpu": float(tokens / step / cfg.total_gpus) if step > 0 else 0.0,
        "utilization": util,
        "staleness": {str(k): int(v) for k, v in sorted(lags.items())},
        "long_tail_s": float(np.mean([w.generation.long_tail_s for w in run.works])),
        "steps": rows,
        "fit": fit_summary(run.fits),
        "oom": any(f.oom for f in run.fits),
    }


def details(run) -> dict:
    """What the summary leaves out: the configuration, pools, sync and KV figures."""
    s = run.sync
    setup = run.setup
    return {
        "scenario": setup.scenario.name, "seed": setup.scenario.seed,
        "rl": summary_dict(setup.cfg), "trainer_seq_len": setup.seq_len,
        "gpus": {"rollout": setup.cfg.rollout.gpus, "train": setup.cfg.train.gpus,
                 "total": setup.cfg.total_gpus},
        "engine_replicas": setup.cfg.rollout.replicas,
        "kv_tokens_per_rank": run.kv_tokens,
        "weight_sync": {k: v for k, v in dataclasses.asdict(s).items()
                        if k != "phases" or v is not None},
        "switch_s": {"into_training": run.switch_s[0], "out_of_training": run.switch_s[1]},
        **({} if getattr(run, "moves", None) is None else {"host_moves": run.moves.as_dict()}),
    }


def text_summary(summary: dict, det: dict) -> str:
    ph = summary["phases_s"]
    cfg = det["rl"]
    mode = "colocated" if cfg["colocated"] else f"disaggregated, max_lag {cfg['max_lag']}"
    if cfg.get("generation") == "stream":
        mode += ", generation streamed"
    if cfg.get("partial_rollouts"):
        mode += (", partial rollouts, KV kept across syncs"
                 if cfg.get("kv_after_sync") == "keep" else ", partial rollouts")
    ws = det["weight_sync"]
    lines = [
        f"{det['scenario']}: GRPO on {det['gpus']['total']} GPUs ({mode}; rollout "
        f"{det['gpus']['rollout']} GPUs = {det['engine_replicas']} engine replicas, train "
        f"{det['gpus']['train']} GPUs), {len(summary['steps'])} steps",
        f"  step {summary['step_time_s']:.2f} s ({step_label(summary, cfg['max_lag'])}), "
        f"{summary['samples_per_s']:.1f} samples/s, "
        f"{summary['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU",
        "  phases per step: " + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items() if v > 0),
        f"  utilization: rollout {summary['utilization']['rollout'] * 100:.0f} %, train "
        f"{summary['utilization']['train'] * 100:.0f} %; long tail (90 % -> last sample) "
        f"{summary['long_tail_s']:.2f} s; staleness "
        + ", ".join(f"lag {k}: {v}" for k, v in summary["staleness"].items()),
        f"  weight sync {ws['time_s']:.2f} s = flows {ws['flow_s']:.2f} s + copy "
        f"{ws['copy_s']:.2f} s + {ws['tensors']:,} tensors x software "
        f"{ws['software_s']:.2f} s; {ws['param_bytes'] / 1e9:.2f} GB into each replica",
        *refit_line(ws),
        *moves_line(det.get("host_moves")),
        fit_line(summary.get("fit", {})),
    ]
    return "\n".join(lines)


def moves_line(m: dict | None) -> list[str]:
    """The colocated host moves (``rl.train.offload: nemo`` or ``verl``), else nothing."""
    if not m:
        return []
    if m.get("framework") == "verl":
        return [f"  host moves per GPU (verl's parameter offloads): "
                f"{m['bytes_per_step'] / 1e9:.1f} GB a step (weights "
                f"{m['weights_bytes'] / 1e9:.2f} GB, out into pageable memory at "
                f"{m['pageable_Bps'] / 1e9:.1f} GB/s): rollout {m['refit_s']:.2f} s, "
                f"log-prob passes {m['logprob_prep_s']:.2f} s, update "
                f"{m['train_prep_s']:.2f} s"]
    return [f"  host moves per GPU: {m['bytes_per_step'] / 1e9:.1f} GB a step (weights "
            f"{m['weights_bytes'] / 1e9:.2f} GB, optimizer states "
            f"{m['optimizer_bytes'] / 1e9:.2f} GB, engine {m['engine_bytes'] / 1e9:.2f} GB "
            f"each way): vLLM sleep {m['engine_sleep_s']:.2f} s, log-prob prep "
            f"{m['logprob_prep_s']:.2f} s, training prep {m['train_prep_s']:.2f} s, refit "
            f"{m['refit_s']:.2f} s"
            + (f" (vLLM wake_up {m['engine_wake_s']:.2f} s)" if "engine_wake_s" in m else "")]


def refit_line(ws: dict) -> list[str]:
    """The per-GPU refit's three steps (``rl.weight_sync.per_gpu``), else nothing."""
    ph = ws.get("phases")
    if not ph:
        return []
    ipc = (f"; IPC {ph['ipc_bytes_per_gpu'] / 1e9:.2f} GB per GPU in {ph['buckets']} buckets"
           if ph["buckets"] else "")
    waits = (f"; blocking ray.get waits {ph['blocking_waits']['time_s']:.3f} s"
             if "blocking_waits" in ph else "")
    a = ph.get("async_refit")      # rl.weight_sync.calls: nemo-async (rl/refit_async.py)
    chunks = (f"; {a['chunks']} chunks of {a['chunk_bytes'] / 1e9:.2f} GB overlapped: "
              f"{a['time_s']:.2f} s" if a else "")
    z = ph.get("zmq_refit")        # rl.weight_sync.calls: nemo-v06 (rl/refit_zmq.py)
    if z:
        chunks = (f"; {z['buffers']} halves of {z['half_bytes'] / 1e9:.2f} GB, the gather "
                  f"and pack against the load: {z['time_s']:.2f} s")
    c = ph.get("fp8_cast")         # rl.rollout.precision: fp8 (rl/rollout_fp8.py)
    cast = (f"; the load casts {c['tensors']:,} tensors to FP8 in {c['time_s']:.2f} s "
            f"(host {c['host_s']:.2f} s, GPU {c['gpu_s']:.2f} s)" if c else "")
    return [f"  refit per GPU: gather {ph['gather_s']:.2f} s + transfer "
            f"{ph['transfer_s']:.2f} s + load {ph['load_s']:.2f} s{ipc}; load "
            f"{ph['load_bytes_per_gpu'] / 1e9:.2f} GB per GPU{waits}{chunks}{cast}"]
