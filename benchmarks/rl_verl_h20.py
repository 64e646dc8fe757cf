"""verl's published GRPO runs on H20 against moesim: DeepSeek-V3 on 96 GPUs (rollout time,
the actor update's MFU, step time) and Qwen3-30B-A3B on 8, 16 and 32 GPUs (the actor
update's MFU); the errors printed, nothing fitted.

    python benchmarks/rl_verl_h20.py                # a few minutes of CPU
    python benchmarks/rl_verl_h20.py --write-docs   # docs/results/rl-verl-h20.md

Published: volcengine/verl ``docs/perf/dpsk.md`` ("Benchmark" at e2e4c35ec, PR 3046:
DeepSeek 671b, 96 GPUs, mean response length 1960, rollout time 1050 s, MFU 0.19, step
time 1700 s; the Qwen3-30B-A3B table at f6f910069, PR 3174: MFU 0.4 / 0.37 / 0.31 on 8 /
16 / 32 GPUs). The scenarios ``scenarios/grpo-deepseek-v3-verl-h20.yaml`` and
``grpo-qwen3-30b-a3b-verl-h20.yaml`` map the scripts to moesim's fields.

moesim's phases as verl's timers hold them (verl/trainer/ppo/ray_trainer.py at e2e4c35ec):
``gen`` (the doc's rollout time) = the generation, the weight hand-over and both switches
(verl's ``generate_sequences`` runs inside its sharding manager, which loads the policy's
weights, reshards them into vLLM, wakes and later sleeps the engine);
``update_actor``'s ``update_policy`` (the time verl's MFU divides by) = the optimizer
steps (``train``) and the host optimizer's copies (``cpu_optimizer``). verl's MFU is
:func:`moesim.rl.verl_mfu.actor_mfu` over the simulated samples and that time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DSV3 = "grpo-deepseek-v3-verl-h20"
QWEN = "grpo-qwen3-30b-a3b-verl-h20"
#: verl docs/perf/dpsk.md at e2e4c35ec: rollout time s, MFU, step time s, mean response
DSV3_PUBLISHED = {"gen_s": 1050.0, "mfu": 0.19, "step_s": 1700.0, "response": 1960}
#: verl docs/perf/dpsk.md at f6f910069: GPUs -> the actor update's MFU
QWEN_PUBLISHED = {8: 0.40, 16: 0.37, 32: 0.31}
#: the response-length laws beside the scenarios' own (not published: module docstring)
DSV3_SIGMAS = (0.4, 0.8)
QWEN_MEANS = (1000, 4000)


READ = (
    "Read: the actor update is the figure verl publishes for both models, and moesim's is "
    "faster than verl's in both: DeepSeek-V3's update_policy comes out a quarter short of "
    "the time its published MFU implies, and Qwen3-30B-A3B's MFU is 17 to 73 % above the "
    "published one over the response-length means and GPU counts tried (the runs' lengths "
    "are not published). moesim's MFU stays flat from 8 to 32 GPUs where verl's falls from 0.40 "
    "to 0.31: per GPU the samples halve with each doubling, and what does not shrink with them "
    "in moesim (the gradients' reduce over more nodes) stays small. This is the "
    "direction of NeMo RL's Megatron MoE trainer on H100 (rl-moe-trainer.md), less far. "
    "verl's parameter offloads around every phase are priced (rl.train.offload: verl; "
    "the actor's copy out into pageable memory at the published 2.8 GB/s). Not priced, "
    "no published cost: the host's fused AdamW (the part table gives its memory "
    "traffic), the host-side copy into pinned memory that follows each of the actor's "
    "offloads (pin_memory()), verl's per-tensor "
    "resharding into the TP32 engines (mbridge's conversion, one load_weights call a "
    "tensor), the Python of vLLM 0.8.5's eager decode beyond a kernel launch, and the "
    "validation generation every test_freq = 10 steps, if the published step time averages "
    "over it. The rollout time and the rest of the step are where these sit: the rest "
    "(log-prob passes, reward, loads and offloads) is 53 s simulated against some 480 s "
    "published, which the two forward-only passes' FLOPs (each a third of the update's "
    "model FLOPs) do not explain.")


def _err(sim: float, pub: float) -> str:
    return f"{(sim / pub - 1) * 100:+.1f} %"


def figures(run) -> dict:
    """verl's timers and MFU from a simulated run, mean over its steps."""
    from moesim.rl.verl_mfu import actor_mfu, verl_peak

    setup = run.setup
    spec, tr = setup.res.model, setup.cfg.train
    peak = verl_peak(setup.res.device.name, str(setup.scenario.source))
    n = len(run.works)
    gen = upd = mfu = step = 0.0
    for w, b in zip(run.works, run.batches, strict=True):
        d = w.durations
        t = d.trainer
        u = t.get("train", 0.0) + t.get("cpu_optimizer", 0.0)
        gen += d.generate + d.weight_sync + d.switch_in + d.switch_out
        upd += u
        mfu += actor_mfu(spec, b.prompt + b.response, u, tr.gpus, peak, tr.epochs)
        step += d.generate + d.weight_sync + d.switch_in + d.switch_out + sum(t.values())
    resp = sum(float(b.response.mean()) for b in run.batches) / n
    return {"gen_s": gen / n, "update_s": upd / n, "mfu": mfu / n, "step_s": step / n,
            "response": resp, "phases": {k: sum(w.durations.trainer.get(k, 0.0)
                                                for w in run.works) / n
                                         for k in run.works[0].durations.trainer},
            "generate_s": sum(w.durations.generate for w in run.works) / n,
            "sync_s": sum(w.durations.weight_sync for w in run.works) / n}


