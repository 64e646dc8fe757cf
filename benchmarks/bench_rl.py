"""Wall time, CPU time and peak memory of RL steps (issue 24), and the weight sync against
published measurements.

    python benchmarks/bench_rl.py                       # 8 steps of grpo-qwen3-30b-a3b
    python benchmarks/bench_rl.py --scenario grpo-qwen3-30b-a3b-async --steps 8
    python benchmarks/bench_rl.py --repeat 1 --no-compare
    python benchmarks/bench_rl.py --write-docs                # docs/results/rl.md

Each repetition runs ``moesim rl``'s simulation in a fresh child process (the engines'
memo tables and the rollout step-cost cache start empty) and reports its wall time, CPU
time (user + sys) and peak resident set (``ru_maxrss``, MB = 10^6 bytes); the table
gives the median over ``--repeat`` children (goal: 8 steps of the Qwen3-30B-A3B scenario
in <= 60 s on 2 cores).

Then (unless ``--no-compare``) the weight sync is set against published measurements
that come with their configuration, printing the error (nothing is fitted to them):

- verl's checkpoint-engine benchmark (verl/checkpoint_engine/README.md): Qwen3-30B-A3B,
  trainer FSDP on 2 GPUs, 30 rollout workers receiving the weights, 4 x 8 H100 with
  ConnectX-7 400 Gb/s InfiniBand, NCCL backend: ~7 s;
- verl's fully-async recipe (verl/experimental/fully_async_policy/README.md,
  "checkpoint-engine Ablation Experiment", H20 machines, Megatron trainer):
  Qwen3-30B-A3B 16 trainer ranks -> 16 rollout ranks: 15.76 s per-tensor sync, 4.38 s with
  the checkpoint engine. H20 is not in moesim's device catalog; the sync is bound by the
  network and the software, not by the GPU's compute, so the H100 cluster stands in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
name, overrides, steps = json.loads(sys.argv[1])
t, c = time.perf_counter(), time.process_time()
setup = resolve_rl(name, overrides)
s = summarize(simulate_rl(setup, steps))
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "maxrss_MB": ru.ru_maxrss / 1e3, "step_time_s": s["step_time_s"],
                  "phases_s": s["phases_s"]}))
"""

#: NeMo RL's DeepSeek-V3 refit benchmark as grpo-deepseek-v3 overrides: 36 DGX H100
#: nodes, Megatron TP1 PP16 EP16 on 32 of them, one vLLM TP32 engine on the other 4
NEMO_REFIT = ["cluster.topology=dgx-h100", "cluster.device=H100", "cluster.nodes=36",
              "rl.rollout.gpus=32", "rl.rollout.tp=32", "rl.rollout.ep=1",
              "rl.train.gpus=256", "rl.train.tp=1", "rl.train.pp=16", "rl.train.ep=16"]
NEMO_REFIT_SOURCE = ("NVIDIA-NeMo/RL docs/guides/checkpoint-engine-refit.md (aa8bfb2e8), "
                     "DeepSeek-V3 benchmark, dedicated async refit timer, NCCL: 14.21 s")

#: (label, scenario, overrides, published seconds, source)
SYNC_CASES = [
    ("verl checkpoint_engine NCCL, 2 -> 30 GPUs (H100, CX-7)", "grpo-qwen3-30b-a3b-async",
     ["rl.rollout.gpus=30", "rl.rollout.tp=1", "rl.rollout.ep=1", "rl.train.gpus=2",
      "rl.train.ep=2", "rl.train.mini_batches=1"], 7.0,
     "verl/checkpoint_engine/README.md, benchmark result: ~7 s"),
    ("verl fully-async 16 -> 16, per-tensor sync (H20)", "grpo-qwen3-30b-a3b-async", [], 15.76,
     "verl/experimental/fully_async_policy/README.md: 15.76 s"),
    ("verl fully-async 16 -> 16, checkpoint engine (H20)", "grpo-qwen3-30b-a3b-async", [],
     4.38, "verl/experimental/fully_async_policy/README.md: 4.38 s"),
    ("NeMo RL DeepSeek-V3 refit over NCCL, 256 trainer GPUs (TP1 PP16 EP16) -> vLLM TP32 "
     "on 4 nodes (H100), moesim's gather + chain", "grpo-deepseek-v3", NEMO_REFIT, 14.21,
     NEMO_REFIT_SOURCE),
    ("same, sharded (each vLLM rank pulls its own shard, as NeMo's checkpoint engine)",
     "grpo-deepseek-v3", [*NEMO_REFIT, "rl.weight_sync.method=sharded"], 14.21,
     NEMO_REFIT_SOURCE),
]


