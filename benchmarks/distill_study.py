"""What distillation adds to a student's step: full vs top-k logits, colocated vs separate
(docs/distillation.md). Writes docs/studies/distillation.md with ``--write-docs``.

    python benchmarks/distill_study.py                 # print the tables
    python benchmarks/distill_study.py --write-docs    # also docs/studies/distillation.md

Every row is ``moesim distill`` on the shipped scenario distill-qwen3-30b-a3b (Qwen3-30B-A3B
on 16 H100, teacher Qwen3-235B-A22B) with the ``--set`` items named in the row; the
student's step is simulated once per student and shared by its rows. A dense pair
(Llama 3.1 8B from Llama 3.1 70B) closes the page. Prints the wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from moesim.distill.step import distill_setup, simulate_distill
from moesim.outputs import write_text
from moesim.units import GiB
from moesim.wiring import simulate

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "studies" / "distillation.md"
SCENARIO = "distill-qwen3-30b-a3b"
COLO = ["distill.placement=colocated", "distill.teacher_gpus=null"]

#: (label, --set items)
MOE_ROWS = [
    ("separate 16 GPUs, top-64", []),
    ("separate 16 GPUs, top-8", ["distill.k=8"]),
    ("separate 16 GPUs, top-512", ["distill.k=512"]),
    ("separate 16 GPUs, full logits", ["distill.outputs=logits"]),
    ("separate 16 GPUs TP1, top-64", ["distill.teacher_tp=1"]),
    ("separate 16 GPUs EP8, top-64", ["distill.teacher_ep=8"]),
    ("separate 32 GPUs, top-64", ["distill.teacher_gpus=32"]),
    ("separate 64 GPUs, top-64", ["distill.teacher_gpus=64"]),
    ("colocated, top-64", COLO),
    ("colocated, full logits", COLO + ["distill.outputs=logits"]),
]
DENSE = ["model.preset=llama-3.1-8b", "parallel.ep=1", "distill.teacher=llama-3.1-70b",
         "distill.teacher_ep=1", "distill.teacher_tp=8"]
DENSE_ROWS = [
    ("separate 16 GPUs TP8, top-64", DENSE),
    ("separate 16 GPUs TP8, full logits", DENSE + ["distill.outputs=logits"]),
    ("colocated TP8, top-64", DENSE + COLO),
    ("colocated TP8, full logits", DENSE + COLO + ["distill.outputs=logits"]),
]


def _row(label: str, r: dict) -> str:
    t, b, m = r["time_s"], r["bytes"], r["memory"]
    student = t["student_step"]
    teacher_side = (m["teacher_weights_bytes"] + m["teacher_activations_bytes"]
                    + m["teacher_outputs_held_bytes"]) if r["placement"] == "separate" \
        else float("nan")
    student_side = m["student_peak_bytes"] + m["student_received_bytes"] + (
        m["teacher_weights_bytes"] if r["placement"] == "colocated" else 0.0)
    teacher = "-" if teacher_side != teacher_side else f"{teacher_side / GiB:.1f}"
    return (f"| {label} | {t['step']:.3f} | {t['added']:.3f} ({t['added'] / student * 100:.0f} %)"
            f" | {t['teacher_forward']:.3f} | {t['transfer'] * 1e3:.2f} | {t['loss'] * 1e3:.3f}"
            f" | {b['outputs_per_step'] / 1e9:.3f} | {b['over_network'] / 1e9:.3f} | "
            f"{b['read_from_hbm'] / 1e9:.3f} | {b['all_gather_per_step'] / 1e9:.3f} | "
            f"{student_side / GiB:.1f} | {teacher} |")


HEADER = ("| teacher | step s | added s | teacher forward s | transfer ms | loss ms | "
          "outputs GB | network GB | HBM GB | top-k all-gather GB | student GPU GiB | "
          "teacher GPU GiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def _table(rows: list[tuple[str, list[str]]], lines: list[str]) -> dict:
    """One table's rows (printed as they come); returns label -> result."""
    results = {}
    student_s = None
    lines.append(HEADER)
    for label, sets in rows:
        setup = distill_setup(SCENARIO, sets)
        if student_s is None:
            student_s = float(simulate(setup.res).summary["step_time_s"])
            first = setup
        r = simulate_distill(setup, student_step_s=student_s)
        results[label] = r
        lines.append(_row(label, r))
        print(lines[-1], flush=True)
    shape = first.res.layout
    lines.append("")
    lines.append(f"Student: {first.res.model.name} on {shape.world} GPUs, step "
                 f"{student_s:.3f} s without a teacher; {r['tokens']:,} tokens per step "
                 f"({r['replicas']} replicas x {r['sequences_per_replica']} sequences x "
                 f"{r['seq_len']:,}); vocabulary {r['vocab']:,}.")
    return results


