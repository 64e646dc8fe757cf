"""Regenerate every results page under docs/results/ (issue 20, item 4): each is what one
benchmark printed, with the date, the machine's load and the command
(benchmarks/results_page.py). Run it after a change that moves figures (a kernel model, an
engine change), then commit docs/results/.

    python benchmarks/regenerate_docs.py                       # every page (tens of minutes)
    python benchmarks/regenerate_docs.py --only validation deepep
    python benchmarks/regenerate_docs.py --profile DIR/train.json   # also DeepSeek's profile
    python benchmarks/regenerate_docs.py --list

DeepSeek's profile (``train.json`` of github.com/deepseek-ai/profile-data) is not
shipped: without ``--profile`` its page is left as it is. The page names the file
``PATH/train.json`` whatever its real location (a results page names no machine path).
Prints one line per page as it starts and ends (wall time); exit status 1 when any failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (page, benchmark and its arguments, what it needs). A benchmark that writes its page
# itself takes its own flag (OWN_WRITER); the others get --write-docs=PAGE.
OWN_WRITER = {"memory": ["--write"], "published": ["--write", "docs/results/published.md"]}
PAGES: list[tuple[str, list[str], str]] = [
    ("memory", ["memory_megatron.py"], ""),
    ("validation", ["validation_table.py"], ""),
    ("shape-sweep", ["shape_sweep_table.py"], ""),
    ("shape-sweep-study", ["shape_sweep_table.py", "--study", "traces/sweep-study"], ""),
    ("shape-sweep-study-repeat",
     ["shape_sweep_table.py", "--study", "traces/sweep-study-repeat"], ""),
    ("deepep", ["deepep_table.py", "--markdown"], ""),
    ("deepseek-settings", ["deepseek_settings.py", "--profile", "PATH/train.json"], "profile"),
    ("serving-load", ["bench_serve_load.py"], ""),
    ("serving-published", ["serving_published.py"], ""),
    ("ll-sms-logs", ["ll_sms_logs.py"], ""),
    ("serving-steps", ["bench_serve.py"], ""),
    ("rl", ["bench_rl.py"], ""),
    ("rl-published", ["rl_published.py"], ""),
    ("rl-shipped", ["rl_shipped.py"], ""),
    ("rl-v03", ["rl_v03.py"], ""),
    ("rl-verl-h20", ["rl_verl_h20.py"], ""),
    ("megatron-moe-h800", ["megatron_moe_h800.py"], ""),
    ("a2a-overlap-rate", ["a2a_overlap_rate.py"], ""),
    ("fast-path", ["bench_fast.py", "--no-scaling"], ""),
    ("fast-vs-exact", ["fast_vs_exact.py"], ""),   # the scaling tables: hours at load
    ("campaign", ["campaign_llama3.py"], ""),
    ("deepseek-profile", ["deepseek_profile.py", "PATH/train.json"], "profile"),
    ("published", ["published_table.py", "--profile", "PATH/train.json"], "profile"),
    ("memory-kernels", ["liger_rows.py"], ""),
    ("memory-kernels-profile", ["memory_kernels_profile.py", "PATH/train.json", "--span"],
     "profile"),
    ("fusion", ["fusion_whatif.py"], ""),
    ("scale-any", ["bench_scale.py"], ""),      # about half an hour at load
    ("quantisation", ["quant_published.py"], ""),
    ("grpo-study", ["grpo_study.py"], ""),
    ("rl-refit", ["bench_refit.py"], ""),
    ("vllm-decode-latency", ["vllm_small_batch.py"], ""),
    ("megatron-dense-published", ["megatron_dense_published.py"], ""),
    ("rl-moe-trainer", ["rl_moe_trainer.py"], ""),
    ("moe-layer-modelzoo", ["moe_layer_modelzoo.py"], ""),
    ("collective-launch", ["collective_launch.py"], ""),
    ("hybridep-published", ["hybridep_published.py"], ""),
    ("knob-defaults", ["knob_defaults.py"], ""),
    ("topology-scale", ["bench_topology_scale.py", "--profile"], ""),
]


def _command(page: str, args: list[str], cwd: Path) -> list[str]:
    own = list(OWN_WRITER.get(page, [f"--write-docs={page}"]))
    if page in OWN_WRITER and len(own) > 1:
        own[-1] = str(ROOT / own[-1]) if cwd != ROOT else own[-1]
    return [sys.executable, str(ROOT / "benchmarks" / args[0]), *args[1:], *own]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="PAGE", choices=[p for p, _, _ in PAGES])
    ap.add_argument("--profile", metavar="TRAIN_JSON",
                    help="DeepSeek's profile (train.json) for the deepseek-profile page")
    ap.add_argument("--list", action="store_true", help="list the pages and their commands")
    args = ap.parse_args(argv)
    if args.list:
        for page, cmd, needs in PAGES:
            print(f"docs/results/{page}.md: python benchmarks/{' '.join(cmd)}"
                  + (" (needs --profile)" if needs else ""))
        return 0
    failed = []
    for page, cmd, needs in PAGES:
        if args.only and page not in args.only:
            continue
        cwd = ROOT
        tmp = None
        if needs == "profile":
            if not args.profile:
                print(f"{page}: skipped (needs --profile TRAIN_JSON); page left as it is")
                continue
            prof = Path(args.profile).resolve()
            if not prof.is_file():
                print(f"regenerate_docs: error: {args.profile}: --profile: expected a file, "
                      "got 'no such file'", file=sys.stderr)
                return 2
            # run where the profile is PATH/train.json, as the docs name it
            tmp = tempfile.TemporaryDirectory()
            cwd = Path(tmp.name)
            (cwd / "PATH").mkdir()
            (cwd / "PATH" / "train.json").symlink_to(prof)
            for d in ("scenarios", "topologies", "traces"):
                (cwd / d).symlink_to(ROOT / d, target_is_directory=True)
        print(f"{page}: python benchmarks/{' '.join(cmd)} ...", flush=True)
        t0 = time.perf_counter()
        env = dict(os.environ, MPLBACKEND="Agg")
        r = subprocess.run(_command(page, cmd, cwd), cwd=cwd, env=env, stdout=subprocess.DEVNULL)
        if tmp is not None:
            tmp.cleanup()
        status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
        print(f"{page}: {status}, {time.perf_counter() - t0:.0f} s wall; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
        if r.returncode:
            failed.append(page)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