def run_child(name: str, overrides: list[str], steps: int, timeout: float) -> dict:
    """One child in an empty step-cost cache (moesim.traffic.surface): it builds the
    rollout surface itself, as a first run does."""
    arg = json.dumps([name, overrides, steps])
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True,
                             text=True, timeout=timeout, check=True,
                             env={**os.environ, "MOESIM_CACHE": cache})
    return json.loads(out.stdout.strip().splitlines()[-1])


def sync_comparison() -> list[dict]:
    """The simulated weight sync of each published case (no RL step is simulated)."""
    from moesim.rl.run import resolve_rl
    from moesim.rl.sync import weight_sync

    rows = []
    for label, name, overrides, published, source in SYNC_CASES:
        setup = resolve_rl(name, overrides)
        cfg, res = setup.cfg, setup.res
        gpus = list(res.topology.gpus)
        roll = gpus[:cfg.rollout.gpus]
        train = gpus[cfg.rollout.gpus:cfg.rollout.gpus + cfg.train.gpus]
        r = weight_sync(res.topology, res.model, train, roll, tp=cfg.train.tp,
                        pp=cfg.train.pp, ep=cfg.train.ep,
                        replica_gpus=cfg.rollout.replica_gpus,
                        per_tensor_s=cfg.weight_sync.per_tensor_s, ipc=False,
                        hbm_Bps=res.device.hbm_Bps,
                        sharded=cfg.weight_sync.method == "sharded")
        rows.append({"case": label, "published_s": published, "simulated_s": r.time_s,
                     "flow_s": r.flow_s, "software_s": r.software_s,
                     "error": r.time_s / published - 1, "source": source})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="grpo-qwen3-30b-a3b")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--no-compare", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = [run_child(a.scenario, a.overrides, a.steps, a.timeout) for _ in range(a.repeat)]
    med = {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "cpu_s", "maxrss_MB")}
    sync = [] if a.no_compare else sync_comparison()
    if a.json:
        print(json.dumps({"scenario": a.scenario, "steps": a.steps, "repeat": a.repeat,
                          "median": med, "runs": rows, "sync": sync}, indent=1))
        return 0
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{a.scenario}: {a.steps} RL steps, median of {a.repeat} children")
    print(f"  wall {med['wall_s']:.1f} s, CPU {med['cpu_s']:.1f} s, peak RSS "
          f"{med['maxrss_MB']:.0f} MB (goal: wall <= 60 s on 2 cores)")
    print("  each child: " + "; ".join(f"wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s"
                                       for r in rows))
    ph = rows[0]["phases_s"]
    print(f"  simulated step {rows[0]['step_time_s']:.1f} s: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items() if v > 0))
    for r in sync:
        print(f"  weight sync, {r['case']}: simulated {r['simulated_s']:.2f} s (flows "
              f"{r['flow_s']:.2f} s + software {r['software_s']:.2f} s), published "
              f"{r['published_s']:.2f} s: error {r['error'] * 100:+.0f} %  [{r['source']}]")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "rl", "RL steps: simulation cost and weight sync "
                                       "(bench_rl.py)"))