def _shows(moe: dict) -> list[str]:
    """What the MoE table shows, each sentence computed from its rows."""
    top, full = moe["separate 16 GPUs, top-64"], moe["separate 16 GPUs, full logits"]
    colo, colo_full = moe["colocated, top-64"], moe["colocated, full logits"]
    ts, tt = top["time_s"], top["time_s"]["teacher_per_sequence"]
    hidden = [k for k, r in moe.items() if r["placement"] == "separate"
              and r["time_s"]["step"] <= r["time_s"]["student_step"] + r["time_s"]["loss"]]
    cap = top["memory"]["capacity_bytes"]
    return [
        f"- The teacher's forward pass is the cost: {ts['teacher_forward']:.2f} s on 16 GPUs "
        f"against the student's {ts['student_step']:.2f} s step; per sequence "
        f"{tt['forward_s'] * 1e3:.0f} ms of forward, {tt['lm_head_s'] * 1e3:.1f} ms of LM "
        f"head, {tt['outputs_kernels_s'] * 1e3:.2f} ms of top-k kernels and "
        f"{tt['topk_all_gather_s'] * 1e3:.3f} ms of all-gather.",
        f"- Full logits move {full['bytes']['outputs_per_step'] / top['bytes']['outputs_per_step']:,.0f}"
        f"x the bytes of top-64 ({full['bytes']['outputs_per_step'] / 1e9:.1f} GB against "
        f"{top['bytes']['outputs_per_step'] / 1e9:.2f} GB a step): "
        f"{full['time_s']['transfer'] * 1e3:.0f} ms over the network against "
        f"{ts['transfer'] * 1e3:.2f} ms, a loss of {full['time_s']['loss'] * 1e3:.1f} ms "
        f"against {ts['loss'] * 1e3:.3f} ms, and "
        f"{(full['memory']['student_received_bytes'] - top['memory']['student_received_bytes']) / GiB:.2f}"
        " GiB more on each student GPU.",
        f"- Where the teacher's time goes: with EP16 across its two nodes its pass takes "
        f"{ts['teacher_forward']:.2f} s, with EP8 inside each node "
        f"{moe['separate 16 GPUs EP8, top-64']['time_s']['teacher_forward']:.2f} s (the "
        "expert all-to-alls leave the NVLink domain), with TP1 (no distributed top-k) "
        f"{moe['separate 16 GPUs TP1, top-64']['time_s']['teacher_forward']:.2f} s.",
        f"- Rows where a separate teacher is hidden behind the student's step (only the "
        f"loss added): {', '.join(hidden) or 'none'}.",
        f"- Colocated, the teacher's weights sit beside the student's: "
        f"{(colo['memory']['checks'][0]['need_bytes']) / GiB:.1f} GiB of {cap / GiB:.1f} GiB "
        f"per GPU with top-64, {colo_full['memory']['checks'][0]['need_bytes'] / GiB:.1f} GiB "
        f"with full logits; the step grows by the whole teacher pass "
        f"({colo['time_s']['added']:.2f} s).",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true", help=f"write {PAGE.name}")
    args = ap.parse_args()
    t0 = time.time()
    lines = [
        "# Distillation: what a teacher adds to the student's step",
        "",
        f"Generated by `python benchmarks/distill_study.py --write-docs` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. The model: "
        "docs/distillation.md. Step = student + teacher forward + transfer + loss "
        "(colocated), max(student + loss, teacher forward + transfer) (separate, the "
        "teacher one step ahead). Memory: a student GPU's peak with what it receives (and "
        "the teacher's weights when colocated); a teacher GPU's weights, activations and "
        "the outputs it holds.",
        "",
        "## Qwen3-30B-A3B from Qwen3-235B-A22B (16 H100 for the student, EP8)",
        "",
    ]
    moe = _table(MOE_ROWS, lines)
    lines += ["", "## Llama 3.1 8B from Llama 3.1 70B (dense, 16 H100 for the student)", ""]
    _table(DENSE_ROWS, lines)
    lines += ["", "## What it shows", "", *_shows(moe)]
    print("\n".join(lines[-5:]))
    lines += ["", "## By hand", "",
              "4,096 tokens x 32,000 vocabulary x 2 B = 262,144,000 B of full logits; the "
              "top 8 as (bf16 value, int32 index) pairs: 4,096 x 8 x 6 B = 196,608 B "
              "(tests/test_distill.py)."]
    wall = time.time() - t0
    print(f"wall {wall:.0f} s")
    if args.write_docs:
        write_text(PAGE, "\n".join(lines) + "\n", force=True)
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