def simulate(name: str, sets: list[str]):
    from moesim.rl.run import resolve_rl, simulate_rl

    setup = resolve_rl(ROOT / "scenarios" / f"{name}.yaml", sets)
    return simulate_rl(setup, setup.cfg.steps)


def dsv3_section() -> None:
    from moesim.rl.cpu_optimizer import host_adamw_bytes, shard_params

    t0 = time.perf_counter()
    run = simulate(DSV3, [])
    f = figures(run)
    p = DSV3_PUBLISHED
    print(f"### DeepSeek-V3, 96 H20 (TP8 PP12 EP8 trainer, TP32 vLLM): `{DSV3}`")
    print()
    print(f"mean response {f['response']:,.0f} tokens (published {p['response']:,}); "
          f"simulated in {time.perf_counter() - t0:.0f} s")
    print()
    print("| figure | simulated | published | error |")
    print("|---|---|---|---|")
    print(f"| rollout time (verl's gen timer) s | {f['gen_s']:.1f} | {p['gen_s']:.0f} | "
          f"{_err(f['gen_s'], p['gen_s'])} |")
    print(f"| actor update MFU (verl's formula) | {f['mfu']:.3f} | {p['mfu']:.2f} | "
          f"{_err(f['mfu'], p['mfu'])} |")
    print(f"| step time s | {f['step_s']:.1f} | {p['step_s']:.0f} | "
          f"{_err(f['step_s'], p['step_s'])} |")
    rest_sim = f["step_s"] - f["gen_s"] - f["update_s"]
    upd_pub = f["update_s"] * f["mfu"] / p["mfu"]
    rest_pub = p["step_s"] - p["gen_s"] - upd_pub
    print(f"| update_policy s (published: from its MFU over the simulated samples) | "
          f"{f['update_s']:.1f} | {upd_pub:.0f} | {_err(f['update_s'], upd_pub)} |")
    print(f"| the rest of the step (log-probs, reward, loads and offloads) s | "
          f"{rest_sim:.1f} | {rest_pub:.0f} | {_err(rest_sim, rest_pub)} |")
    print()
    spec, tr = run.setup.res.model, run.setup.cfg.train
    print("| part | simulated |")
    print("|---|---|")
    rows = [("generation s", f["generate_s"]), ("weight hand-over s", f["sync_s"])]
    rows += [(f"{k} s", v) for k, v in f["phases"].items() if v]
    rows += [("optimizer shard of the busiest GPU, billion parameters",
              shard_params(spec, tr) / 1e9),
             ("host AdamW traffic per optimizer step and host (not priced) GB",
              host_adamw_bytes(spec, tr, 8) / 1e9)]
    for label, v in rows:
        print(f"| {label} | {v:,.2f} |")
    print()
    print("Response-length law (not published; the scenario's sigma is 0.6):")
    print()
    print("| lognormal sigma | mean response | rollout time s | error | step s | error |")
    print("|---|---|---|---|---|---|")
    laws = [("0.6 (the scenario)", f)]
    laws += [(str(sg), figures(simulate(DSV3, [f"rl.response_tokens.sigma={sg}"])))
             for sg in DSV3_SIGMAS]
    for label, g in laws:
        print(f"| {label} | {g['response']:,.0f} | {g['gen_s']:.1f} | "
              f"{_err(g['gen_s'], p['gen_s'])} | {g['step_s']:.1f} | "
              f"{_err(g['step_s'], p['step_s'])} |")
    print()


def qwen_section() -> None:
    print(f"### Qwen3-30B-A3B on 8, 16 and 32 H20 (TP1 EP8 trainer, TP4 vLLM): `{QWEN}`")
    print()
    print("| GPUs | mean response | update_policy s | actor MFU (verl's formula) | "
          "published | error |")
    print("|---|---|---|---|---|---|")
    runs = [(str(gpus), pub, [f"cluster.nodes={gpus // 8}", f"rl.rollout.gpus={gpus}",
                              f"rl.train.gpus={gpus}"])
            for gpus, pub in QWEN_PUBLISHED.items()]
    runs += [(f"8, mean {mean:,} (not the scenario's)", QWEN_PUBLISHED[8],
              [f"rl.response_tokens.mean={mean}"]) for mean in QWEN_MEANS]
    for label, pub, sets in runs:
        f = figures(simulate(QWEN, sets))
        print(f"| {label} | {f['response']:,.0f} | {f['update_s']:.1f} | {f['mfu']:.3f} | "
              f"{pub:.2f} | {_err(f['mfu'], pub)} |")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("deepseek-v3", "qwen3-30b-a3b"), help="one model")
    a = ap.parse_args(argv)
    print("verl's published H20 runs against moesim; s = seconds; error = simulated / "
          "published - 1")
    print()
    if a.only != "qwen3-30b-a3b":
        dsv3_section()
    if a.only != "deepseek-v3":
        qwen_section()
    if a.only is None:
        print(READ)
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "rl-verl-h20", "verl's published GRPO runs on H20"))
