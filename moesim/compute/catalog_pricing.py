"""How the kernel catalog prices the kinds it has tables for: GEMMs, attention and
bandwidth-bound kernels, each a pricer registered in :mod:`moesim.compute.kinds`.

A pricer ``price(model, kernel)`` reads ``model.tables_for(kernel)`` (the catalog's
published tables of the kernel's dtype, :class:`moesim.compute.catalog.CatalogModel`) and
returns ``(seconds, detail)``: the kernel's work over all its ``count`` launches, launch
overhead excluded (the catalog adds it), and what priced it in words; or a string saying
why no table covers the kernel (the roofline then prices it):

- :func:`gemm` (``gemm``, ``grouped_gemm``, ``kgrouped_gemm``): the rows of the kernel's
  weight shape (n, k) (for ``dgrad``: (k, n), the shape of dX = dY·Wᵀ), or those of a
  published shape with K within 2x scaled by waves of output tiles and by K
  (:func:`wave_scale`); along tokens per group the achieved rate is interpolated log-log
  between rows, so at a row's shape the time is the row's published FLOPs / TFLOP/s
  exactly, and between rows time grows with FLOPs.
- :func:`attention` (``attn_fwd``, ``attn_bwd``): rate by sequence length (log-log) and
  head dim (geometric), time = FLOPs / rate; a forward + backward figure prices either
  pass when no pass-specific table covers it.
- :func:`rate` (``memory``: bytes / achieved bandwidth; ``mla_decode``: max(bytes /
  bandwidth, FLOPs / rate), FlashMLA's published ceilings).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from moesim.compute.base import Kernel
from moesim.compute.catalog_data import Table, curve, families
from moesim.compute.sm_share import BLOCK_M, BLOCK_N, GROUPED_KINDS, waves

#: A GEMM whose shape is not in a table is scaled from a published shape whose reduction
#: dim K is within this factor (our choice: the time of one output tile is taken as
#: proportional to K, which holds less well the further K is; beyond 2x, the roofline
#: prices the kernel). Its N is handled by counting waves of tiles (:func:`wave_scale`).
NEAREST_SHAPE_FACTOR = 2.0

Got = tuple[float, str] | str


def _interp(points: list[tuple[float, float]], x: float) -> tuple[float, str] | None:
    """Rate at ``x`` on ``points`` (axis, rate) sorted by axis: a point's own rate at
    it, log-log between points; None outside."""
    for a, r in points:
        if x == a:
            return r, "exact"
    if x < points[0][0] or x > points[-1][0]:
        return None
    for (a, ra), (b, rb) in zip(points, points[1:], strict=False):
        if a < x < b:
            w = math.log(x / a) / math.log(b / a)
            return math.exp(math.log(ra) + w * math.log(rb / ra)), "interpolated"
    return None   # unreachable: x lies in some segment


# ------------------------------------------------------------------ GEMMs
def gemm(model: Any, kernel: Kernel) -> Got:
    """A GEMM kind's time from the tables of its kind and pass."""
    pass_ = kernel.pass_ or "fwd"
    twin = (pass_ == "wgrad" and kernel.kind == "gemm" and model.dtype_of(kernel) == "fp8"
            and getattr(model, "fp8_wgrad", "deepgemm") == "cublas")
    if twin:      # compute.fp8_wgrad cublas: at the forward twin's rate (select.FP8_WGRAD)
        pass_ = "fwd"
    tables = [t for t in model.tables_for(kernel) if t.kind == kernel.kind and pass_ in t.passes]
    if not tables:
        return model.where(kernel)
    groups = max(kernel.groups, 1)
    m, n, k = kernel.m, kernel.n, kernel.k
    if pass_ == "dgrad":          # dX(m, k) = dY(m, n) · Wᵀ: a GEMM of shape (m, k, n)
        n, k = k, n
    if m <= 0 or n <= 0 or k <= 0:
        return f"GEMM without a shape (m={m}, n={n}, k={k})"
    count = max(kernel.count, 1)
    per_launch = kernel.flops / count
    why = ""
    wgrad = pass_ == "wgrad"
    note = " (fp8_wgrad cublas: the forward twin's rate)" if twin else ""
    for t in tables:
        fams = _families(t)
        shape = (n, k) if (n, k) in fams else _nearest(fams, n, k, wgrad)
        if shape is None:
            why = why or (f"shape n={n} k={k}: no {t.id} shape with k within 2x")
            continue
        pts = _points(t, shape, groups)
        x = m / groups
        got = _interp(pts, x)
        how = ""
        if got is None and x > pts[-1][0] and t.hold_above:
            got, how = (pts[-1][1], "held"), f" (above the largest row, {pts[-1][0]:g})"
        if got is None:
            why = why or (f"{x:g} tokens per group outside {t.id}'s range "
                          f"{pts[0][0]:g}-{pts[-1][0]:g}")
            continue
        tflops, kind = got
        scale, near = 1.0, ""
        if shape != (n, k):
            scale, near = wave_scale(model.device, kernel, (n, k), shape, pts[-1][0], wgrad)
        detail = (f"{t.id} m/groups={x:g} n={n} k={k}: {kind} {tflops:.4g} TFLOP/s"
                  f"{near}{how}{note}")
        return count * (per_launch / (tflops * 1e12)) * scale, detail
    return why


