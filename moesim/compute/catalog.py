"""Kernel catalog compute model: each kernel at the rate its own authors measured.

A :class:`CatalogModel` prices a :class:`~moesim.compute.base.Kernel` from the published
table for its device, ``kind``, dtype and pass (``moesim/data/kernels/*.yaml``, read by
:mod:`moesim.compute.catalog_data`; docs/kernels.md "Catalog"):

- GEMMs (``gemm``, ``grouped_gemm``, ``kgrouped_gemm``): the rows of the kernel's
  weight shape (n, k) (for ``dgrad``: (k, n), the shape of dX = dY·Wᵀ), or those of a
  published shape with K within 2x scaled by waves of output tiles and by K
  (:meth:`CatalogModel._wave_scale`); along tokens per group the achieved
  rate is interpolated log-log between rows, so at a row's shape the time is the
  row's published FLOPs / TFLOP/s exactly, and between rows time grows with FLOPs
  (the data loader checks every curve allows that).
- attention (``attn_fwd``, ``attn_bwd``): rate by sequence length (log-log) and head
  dim (geometric), time = FLOPs / rate; a forward + backward figure prices either
  pass when no pass-specific table covers it.
- ``memory``: bytes / achieved bandwidth; ``mla_decode``: max(bytes / bandwidth,
  FLOPs / rate), FlashMLA's published ceilings.

Every catalog time adds ``count`` × the device's launch overhead, as the roofline does,
so switching models changes only the kernels' rates. Anything the catalog does not cover
(``kind`` "", a dtype or device without a table, a shape below the smallest row, or
above the largest where the table does not hold its rate) is priced by the roofline
and says so (:meth:`CatalogModel.price`, :func:`coverage`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from moesim.compute.base import Kernel
from moesim.compute.catalog_data import GEMM_KINDS, Table, curve, families
from moesim.compute.roofline import HIGH_PRECISION_KERNELS, RooflineModel
from moesim.compute.sm_share import BLOCK_M, BLOCK_N, GROUPED_KINDS, waves

#: A GEMM whose shape is not in a table is scaled from a published shape whose reduction
#: dim K is within this factor (our choice: the time of one output tile is taken as
#: proportional to K, which holds less well the further K is; beyond 2x, the roofline
#: prices the kernel). Its N is handled by counting waves of tiles (_wave_scale).
NEAREST_SHAPE_FACTOR = 2.0
_SUFFIXES = ("_bwd", "_dgrad", "_wgrad")
_MEMO_LIMIT = 1 << 16


@dataclass(frozen=True, slots=True)
class Priced:
    """A kernel's time and what priced it: ``source`` "catalog" or "roofline" (or a
    model's name), ``detail`` the table and row, or why the catalog did not apply."""

    time_s: float
    source: str
    detail: str = ""


def _base_name(name: str) -> str:
    for s in _SUFFIXES:
        if name.endswith(s):
            return name[:-len(s)]
    return name


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


