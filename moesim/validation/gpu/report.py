"""The text tables of ``moesim ingest`` on a GPU trace (from :func:`moesim.validation.gpu.summary.summarize`)."""

from __future__ import annotations

from collections.abc import Callable

from moesim.units import s_to_ms
from moesim.validation.gpu.kernel_names import CLASSES


def _ms(x: float) -> str:
    return f"{s_to_ms(x):.3f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.rjust(w[i]) if i else c.ljust(w[i])  # noqa: E731
                                  for i, c in enumerate(cells))
    return [fmt(head)] + [fmt(r) for r in rows]


def stream_table(g: dict) -> list[str]:
    used = [c for c in CLASSES if any(c in s["classes"] for s in g["streams"])]
    rows = [[str(s["stream"]), str(s["kernels"]), _ms(s["busy_s"])]
            + [_ms(s["classes"].get(c, 0.0)) for c in used] for s in g["streams"]]
    return _table(["stream", "kernels", "busy_ms"] + [f"{c}_ms" for c in used], rows)


def comm_table(g: dict) -> list[str]:
    rows = [[kind, str(d["count"]), _ms(d["total_s"]), _ms(d["busy_s"]), _ms(d["exposed_s"]),
             str(d["sms"])] for kind, d in g["comm"].items()]
    return _table(["comm kind", "count", "total_ms", "busy_ms", "exposed_ms", "SMs"], rows)


def phase_table(g: dict, key: str | Callable[[dict], float] = "gpu_busy_s") -> list[str]:
    """Phases × layers: ``key`` (a field, or a function of the phase's dict) of each
    (annotation name, layer), in ms."""
    get = key if callable(key) else (lambda p: p[key])
    names = list(dict.fromkeys(p["phase"] for p in g["phases"]))
    layers = sorted({p["layer"] for p in g["phases"]})
    cell = {(p["phase"], p["layer"]): p for p in g["phases"]}
    rows = [[n] + [_ms(get(cell[(n, lay)])) if (n, lay) in cell else "-" for lay in layers]
            for n in names]
    return _table(["phase"] + [f"layer{lay}_ms" for lay in layers], rows)


def text_report(g: dict) -> str:
    dev = g["device"] or "unknown device"
    sms = f" ({g['num_sms']} SMs)" if g["num_sms"] else ""
    rank = f", rank {g['rank']}" if g["rank"] is not None else ""
    world = f" of {g['world']}" if g["world"] else ""
    lines = [f"GPU trace {g['source']}: {dev}{sms}{rank}{world}; {g['kernels']} GPU events, "
             f"span {_ms(g['span_s'])} ms", ""]
    lines += stream_table(g) + [""]
    comm = g["comm_busy_s"]
    share = f" ({g['compute_comm_overlap_s'] / comm:.1%} of comm)" if comm > 0 else ""
    lines.append(f"compute busy {_ms(g['compute_busy_s'])} ms, comm busy {_ms(comm)} ms, "
                 f"compute-comm overlap {_ms(g['compute_comm_overlap_s'])} ms{share}, "
                 f"exposed comm {_ms(g['exposed_comm_s'])} ms")
    if g["comm"]:
        lines += [""] + comm_table(g)
    if g["phases"]:
        lines += ["", "GPU busy time of the kernels launched under each annotation (layer k = "
                  "its k-th occurrence), ms:"] + phase_table(g)
        lines += ["", "of which communication kernels (summed), ms:"]
        lines += phase_table(g, lambda p: sum(p["comm"].values()))
        lines += ["", "of which GEMM kernels (summed), ms:"]
        lines += phase_table(g, lambda p: p["classes"].get("gemm", 0.0))
    if g["other_kernels"]:
        lines += ["", f"{sum(g['other_kernels'].values())} kernels of no known class "
                  "('other'):"]
        lines += [f"  {n} ×{c}" for n, c in g["other_kernels"].items()]
    if g["unlinked_kernels"]:
        lines.append(f"{g['unlinked_kernels']} GPU events with no launch found (no "
                     "cuda_runtime/cuda_driver event or ac2g flow with their correlation id)")
    if g["kernels_outside_ops"]:
        lines.append(f"{g['kernels_outside_ops']} GPU events launched outside any CPU op "
                     "(no shapes for them)")
    return "\n".join(lines)