def wave_scale(device: Any, kernel: Kernel, shape: tuple[int, int], ref: tuple[int, int],
               x_ref: float, wgrad: bool) -> tuple[float, str]:
    """Time of an unpublished GEMM shape relative to FLOPs at the rate of the published
    shape ``ref`` (both as the table keys them: (N, K) of the GEMM, or the weight's
    (n, k) for a weight gradient). A persistent GEMM's time is its waves of output
    tiles (:mod:`moesim.compute.sm_share`: 128 × 128 tiles over the device's SMs) times
    the time of one tile, which is proportional to the reduction dim (K; the tokens for
    a weight gradient, the same for both shapes). Counted at ``x_ref`` tokens per group
    (the curve's largest row, so the factor does not change along the curve and time
    stays monotone in FLOPs): time = FLOPs / rate × waves(shape) / waves(ref) ×
    (N_ref · K_ref) / (N · K) × (K / K_ref)."""
    sms = max(int(getattr(device, "sms", 0) or 0), 1)
    per = max(kernel.count, 1) if kernel.kind in GROUPED_KINDS else 1
    groups = max(kernel.groups, 1) * per
    rows = math.ceil(x_ref)

    def w(nn: int, kk: int) -> int:
        if wgrad:   # dW (k × n) per group
            t = math.ceil(kk / BLOCK_M) * math.ceil(nn / BLOCK_N)
        else:       # Y (rows × N) per group
            t = math.ceil(rows / BLOCK_M) * math.ceil(nn / BLOCK_N)
        return waves(t * groups, sms)

    (n, k), (nr, kr) = shape, ref
    ws, wr = w(n, k), w(nr, kr)
    f = ws / wr * (nr * kr) / (n * k) * (1.0 if wgrad else k / kr)
    return f, (f" (from n={nr} k={kr}: {ws}/{wr} waves of 128x128 tiles on {sms} SMs"
               f"{'' if wgrad else f', K {k}/{kr}'}: x{f:.3g})")


@functools.lru_cache(maxsize=256)
def _families(t: Table) -> dict:
    return families(t)


@functools.lru_cache(maxsize=4096)
def _points(t: Table, shape: tuple[int, int], groups: int) -> list[tuple[float, float]]:
    return [(r.axis, r.tflops) for r in curve(_families(t)[shape], groups)]


def _nearest(fams: dict, n: int, k: int, wgrad: bool = False) -> tuple[int, int] | None:
    """The published (n, k) an unpublished GEMM shape is scaled from
    (:func:`wave_scale`): the reduction dim K within NEAREST_SHAPE_FACTOR
    and nearest (log distance), then N nearest; for a weight gradient (reduction over
    the tokens, the curve's axis) the nearest (n, k). None when there is none."""
    lim = math.log(NEAREST_SHAPE_FACTOR) + 1e-12
    best = None
    for fn, fk in fams:
        dn, dk = abs(math.log(n / fn)), abs(math.log(k / fk))
        if wgrad:
            key = (dn + dk, 0.0, fn, fk)
        elif dk <= lim:
            key = (dk, dn, fn, fk)
        else:
            continue
        if best is None or key < best[0]:
            best = (key, (fn, fk))
    return None if best is None else best[1]


# -------------------------------------------------------------- attention
def attention(model: Any, kernel: Kernel) -> Got:
    """An attention kind's time: its own pass's tables, a causal backward from the
    forward's causal / non-causal ratio, then a forward + backward figure."""
    tables = model.tables_for(kernel)
    if kernel.seq <= 0 or kernel.head_dim <= 0:
        return "attention without seq or head_dim"
    why = ""
    count = max(kernel.count, 1)
    for kind in (kernel.kind, "causal from forward", "attn_fwdbwd"):
        if kind == "causal from forward":
            got = _causal_from_forward(kernel, tables)
            if got is None:
                continue
        else:
            cands = [t for t in tables if t.kind == kind and t.causal == kernel.causal]
            if not cands:
                continue
            got = _attention_rate(cands, kernel.seq, kernel.head_dim)
        if isinstance(got, str):
            why = why or got
            continue
        tflops, detail = got
        return count * (kernel.flops / count / (tflops * 1e12)), detail
    return why or model.where(kernel, f" (causal={kernel.causal})")