class CatalogModel:
    """A :class:`~moesim.compute.base.ComputeModel` from published kernel tables, the
    roofline for what they do not cover."""

    def __init__(self, roofline: RooflineModel, tables: tuple[Table, ...],
                 gemm_library: str = "") -> None:
        self.roofline = roofline
        self.device = roofline.device
        self.precision = roofline.precision
        self.launch_overhead_s = roofline.launch_overhead_s
        self.graph_kernel_s = roofline.graph_kernel_s
        dev = self.device.name
        #: GEMMs are priced by the tables of this library only ("" = tables without one)
        self.gemm_library = gemm_library
        self.tables = tuple(t for t in tables if t.covers(dev)
                            and (t.kind not in GEMM_KINDS or t.library == gemm_library))
        lib = f",{gemm_library}" if gemm_library else ""
        self.name = f"catalog({dev},{self.precision}{lib})"
        #: pricing calls so far: source -> [kernels, seconds] (see :func:`coverage`)
        self.tally: dict[str, list[float]] = {"catalog": [0, 0.0], "roofline": [0, 0.0]}
        self._memo: dict[Kernel, Priced] = {}    # identical kernels price identically

    # -------------------------------------------------------------------- pricing
    def time_s(self, kernel: Kernel) -> float:
        return self.price(kernel).time_s

    def price(self, kernel: Kernel) -> Priced:
        p = self._memo.get(kernel)
        if p is None:
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            p = self._memo[kernel] = self._price(kernel)
        t = self.tally[p.source]
        t[0] += 1
        t[1] += p.time_s
        return p

    def dtype_of(self, kernel: Kernel) -> str:
        """The kernel's dtype; "" = the scenario's precision, except the kernels an FP8
        recipe keeps in BF16 (:data:`~moesim.compute.roofline.HIGH_PRECISION_KERNELS`)."""
        if kernel.dtype:
            return kernel.dtype
        if self.precision == "fp8" and _base_name(kernel.name) in HIGH_PRECISION_KERNELS:
            return "bf16"
        return self.precision

    def _fallback(self, kernel: Kernel, why: str) -> Priced:
        return Priced(self.roofline.time_s(kernel), "roofline", why)

    def _price(self, kernel: Kernel) -> Priced:
        kind = kernel.kind
        if not kind:
            return self._fallback(kernel, "no kind")
        dtype = self.dtype_of(kernel)
        tables = [t for t in self.tables if t.dtype in (dtype, "any")]
        if kind in GEMM_KINDS:
            pass_ = kernel.pass_ or "fwd"
            tables = [t for t in tables if t.kind == kind and pass_ in t.passes]
            got = self._gemm(kernel, tables, pass_)
        elif kind in ("attn_fwd", "attn_bwd"):
            got = self._attention(kernel, tables)
        elif kind in ("memory", "mla_decode"):
            got = self._rate(kernel, [t for t in tables if t.kind == kind])
        else:
            return self._fallback(kernel, f"kind {kind!r} not in the catalog")
        if isinstance(got, str):
            return self._fallback(kernel, got)
        seconds, detail = got
        n = max(kernel.count, 1)
        return Priced(n * self.roofline.per_launch_s(kernel) + seconds, "catalog", detail)

    def _where(self, kernel: Kernel, dtype_note: str = "") -> str:
        return (f"no {self.device.name} {self.dtype_of(kernel)} {kernel.kind}"
                f"{' ' + kernel.pass_ if kernel.pass_ else ''} table{dtype_note}")

    # ------------------------------------------------------------------ GEMMs
    def _gemm(self, kernel: Kernel, tables: list[Table], pass_: str) -> tuple | str:
        if not tables:
            return self._where(kernel)
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
                scale, near = self._wave_scale(kernel, (n, k), shape, pts[-1][0], wgrad)
            detail = (f"{t.id} m/groups={x:g} n={n} k={k}: {kind} {tflops:.4g} TFLOP/s"
                      f"{near}{how}")
            return count * (per_launch / (tflops * 1e12)) * scale, detail
        return why

    def _wave_scale(self, kernel: Kernel, shape: tuple[int, int], ref: tuple[int, int],
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
        sms = max(int(getattr(self.device, "sms", 0) or 0), 1)
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

    # -------------------------------------------------------------- attention
    def _attention(self, kernel: Kernel, tables: list[Table]) -> tuple | str:
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
        return why or self._where(kernel, f" (causal={kernel.causal})")

    # ----------------------------------------------------- bandwidth-bound kernels
    def _rate(self, kernel: Kernel, tables: list[Table]) -> tuple | str:
        if not tables:
            return self._where(kernel)
        t = tables[0]
        mem = kernel.bytes / (t.gbps * 1e9)
        if t.kind == "memory":
            return mem, f"{t.id}: {t.gbps:g} GB/s"
        comp = kernel.flops / (t.tflops * 1e12)
        bound = "memory" if mem >= comp else "compute"
        return max(mem, comp), f"{t.id}: {bound}-bound ({t.gbps:g} GB/s, {t.tflops:g} TFLOP/s)"


@functools.lru_cache(maxsize=256)
def _families(t: Table) -> dict:
    return families(t)


@functools.lru_cache(maxsize=4096)
def _points(t: Table, shape: tuple[int, int], groups: int) -> list[tuple[float, float]]:
    return [(r.axis, r.tflops) for r in curve(_families(t)[shape], groups)]


def _nearest(fams: dict, n: int, k: int, wgrad: bool = False) -> tuple[int, int] | None:
    """The published (n, k) an unpublished GEMM shape is scaled from
    (:meth:`CatalogModel._wave_scale`): the reduction dim K within NEAREST_SHAPE_FACTOR
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


# ------------------------------------------------------------------- provenance
def price(model, kernel: Kernel) -> Priced:
    """``model.price(kernel)`` for a catalog model; any other ComputeModel's time with
    its name as the source."""
    fn = getattr(model, "price", None)
    if fn is not None:
        return fn(kernel)
    return Priced(model.time_s(kernel), "roofline" if isinstance(model, RooflineModel)
                  else str(getattr(model, "name", type(model).__name__)))


@dataclass(frozen=True, slots=True)
class Coverage:
    n_kernels: int
    n_roofline: int
    total_s: float
    roofline_s: float

    @property
    def roofline_fraction(self) -> float:
        return self.roofline_s / self.total_s if self.total_s > 0 else 0.0

    def line(self) -> str:
        return (f"priced by the roofline: {self.n_roofline} of {self.n_kernels} kernels, "
                f"{100 * self.roofline_fraction:.1f} % of compute time")


def coverage(model, kernels) -> Coverage:
    """How much of ``kernels`` (each counted once, as given) the roofline priced."""
    n = nr = 0
    total = rs = 0.0
    for k in kernels:
        p = price(model, k)
        n += 1
        total += p.time_s
        if p.source == "roofline":
            nr += 1
            rs += p.time_s
    return Coverage(n, nr, total, rs)

