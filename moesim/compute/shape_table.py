"""A shape table: measured op times interpolated over a shape sweep (pure numpy), the
part of a calibration (:mod:`moesim.compute.calibrated`) that prices a GEMM or a
memory-bound op by its shape.

- **GEMM families**: samples whose two other dims are fixed and whose third one
  (``axis`` m, k or n) takes at least two values;
- **memory-bound families**: per op kind (``aten::mul``, ...), time against bytes moved;
- per family the point times are made non-decreasing in size (pool-adjacent-violators:
  a larger op is never cheaper), and a size between two points takes the straight
  line between them in log(size)-log(time): exact at the points, monotone between.
  Outside a family's range, or for a shape in no family, :meth:`ShapeTable.gemm_time`
  / :meth:`ShapeTable.memory_time` return None and the calibration's line fit is used.

How the samples are taken from a recorded sweep and anchored on a recording is
:mod:`moesim.validation.calibration.shape_fit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moesim.errors import InputError

AXES = ("m", "k", "n")
#: a family needs this many distinct sizes
MIN_POINTS = 2


@dataclass(frozen=True)
class Family:
    """Sizes ``x`` (increasing) and times ``t_s`` (non-decreasing, s) of one family."""

    x: tuple[float, ...]
    t_s: tuple[float, ...]

    def time(self, size: float) -> float | None:
        """Log-log interpolated time at ``size``; None outside [x[0], x[-1]]."""
        x, t = self.x, self.t_s
        if not x or size < x[0] * (1 - 1e-9) or size > x[-1] * (1 + 1e-9):
            return None
        i = int(np.searchsorted(x, size))
        if i < len(x) and math.isclose(x[i], size, rel_tol=1e-9):
            return t[i]
        if i == 0:
            return t[0]
        i = min(i, len(x) - 1)
        lx0, lx1 = math.log(x[i - 1]), math.log(x[i])
        f = (math.log(size) - lx0) / (lx1 - lx0)
        return math.exp((1 - f) * math.log(t[i - 1]) + f * math.log(t[i]))


def monotone(t: list[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence closest (least squares) to
    ``t``; unchanged when ``t`` is already non-decreasing."""
    blocks: list[list[float]] = []   # [mean, count]
    for v in t:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]]
    return [m for m, n in blocks for _ in range(int(n))]


def family(sizes: list[float], times: list[float], stat: str) -> Family | None:
    """A family from samples (size, time): per distinct size the median (``stat`` =
    "median") or mean time, made monotone; None with fewer than ``MIN_POINTS`` sizes."""
    pts: dict[float, list[float]] = {}
    for x, t in zip(sizes, times, strict=True):
        if x > 0 and t > 0:
            pts.setdefault(float(x), []).append(float(t))
    if len(pts) < MIN_POINTS:
        return None
    xs = sorted(pts)
    agg = np.median if stat == "median" else np.mean
    return Family(tuple(xs), tuple(monotone([float(agg(pts[x])) for x in xs])))


@dataclass(frozen=True)
class ShapeTable:
    """Interpolation tables by shape. ``gemm[(axis, a, b)]``: the family whose dims
    other than ``axis`` are ``a``, ``b`` (in m, k, n order); ``memory[op name]``."""

    gemm: dict[tuple[str, int, int], Family]
    memory: dict[str, Family]

    def __bool__(self) -> bool:
        return bool(self.gemm or self.memory)

    def __hash__(self) -> int:     # frozen, so a model holding a table stays hashable
        return hash((tuple(sorted(self.gemm.items())), tuple(sorted(self.memory.items()))))

    def gemm_family(self, m: int, k: int, n: int) -> tuple[tuple[str, int, int], int] | None:
        """(family key, size on its axis) of the first family (axes m, k, n in turn)
        whose range holds the (m, k, n) matmul; None if none does."""
        dims = {"m": m, "k": k, "n": n}
        for axis in AXES:
            a, b = (dims[d] for d in AXES if d != axis)
            fam = self.gemm.get((axis, a, b))
            if fam is not None and fam.time(dims[axis]) is not None:
                return (axis, a, b), dims[axis]
        return None

    def gemm_time(self, m: int, k: int, n: int) -> float | None:
        """Interpolated seconds of one (m, k, n) matmul, or None (no family holds it)."""
        hit = self.gemm_family(m, k, n)
        return None if hit is None else self.gemm[hit[0]].time(hit[1])

    def memory_time(self, name: str, nbytes: float) -> float | None:
        fam = self.memory.get(name)
        return fam.time(nbytes) if fam is not None else None

    def to_doc(self) -> dict:
        def fam(f: Family) -> dict:
            return {"x": list(f.x), "t_s": list(f.t_s)}
        return {"gemm": [{"axis": ax, "fixed": [a, b], **fam(f)}
                         for (ax, a, b), f in sorted(self.gemm.items())],
                "memory": [{"op": name, **fam(f)} for name, f in sorted(self.memory.items())]}


