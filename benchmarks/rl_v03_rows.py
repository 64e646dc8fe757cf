"""The tokens NeMo RL v0.3's Megatron trainer runs per rank in the dense v0.3 rows, with
pipeline parallelism's padding, against the rows moesim prices (issue 39's check that
PP's padding adds no token moesim misses): moesim.rl.pp_padding on each step's batch as
``moesim rl`` draws it.

    python benchmarks/rl_v03_rows.py            # seconds
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (scenario, title)
ROWS = (("grpo-llama31-8b-nemo-v03", "Llama-3.1-8B, DP8"),
        ("grpo-llama31-70b-nemo-v03", "Llama-3.1-70B, TP4 PP4 DP4"),
        ("grpo-qwen3-32b-nemo-v03", "Qwen3-32B, TP4 PP2 DP8"))


def main(argv: list[str] | None = None) -> int:
    from moesim.rl.packing import pad_multiple, split_mini_batches
    from moesim.rl.pp_padding import row_tokens
    from moesim.rl.run import draw_batch, resolve_rl

    t0 = time.perf_counter()
    print("Tokens on the busiest data-parallel rank per RL step (mean of 2 steps): NeMo RL "
          "v0.3.0's bins (each sequence padded to the TP multiple), what its micro-batches "
          "run (with PP, each padded to the rank's longest bin), and what moesim prices "
          "(ceil(rows / dp) full rows)")
    print()
    print("| row | pass | micro-batches | padded tokens | tokens run (NeMo RL) | "
          "tokens priced (moesim) | run / priced |")
    print("|---|---|---|---|---|---|---|")
    for name, title in ROWS:
        setup = resolve_rl(ROOT / "scenarios" / f"{name}.yaml")
        tr = setup.cfg.train
        mult = pad_multiple(tr.tp, tr.cp)
        sums = {"training": [0, 0, 0, 0], "one log-prob pass": [0, 0, 0, 0]}
        for step in range(2):
            b = draw_batch(setup, step)
            lengths = b.prompt + b.response
            for ix in split_mini_batches(len(lengths), tr.mini_batches):
                r = row_tokens(lengths[ix], setup.seq_len, tr.dp, tr.pp, mult)
                for i, v in enumerate((r.micro_batches, r.padded, r.run, r.priced)):
                    sums["training"][i] += v / 2
            r = row_tokens(lengths, tr.logprob_mb_tokens or setup.seq_len, tr.dp, tr.pp, mult)
            for i, v in enumerate((r.micro_batches, r.padded, r.run, r.priced)):
                sums["one log-prob pass"][i] += v / 2
        for what, (mb, pad, run, priced) in sums.items():
            print(f"| {title} | {what} | {mb:,.1f} | {pad:,.0f} | {run:,.0f} | {priced:,.0f} "
                  f"| {run / priced:.3f} |")
    print()
    print(f"took {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