def _seq_rate(t: Table, seq: int) -> tuple[float, str] | None:
    pts = [(r.axis, r.tflops) for r in sorted(t.rows, key=lambda r: r.axis)]
    got = _interp(pts, seq)
    if got is None and seq > pts[-1][0] and t.hold_above:
        return pts[-1][1], "held"
    return got


def _attention_rate(tables: list[Table], seq: int, head_dim: int) -> tuple[float, str] | str:
    """Rate at (seq, head_dim) from tables of one kind and causality: the table of that
    head dim, or the geometric interpolation of the two around it."""
    by_d = {t.head_dim: t for t in tables}
    dims = sorted(by_d)
    if head_dim in by_d:
        pair = [by_d[head_dim]]
    else:
        lo = [d for d in dims if d < head_dim]
        hi = [d for d in dims if d > head_dim]
        if lo and not hi and by_d[lo[-1]].hold_above:
            pair = [by_d[lo[-1]]]     # wider heads run at least as fast: hold the widest
        elif not lo or not hi:
            return f"head_dim {head_dim} outside {dims[0]}-{dims[-1]} ({tables[0].kind})"
        else:
            pair = [by_d[lo[-1]], by_d[hi[0]]]
    rates = []
    for t in pair:
        got = _seq_rate(t, seq)
        if got is None:
            seqs = [r.seq for r in t.rows]
            return f"seq {seq} outside {t.id}'s range {min(seqs)}-{max(seqs)}"
        rates.append(got)
    if len(pair) == 1:
        (rate, how), = rates
        held = "" if pair[0].head_dim == head_dim else f" (head_dim {head_dim} held at " \
            f"{pair[0].head_dim})"
        return rate, f"{pair[0].id} seq={seq}: {how} {rate:.4g} TFLOP/s{held}"
    (ra, _), (rb, _) = rates
    w = math.log(head_dim / pair[0].head_dim) / math.log(pair[1].head_dim / pair[0].head_dim)
    rate = math.exp(math.log(ra) + w * math.log(rb / ra))
    return rate, (f"{pair[0].id}+{pair[1].id} seq={seq} head_dim={head_dim}: "
                  f"interpolated {rate:.4g} TFLOP/s")


def _causal_from_forward(kernel: Kernel, tables: list[Table]) -> tuple[float, str] | str | None:
    """A causal backward kernel no causal backward table covers: the non-causal backward
    rate × the causal / non-causal ratio of the forward tables at the same (seq, head
    dim) (FlashAttention-3 publishes its backward without a causal mask only; the
    mask's idle and partial tiles cost the backward what they cost the forward). None
    when this does not apply."""
    if kernel.kind != "attn_bwd" or not kernel.causal:
        return None
    bwd = [t for t in tables if t.kind == "attn_bwd" and not t.causal]
    fwd = {c: [t for t in tables if t.kind == "attn_fwd" and t.causal == c]
           for c in (True, False)}
    if not bwd or not fwd[True] or not fwd[False]:
        return None
    got = [_attention_rate(ts, kernel.seq, kernel.head_dim) for ts in (bwd, fwd[True],
                                                                      fwd[False])]
    bad = next((g for g in got if isinstance(g, str)), None)
    if bad is not None:
        return bad
    (rb, db), (rc, _), (rn, _) = got
    rate = rb * rc / rn
    return rate, (f"{db} x causal/non-causal forward {rc:.4g}/{rn:.4g} = "
                  f"{rate:.4g} TFLOP/s")


# ----------------------------------------------------- bandwidth-bound kernels
def rate(model: Any, kernel: Kernel) -> Got:
    """``memory``: bytes / the table's bandwidth; ``mla_decode``: the slower of bytes /
    bandwidth and FLOPs / compute rate."""
    tables = [t for t in model.tables_for(kernel) if t.kind == kernel.kind]
    if not tables:
        return model.where(kernel)
    t = tables[0]
    mem = kernel.bytes / (t.gbps * 1e9)
    if t.kind == "memory":
        return mem, f"{t.id}: {t.gbps:g} GB/s"
    comp = kernel.flops / (t.tflops * 1e12)
    bound = "memory" if mem >= comp else "compute"
    return max(mem, comp), f"{t.id}: {bound}-bound ({t.gbps:g} GB/s, {t.tflops:g} TFLOP/s)"
