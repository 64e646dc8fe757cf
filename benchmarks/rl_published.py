"""GRPO step times against NeMo RL's published ones, with their full configurations
(issue 24): the error printed, the simulated phases beside it.

    python benchmarks/rl_published.py                  # prints the comparison (minutes of CPU)
    python benchmarks/rl_published.py --steps 6        # RL steps simulated (default 4)
    python benchmarks/rl_published.py --write-docs     # docs/results/rl-published.md

Published: NeMo RL v0.6, docs/about/performance-summary.md at github.com/NVIDIA-NeMo/RL
commit 69c7ca117 ("Perf page update for v0.6"), table "H100 BF16 Benchmarks", the two
Qwen3-30B-A3B rows on 32 GPUs (DGX-H100, Megatron-Core training, vLLM generation, BF16;
each figure the average of 5 steps):

- On policy: G-average sequence length 3,203, 1,102 tokens/s/GPU, total step time 192 s;
  recipe ``examples/configs/recipes/llm/performance/grpo-qwen3-30ba3b-4n8g.yaml``,
  scenario ``scenarios/grpo-qwen3-30b-a3b-nemo-rl.yaml``;
- 1-step off: G-average 3,201, 1,414 tokens/s/GPU, 152 s; recipe
  ``grpo-qwen3-30ba3b-4n8g-async-1off.yaml``, scenario
  ``scenarios/grpo-qwen3-30b-a3b-nemo-rl-async.yaml``.

- GB200 on policy (table "GB200 BF16 Benchmarks", GB200-NVL72): G-average 3,199, 1,910
  tokens/s/GPU, 221 s on 16 GPUs; recipe ``grpo-qwen3-30ba3b-4n4g.yaml`` (EP16, vLLM TP1,
  log-prob rows of 8,192 tokens), scenario ``scenarios/grpo-qwen3-30b-a3b-nemo-rl-gb200.yaml``.
  moesim's kernel catalog has no Blackwell table, so every kernel of that run is priced by
  the roofline (the page prints the model that priced each device).
- Qwen3-235B-A22B on policy (H100 table): G-average 5,698, 58.9 tokens/s/GPU, 395 s on 128
  GPUs; recipe ``grpo-qwen3-235b-16n8g.yaml`` (16 prompts x 32, max 8,192 tokens, vLLM
  TP16 engines of 2 nodes, trainer TP2 SP CP2 PP8 EP16 with 11 layers on each end stage
  and full recompute), scenario ``scenarios/grpo-qwen3-235b-nemo-rl.yaml``.
- DeepSeek-V3 one step off (H100 table): G-average 710, 12.8 tokens/s/GPU, 64.1 s on 512
  GPUs (256 train, 256 generate); recipe ``grpo-deepseek-v3-64n8g-async-1off.yaml``,
  scenario ``scenarios/grpo-deepseek-v3-nemo-rl-async.yaml`` (NeMo RL's non-colocated
  refit chunk by chunk, ``rl.weight_sync.calls: nemo-async``).
- Qwen3-235B-A22B one step off (H100 table): G-average 5,721, 58.7 tokens/s/GPU, 231 s on
  256 GPUs (128 train with TP4 SP PP8 EP16, 128 generate as 16 vLLM engines of TP8);
  recipe ``grpo-qwen3-235b-32n8g-async-1off.yaml``, scenario
  ``scenarios/grpo-qwen3-235b-nemo-rl-async.yaml`` (the same chunked refit).
- Qwen3-30B-A3B eight steps off (H100 table): G-average 3,206, 1,025 tokens/s/GPU, 34.5 s on
  192 GPUs (128 train, 64 generate as 32 vLLM engines of TP2); recipe
  ``grpo-qwen3-30ba3b-24n8g-async-8off.yaml``, scenario
  ``scenarios/grpo-qwen3-30b-a3b-nemo-rl-async-8off.yaml`` (generation streamed as NeMo
  RL's asynchronous trajectory collector runs it, ``rl.generation: stream``, paused by
  its in-flight weight updates, ``rl.partial_rollouts``; 40 steps).
- DeepSeek-V3 one step off in FP8 (table "H100 FP8 Benchmarks": generation and training
  in FP8): G-average 721, 14.1 tokens/s/GPU, 59.2 s on 512 GPUs (256 train, 256 generate
  as 16 vLLM engines of TP16); recipe ``grpo-deepseek-v3-64n8g-fp8-async-1off.yaml``,
  scenario ``scenarios/grpo-deepseek-v3-nemo-rl-async-fp8.yaml`` (``rl.rollout.precision:
  fp8``, the engines casting the bf16 weights of every refit). The page compares it with
  the BF16 row.
- The same two recipes on twice the GPUs (``SCALED``): Qwen3-235B-A22B on 256 GPUs, 312 s
  (37.4, 5,713); DeepSeek-V3 on 512 GPUs, 111 s (7.24, 697). The page prints how the step
  changes from the smaller run, simulated and published.
- DeepSeek-V3 on policy (H100 table): G-average 701, 12.1 tokens/s/GPU, 134 s on 256
  GPUs; recipe ``grpo-deepseek-v3-32n8g.yaml`` (32 prompts x 16, max 1,536 tokens, vLLM
  TP32 engines of 4 nodes, trainer PP16 EP16 with 3 and 2 layers on the end stages and
  full recompute), scenario ``scenarios/grpo-deepseek-v3-nemo-rl.yaml``.

The scenarios' comments map every recipe field to moesim's; the prompt length and the
response-length law are not published (the law's mean is set so that the mean sample has
the published G-average length, an input of the run). Every scenario prices vLLM
0.17.1's CPU time per engine step: the Qwen3-30B-A3B H100 on-policy run's synchronous
``LLM`` in-process (``rl.rollout.host_overhead: vllm-inproc``); the 1-step-off run's, and
the Qwen3-235B and DeepSeek-V3 runs' ``AsyncLLM`` with its engine core in a process of its
own (``vllm``), each with V1's fixed time per step (``step_fixed: vllm-v1``), upper bounds
for 0.17.1 (docs/rl.md); the GB200 run's one-GPU engines with vLLM's asynchronous
scheduling (``vllm-async``), as 0.17.1 defaults for them. Nothing is fitted to the
step times: they are only printed beside the simulated ones. The last row prices the
on-policy run's decode steps eagerly (``rl.rollout.cuda_graphs: false``, vLLM's
``enforce_eager: True``): what the kernels' host launches cost a generation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (scenario, published row, published step time s, published tokens/s/GPU,
#:  published G-average sequence length)
ROWS = (
    ("grpo-qwen3-30b-a3b-nemo-rl", "On policy, colocated", 192.0, 1102.0, 3203),
    ("grpo-qwen3-30b-a3b-nemo-rl-async", "1-step off, 16 + 16 GPUs", 152.0, 1414.0, 3201),
    ("grpo-qwen3-30b-a3b-nemo-rl-gb200", "GB200: on policy, colocated, 16 GPUs", 221.0,
     1910.0, 3199),
    ("grpo-qwen3-235b-nemo-rl", "Qwen3-235B-A22B: on policy, colocated, 128 GPUs", 395.0,
     58.9, 5698),
    ("grpo-deepseek-v3-nemo-rl", "DeepSeek-V3: on policy, colocated, 256 GPUs", 134.0,
     12.1, 701),
    ("grpo-deepseek-v3-nemo-rl-async", "DeepSeek-V3: 1-step off, 256 + 256 GPUs", 64.1,
     12.8, 710),
    ("grpo-qwen3-235b-nemo-rl-async", "Qwen3-235B-A22B: 1-step off, 128 + 128 GPUs", 231.0,
     58.7, 5721),
    ("grpo-qwen3-30b-a3b-nemo-rl-async-8off", "8-step off, 64 + 128 GPUs (streamed)", 34.5,
     1025.0, 3206),
    ("grpo-deepseek-v3-nemo-rl-async-fp8", "DeepSeek-V3: 1-step off, FP8, 256 + 256 GPUs",
     59.2, 14.1, 721),
)
#: (FP8 row, BF16 row) of ROWS: the same run in both precisions
FP8_PAIR = (8, 5)
#: the same recipes on twice the GPUs (the recipes ``grpo-qwen3-235b-32n8g.yaml`` and
#: ``grpo-deepseek-v3-64n8g.yaml`` at v0.6.0 take the 16- and 32-node ones and set
#: ``cluster.num_nodes``; DeepSeek-V3's also ``expert_model_parallel_size: 32``, where
#: the published table prints EP16): (scenario, row, --set overrides, published step s,
#: tokens/s/GPU, G-average sequence length, the ROWS index of the smaller run)
SCALED = (
    ("grpo-qwen3-235b-nemo-rl", "Qwen3-235B-A22B: on policy, colocated, 256 GPUs",
     ["cluster.nodes=32", "rl.rollout.gpus=256", "rl.train.gpus=256"], 312.0, 37.4, 5713, 3),
    ("grpo-deepseek-v3-nemo-rl", "DeepSeek-V3: on policy, colocated, 512 GPUs",
     ["cluster.nodes=64", "rl.rollout.gpus=512", "rl.train.gpus=512", "parallel.ep=32"],
     111.0, 7.24, 697, 4),
)
PHASES = ("generate", "logprob_prep", "old_logprob", "reference", "reward", "train_prep",
          "loss_logprob", "train", "weight_sync", "switch")


def pricing_models() -> list[tuple[str, str]]:
    """(device, the compute model a ``kind: catalog`` section gets there) per device of
    the rows: the catalog where it has tables for the device, else the roofline."""
    from moesim.compute.select import compute_model
    from moesim.wiring import resolve_path

    out = {}
    for name, *_ in ROWS:
        dev = resolve_path(ROOT / "scenarios" / f"{name}.yaml").compute.device
        if dev.name not in out:
            out[dev.name] = compute_model({"kind": "catalog"}, "rl_published", dev).name
    return list(out.items())


def _own_steps(name: str) -> tuple[int, int]:
    """(``rl.steps``, ``rl.max_lag``) as the scenario writes them: a row whose own steps
    exceed ``--steps`` (a steady state needs 2 x max_lag + 1) runs its own."""
    from moesim.rl.run import resolve_rl
    cfg = resolve_rl(name).cfg
    return cfg.steps, cfg.max_lag


def _run(name: str, overrides: list[str], steps: int) -> dict:
    """The run's summary with its weight sync's details."""
    from moesim.rl.run import resolve_rl, simulate_rl
    from moesim.rl.summary import details, summarize
    run = simulate_rl(resolve_rl(name, overrides), steps)
    return {**summarize(run), "weight_sync": details(run)["weight_sync"]}


#: the FP8 run on the BF16 run's engines (8 of TP32, vLLM's default max_num_seqs)
FP8_ON_BF16_ENGINES = ["rl.rollout.tp=32", "rl.rollout.ep=32", "rl.rollout.max_batch=1024"]


def fp8_pair(fp8: dict, bf16: dict, published: tuple[float, float], same: dict) -> str:
    """How the FP8 run's step, generation and refit compare with the BF16 one's
    (``same``: the FP8 run on the BF16 run's engines)."""
    cast = fp8["weight_sync"]["phases"]["fp8_cast"]
    f, b = fp8["phases_s"], bf16["phases_s"]
    return (f"FP8 against BF16 (DeepSeek-V3, one step off): the step x"
            f"{fp8['step_time_s'] / bf16['step_time_s']:.2f} simulated, "
            f"x{published[0] / published[1]:.2f} published; generation {b['generate']:.1f} -> "
            f"{f['generate']:.1f} s (FP8 weights and GEMMs on the 8 engines of TP32: "
            f"{same['phases_s']['generate']:.1f} s; then 16 engines of TP16); weight sync "
            f"{b['weight_sync']:.1f} -> {f['weight_sync']:.1f} s, the engines casting {cast['tensors']:,} tensors ({cast['elements'] / 1e9:.0f} G "
            f"elements) to FP8 in {cast['time_s']:.1f} s at each refit (host "
            f"{cast['host_s']:.1f} s, GPU {cast['gpu_s']:.1f} s).")


def _rate(x: float) -> str:
    """tokens/s/GPU as the published table writes it: one decimal below 100."""
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def _mean_len(s: dict) -> float:
    rows = s["steps"]
    samples = sum(r["samples"] for r in rows)
    return sum(r["prompt_tokens"] + r["response_tokens"] for r in rows) / samples


def _row(label: str, name: str, sets: list[str], step_pub: float, tok_pub: float,
         len_pub: int, steps: int) -> dict:
    """Run ``name`` with ``sets``, print its comparison row, return its summary."""
    s = _run(name, sets, steps)
    assert s["step_time_kind"] == "steady_state", s["steps_averaged"]
    err = (s["step_time_s"] / step_pub - 1) * 100
    print(f"| {label} | `{name}` | {_mean_len(s):,.0f} / {len_pub:,} tokens | "
          f"{s['step_time_s']:.1f} s | {step_pub:.0f} s | {err:+.1f} % | "
          f"{_rate(s['tokens_per_s_per_gpu'])} / {_rate(tok_pub)} |")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="RL steps simulated per run")
    a = ap.parse_args(argv)
    t0 = time.process_time()
    if not 3 <= a.steps <= 100:     # max_lag 1: a steady state needs 3 steps or more
        ap.error("--steps: an integer from 3 to 100 (the 1-step-off run's first and last "
                 "steps fill and drain its pipeline)")
    own = {name: _own_steps(name) for name, *_ in ROWS}
    longer = "".join(f"; the {lag}-step-off run {n} steps, its first and last {lag} left out"
                     for n, lag in own.values() if n > a.steps)
    print(f"NeMo RL v0.6 (H100 BF16, H100 FP8 and GB200 BF16 tables) against moesim, "
          f"{a.steps} simulated steps per run (step: the steady-state mean, the 1-step-off "
          f"run's first and last steps left out{longer}); s = seconds")
    print()
    print("| run | scenario | mean sample (simulated / published) | step simulated | "
          "step published | error | tokens/s/GPU simulated / published |")
    print("|---|---|---|---|---|---|---|")
    out = []
    for name, row, step_pub, tok_pub, len_pub in ROWS:
        steps = max(a.steps, own[name][0])
        out.append((name, row, _row(row, name, [], step_pub, tok_pub, len_pub, steps)))
    scaled = []
    for name, row, sets, step_pub, tok_pub, len_pub, small in SCALED:
        s = _row(f"{row} (`--set {' '.join(sets)}`)", name, sets, step_pub, tok_pub, len_pub,
                 a.steps)
        out.append((name, row, s))
        scaled.append((row, s["step_time_s"] / out[small][2]["step_time_s"],
                       step_pub / ROWS[small][2]))
    name, row, step_pub, tok_pub, len_pub = ROWS[0]
    eager = _row(f"{row}, decode eager (`rl.rollout.cuda_graphs=false`)", name,
                 ["rl.rollout.cuda_graphs=false"], step_pub, tok_pub, len_pub, a.steps)
    print()
    print("Simulated phases per step (mean wall time, s; NeMo RL publishes no breakdown):")
    print()
    print("| run | " + " | ".join(PHASES) + " | long tail (90 % -> last) |")
    print("|---|" + "---|" * (len(PHASES) + 1))
    for _name, row, s in [*out, (ROWS[0][0], ROWS[0][1] + ", decode eager", eager)]:
        ph = s["phases_s"]
        print(f"| {row} | " + " | ".join(f"{ph.get(p, 0.0):.2f}" for p in PHASES)
              + f" | {s['long_tail_s']:.2f} |")
    print()
    f8, b16 = FP8_PAIR
    same = _run(ROWS[f8][0], FP8_ON_BF16_ENGINES, max(a.steps, own[ROWS[f8][0]][0]))
    print(fp8_pair(out[f8][2], out[b16][2], (ROWS[f8][2], ROWS[b16][2]), same))
    print()
    print("Twice the GPUs, the step against the smaller run's (simulated / published): "
          + "; ".join(f"{row}: x{sim:.2f} / x{pub:.2f}" for row, sim, pub in scaled))
    print()
    print("What priced the kernels, per device (the scenarios' compute: section): "
          + "; ".join(f"{d}: {m}" for d, m in pricing_models()))
    print()
    print(f"CPU for this page: {time.process_time() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "rl-published", "RL step times against NeMo RL's published runs"))
