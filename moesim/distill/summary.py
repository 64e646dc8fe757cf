"""The distillation summary (``summary.json`` of ``moesim distill``) and its text.

Keys carry their units: ``*_s`` seconds, ``*_bytes`` bytes (``bytes`` and
``memory_bytes`` blocks: every value in bytes; ``time_s``: every value in seconds).
"""

from __future__ import annotations

from moesim.memory.fit import fit_line
from moesim.scenario.sections.distill import summary_dict
from moesim.units import GiB


def summarize(setup, result: dict) -> dict:
    """summary.json: the step, its added time, the bytes, the memory per GPU."""
    t, mem = result["time_s"], result["memory"]
    checks = mem["checks"]
    return {
        "scenario": setup.scenario.name,
        "student": setup.res.model.name,
        "teacher": result["teacher"],
        "placement": result["placement"],
        "outputs": result["outputs"],
        "k": result["k"],
        "step_time_s": t["step"],
        "student_step_s": t["student_step"],
        "added_s": t["added"],
        "tokens_per_step": result["tokens"],
        "time_s": {"teacher_forward": t["teacher_forward"], "transfer": t["transfer"],
                   "loss": t["loss"], "loss_all_reduce": t["loss_all_reduce"],
                   "teacher_per_sequence": t["teacher_per_sequence"]},
        "bytes": result["bytes"],
        "memory_bytes": {k.removesuffix("_bytes"): v for k, v in mem.items()
                         if k.endswith("_bytes")},
        "layout": {"teacher_gpus": result["teacher_gpus"], "teacher_tp": result["teacher_tp"],
                   "teacher_ep": result["teacher_ep"], "student_gpus": setup.res.layout.world,
                   "replicas": result["replicas"],
                   "sequences_per_replica": result["sequences_per_replica"],
                   "seq_len": result["seq_len"],
                   "sequences_per_teacher_group": result["sequences_per_teacher_group"],
                   "flows": result["flows"]},
        "distill": summary_dict(setup.cfg),
        "fit": {"oom": any(c["oom"] for c in checks), "checks": checks},
        "oom": any(c["oom"] for c in checks),
    }


def _gb(b: float) -> str:
    return f"{b / 1e9:,.3f} GB"


def text_summary(s: dict) -> str:
    t, b, m, lay = s["time_s"], s["bytes"], s["memory_bytes"], s["layout"]
    outs = "full logits" if s["outputs"] == "logits" else f"top-{s['k']} logits"
    where = (f"colocated on the student's {lay['student_gpus']} GPUs"
             if s["placement"] == "colocated" else f"separate, {lay['teacher_gpus']} GPUs")
    per = t["teacher_per_sequence"]
    lines = [
        f"{s['scenario']}: {s['student']} distilled from {s['teacher']} ({where}, tp "
        f"{lay['teacher_tp']} ep {lay['teacher_ep']}), {outs}, "
        f"{s['tokens_per_step']:,} tokens per step",
        f"  step {s['step_time_s']:.4f} s = student {s['student_step_s']:.4f} s + added "
        f"{s['added_s']:.4f} s ({s['added_s'] / s['student_step_s'] * 100:.1f} %)",
        f"  teacher forward {t['teacher_forward']:.4f} s ({lay['sequences_per_teacher_group']}"
        f" sequences per TP group x {sum(per.values()) * 1e3:.3f} ms: forward "
        f"{per['forward_s'] * 1e3:.3f} ms, LM head {per['lm_head_s'] * 1e3:.3f} ms, outputs "
        f"kernels {per['outputs_kernels_s'] * 1e3:.3f} ms, top-k all-gather "
        f"{per['topk_all_gather_s'] * 1e3:.3f} ms)",
        f"  transfer {t['transfer'] * 1e3:.3f} ms ({_gb(b['over_network'])} over the network "
        f"in {lay['flows']} flows, {_gb(b['read_from_hbm'])} read from HBM); loss "
        f"{t['loss'] * 1e3:.3f} ms per step ({_gb(b['loss_per_rank'])} moved per rank)",
        f"  outputs per step {_gb(b['outputs_per_step'])} (full logits "
        f"{_gb(b['full_logits_per_step'])}, top-k {_gb(b['topk_per_step'])}); top-k "
        f"all-gather {_gb(b['all_gather_per_step'])}",
        f"  memory per GPU: student peak {m['student_peak'] / GiB:.1f} GiB, teacher weights "
        f"{m['teacher_weights'] / GiB:.1f} GiB, teacher activations "
        f"{m['teacher_activations'] / GiB:.1f} GiB, outputs held by a teacher GPU "
        f"{m['teacher_outputs_held'] / GiB:.3f} GiB, received by a student GPU "
        f"{m['student_received'] / GiB:.3f} GiB",
        fit_line(s["fit"]),
    ]
    return "\n".join(lines)
