"""Render an ingested :class:`TraceSet` as JSON-able data or a text table."""

from __future__ import annotations

from dataclasses import asdict

from moesim.units import s_to_ms
from moesim.validation.cpu.ingest import TracedOp, TraceSet


def op_dict(op: TracedOp) -> dict:
    d = {k: v for k, v in asdict(op).items() if v not in (0, 0.0, "", ())}
    d["kind"], d["name"], d["start_s"], d["dur_s"] = op.kind, op.name, op.start_s, op.dur_s
    if op.send_rows:
        d["send_bytes"], d["recv_bytes"] = list(op.send_bytes), list(op.recv_bytes)
    return d


def traceset_dict(ts: TraceSet, with_ops: bool = True) -> dict:
    """Everything ingested, SI units (s, bytes, FLOP)."""
    steps = []
    for r in ts.ranks:
        for s in r.steps:
            d = {"rank": r.rank, "step": s.step, "dur_s": s.dur_s, "phases": s.phases,
                 "tokens_per_local_expert": list(s.tokens_per_local_expert),
                 "n_gemm": sum(o.kind == "gemm" for o in s.ops),
                 "n_memory_ops": sum(o.kind == "memory" for o in s.ops)}
            if with_ops:
                d["ops"] = [op_dict(o) for o in s.ops]
            steps.append(d)
    matrices = {str(sid): {role: ts.byte_matrix(sid, role).tolist()
                           for role in ("dispatch", "combine", "combine_grad", "dispatch_grad")}
                for sid in ts.step_ids()}
    return {"world": ts.world, "hidden": ts.hidden, "n_experts": ts.n_experts,
            "sources": [r.source for r in ts.ranks], "steps": steps,
            "byte_matrices": matrices}


PHASES = ("forward_s", "backward_s", "dispatch_s", "experts_s", "combine_s",
          "combine_grad_s", "dispatch_grad_s")


def text_report(ts: TraceSet) -> str:
    lines = [f"{ts.world} ranks, hidden {ts.hidden}, {ts.n_experts or '?'} experts; "
             f"steps {ts.step_ids()}; times in ms"]
    head = ["rank", "step", "a2a"] + [p.removesuffix("_s") for p in PHASES] + ["tokens_in"]
    lines.append(" ".join(f"{h:>12}" if i > 2 else f"{h:>5}" for i, h in enumerate(head)))
    for r in ts.ranks:
        for s in r.steps:
            n_a2a = f"{len(s.collectives())}+{len(s.collectives('count_exchange'))}"
            disp = s.role("dispatch")
            tok_in = sum(disp.recv_rows) if disp else 0
            cells = [f"{r.rank:>5}", f"{s.step:>5}", f"{n_a2a:>5}"]
            cells += [f"{s_to_ms(s.phases[p]):12.3f}" if p in s.phases else f"{'-':>12}"
                      for p in PHASES]
            cells.append(f"{tok_in:>12}")
            lines.append(" ".join(cells))
    for sid in ts.step_ids():
        mat = ts.byte_matrix(sid, "dispatch")
        scale, unit = next((u for u in ((1e6, "MB"), (1e3, "kB")) if mat.max() >= u[0]),
                           (1.0, "bytes"))
        rows = "; ".join(" ".join(f"{b / scale:.3f}" for b in row) for row in mat)
        lines.append(f"step {sid} dispatch [src→dst] ({unit}): {rows}")
    lines.append("a2a = token all-to-alls + count exchanges")
    return "\n".join(lines)