def key_text(key: tuple[str, int, int]) -> str:
    """``("m", 512, 1024)`` → ``"m×512×1024"``: the varying dim, then the fixed ones."""
    return "×".join(map(str, key))


def table_from_samples(gemm: list[tuple[int, int, int, float]],
                       memory: list[tuple[str, float, float]]) -> ShapeTable:
    """Families from GEMM samples (m, k, n, s) and memory-bound samples (op, bytes, s)."""
    gem: dict[tuple[str, int, int], Family] = {}
    for axis in AXES:
        groups: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        for m, k, n, t in gemm:
            dims = {"m": m, "k": k, "n": n}
            a, b = (dims[d] for d in AXES if d != axis)
            xs, ts = groups.setdefault((a, b), ([], []))
            xs.append(dims[axis])
            ts.append(t)
        for (a, b), (xs, ts) in groups.items():
            f = family(xs, ts, "median")
            if f is not None:
                gem[(axis, a, b)] = f
    mem: dict[str, tuple[list[float], list[float]]] = {}
    for name, nbytes, t in memory:
        xs, ts = mem.setdefault(name, ([], []))
        xs.append(nbytes)
        ts.append(t)
    fams = {name: family(xs, ts, "mean") for name, (xs, ts) in mem.items()}
    return ShapeTable(gem, {k: f for k, f in fams.items() if f is not None})


def _family_doc(d: object, src: str, field: str) -> Family:
    ok = isinstance(d, dict) and isinstance(d.get("x"), list) and isinstance(d.get("t_s"), list)
    xs, ts = (d.get("x"), d.get("t_s")) if ok else ([], [])
    nums = all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               and v > 0 for v in [*xs, *ts])
    if (not ok or not nums or len(xs) != len(ts) or len(xs) < MIN_POINTS
            or any(b <= a for a, b in zip(xs, xs[1:], strict=False))
            or any(b < a for a, b in zip(ts, ts[1:], strict=False))):
        raise InputError(src, field, f"{{'x': increasing sizes > 0, 't_s': non-decreasing "
                         f"times > 0}} of equal length >= {MIN_POINTS}", d)
    return Family(tuple(float(v) for v in xs), tuple(float(v) for v in ts))


def table_from_doc(doc: object, src: str) -> ShapeTable:
    """The ``shape_sweep`` section of a calibration file (:meth:`ShapeTable.to_doc`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gemm", []), list) \
            or not isinstance(doc.get("memory", []), list):
        raise InputError(src, "shape_sweep", "an object with 'gemm' and 'memory' lists", doc)
    gem = {}
    for i, g in enumerate(doc.get("gemm", [])):
        field = f"shape_sweep.gemm[{i}]"
        fixed = g.get("fixed") if isinstance(g, dict) else None
        if (not isinstance(g, dict) or g.get("axis") not in AXES or not isinstance(fixed, list)
                or len(fixed) != 2 or not all(isinstance(v, int) and v > 0 for v in fixed)):
            raise InputError(src, field, "{'axis': 'm', 'k' or 'n', 'fixed': [two dims > 0], "
                             "'x', 't_s'}", g)
        gem[(g["axis"], fixed[0], fixed[1])] = _family_doc(g, src, field)
    mem = {}
    for i, g in enumerate(doc.get("memory", [])):
        field = f"shape_sweep.memory[{i}]"
        if not isinstance(g, dict) or not isinstance(g.get("op"), str):
            raise InputError(src, field, "{'op': name, 'x', 't_s'}", g)
        mem[g["op"]] = _family_doc(g, src, field)
    return ShapeTable(gem, mem)


# --------------------------------------------------------------------- reading a sweep
