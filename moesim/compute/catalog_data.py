"""The kernel catalog's data: tables of published kernel throughput, read and checked.

Each YAML file under ``moesim/data/kernels/`` (or a user's file or folder named by
``compute.catalog``) holds ``tables:``, a list of mappings:

- ``id`` (unique), ``kind`` (a :class:`moesim.compute.base.Kernel` kind, or
  ``attn_fwdbwd`` for a forward + backward figure), ``dtype`` (``bf16``, ``fp8``,
  ``fp32`` or ``any``), ``passes`` (of ``fwd``, ``dgrad``, ``wgrad``, ``bwd``, ``""``),
  ``devices`` (catalog names), ``source`` (the citation: repository file and commit, or
  paper and figure/table);
- GEMM and attention tables: ``columns`` and ``rows`` (one list per row, in the order of
  ``columns``); GEMM columns from ``m`` or ``m_per_group``, ``groups``, ``n``, ``k``,
  ``tflops``, ``gbps``, ``speedup`` (a row published as another kernel's rate and its
  speedup over this one: the row's rate is ``tflops / speedup``); attention columns
  ``seq``, ``tflops`` with table-level
  ``head_dim`` and ``causal``; ``above_range``: ``hold`` or ``roofline`` (default);
- ``memory`` tables: ``gbps``; ``mla_decode`` tables: ``gbps`` and ``tflops``;
- ``memory_op`` tables (:mod:`moesim.compute.memory_kernels`): ``op``, ``impls`` and
  either ``gbps`` or ``columns: [rows, cols, ms]``, ``rows``, ``bytes_per_element``,
  ``bytes_per_row``;
- ``library`` (optional, GEMM and attention tables): the kernel library the rows
  measure. A scenario's ``compute.gemm_library`` picks the GEMM tables of one library,
  ``compute.attention_library`` the attention tables of one; tables without one are the
  default's (:mod:`moesim.compute.select`).

Anything malformed raises :class:`moesim.errors.InputError` naming the file and the
field (``tables[2].rows[3]``): one line, never a traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from moesim.compute.devices import DEVICES
from moesim.compute.memory_kernels import parse_table as parse_memory_table
from moesim.errors import InputError
from moesim.yamlio import read_yaml

GEMM_KINDS = ("gemm", "grouped_gemm", "kgrouped_gemm")
ATTN_KINDS = ("attn_fwd", "attn_bwd", "attn_fwdbwd")
RATE_KINDS = ("memory", "mla_decode")
#: achieved bandwidth of one memory-bound op by size and implementation
#: (:mod:`moesim.compute.memory_kernels`)
MEMORY_OP = "memory_op"
KINDS = GEMM_KINDS + ATTN_KINDS + RATE_KINDS + (MEMORY_OP,)
DTYPES = ("bf16", "fp8", "fp32", "any")
PASSES = ("fwd", "dgrad", "wgrad", "bwd", "")
GEMM_COLUMNS = ("m", "m_per_group", "groups", "n", "k", "tflops", "gbps", "speedup")
ATTN_COLUMNS = ("seq", "tflops")
_KEYS = {"id", "kind", "dtype", "passes", "devices", "source", "columns", "rows",
         "head_dim", "causal", "above_range", "gbps", "tflops", "library", "op", "impls",
         "bytes_per_element", "bytes_per_row"}


@dataclass(frozen=True, slots=True)
class Row:
    """One published measurement. GEMM: ``m`` tokens in all (``groups`` experts of
    ``m / groups`` each), weight dims ``n``, ``k``. Attention: ``seq``."""

    tflops: float
    m: int = 0
    n: int = 0
    k: int = 0
    groups: int = 1
    seq: int = 0

    @property
    def axis(self) -> float:
        """What the table interpolates along: tokens per group, or sequence length."""
        return self.seq if self.seq else self.m / self.groups


@dataclass(frozen=True, slots=True)
class Table:
    id: str
    kind: str
    dtype: str
    passes: tuple[str, ...]
    devices: tuple[str, ...]
    source: str
    file: str
    rows: tuple[Row, ...] = ()
    head_dim: int = 0
    causal: bool = False
    hold_above: bool = False
    gbps: float = 0.0
    tflops: float = 0.0
    library: str = ""          # GEMM tables: the kernel library measured ("" = the default)
    op: str = ""               # memory_op tables: the op, implementations, (bytes, GB/s)
    impls: tuple[str, ...] = ()
    points: tuple[tuple[float, float], ...] = ()

    def covers(self, device: str) -> bool:
        return device.lower() in (d.lower() for d in self.devices)


def _bad(file: str, field: str, expected: str, got: Any) -> InputError:
    return InputError(file, field, expected, got)


def _positive(v: Any, file: str, field: str, integer: bool = False) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    if ok and integer:
        ok = float(v).is_integer()
    if not ok:
        raise _bad(file, field, "a positive integer" if integer else "a positive number", v)
    return int(v) if integer else float(v)


def _str_list(d: dict, key: str, file: str, at: str, allowed: tuple[str, ...] | None) -> tuple:
    v = d.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise _bad(file, f"{at}.{key}", "a non-empty list of names", v)
    if allowed is not None:
        for x in v:
            if x not in allowed:
                raise _bad(file, f"{at}.{key}", f"names from {', '.join(map(repr, allowed))}", x)
    return tuple(v)


def _gemm_row(values: list, columns: tuple[str, ...], file: str, at: str) -> Row:
    d = {}
    for col, v in zip(columns, values, strict=True):
        d[col] = _positive(v, file, f"{at}.{col}",
                           integer=col not in ("tflops", "gbps", "speedup"))
    groups = d.get("groups", 1)
    m = d["m"] if "m" in d else d["m_per_group"] * groups
    return Row(tflops=d["tflops"] / d.get("speedup", 1.0), m=m, n=d["n"], k=d["k"],
               groups=groups)


def _rows(t: dict, file: str, at: str, kind: str) -> tuple[Row, ...]:
    cols = t.get("columns")
    allowed = GEMM_COLUMNS if kind in GEMM_KINDS else ATTN_COLUMNS
    if (not isinstance(cols, list) or not cols or len(set(cols)) != len(cols)
            or any(c not in allowed for c in cols)):
        raise _bad(file, f"{at}.columns", f"distinct names from {', '.join(allowed)}", cols)
    cols = tuple(cols)
    if kind in GEMM_KINDS:
        need = {"n", "k", "tflops"}
        if not need <= set(cols) or ("m" in cols) == ("m_per_group" in cols):
            raise _bad(file, f"{at}.columns", "n, k, tflops and one of m or m_per_group",
                       list(cols))
    elif set(cols) != set(ATTN_COLUMNS):
        raise _bad(file, f"{at}.columns", "seq and tflops", list(cols))
    rows = t.get("rows")
    if not isinstance(rows, list) or not rows:
        raise _bad(file, f"{at}.rows", "a non-empty list of rows", rows)
    out = []
    for i, r in enumerate(rows):
        where = f"{at}.rows[{i}]"
        if not isinstance(r, list) or len(r) != len(cols):
            raise _bad(file, where, f"a list of {len(cols)} numbers ({', '.join(cols)})", r)
        if kind in GEMM_KINDS:
            out.append(_gemm_row(r, cols, file, where))
        else:
            d = dict(zip(cols, r, strict=True))
            out.append(Row(tflops=_positive(d["tflops"], file, f"{where}.tflops"),
                           seq=_positive(d["seq"], file, f"{where}.seq", integer=True)))
    return tuple(out)


def _table(t: Any, file: str, at: str) -> Table:
    if not isinstance(t, dict):
        raise _bad(file, at, "a mapping (id, kind, dtype, passes, devices, source, ...)", t)
    extra = sorted(set(t) - _KEYS)
    if extra:
        raise _bad(file, f"{at}.{extra[0]}", f"one of {', '.join(sorted(_KEYS))}", extra[0])
    for key in ("id", "source"):
        if not isinstance(t.get(key), str) or not t[key].strip():
            raise _bad(file, f"{at}.{key}", "a non-empty string", t.get(key))
    kind = t.get("kind")
    if kind not in KINDS:
        raise _bad(file, f"{at}.kind", f"one of {', '.join(KINDS)}", kind)
    only = sorted(set(t) & {"op", "impls", "bytes_per_element", "bytes_per_row"})
    if only and kind != MEMORY_OP:
        raise _bad(file, f"{at}.{only[0]}", f"no {only[0]} on a {kind} table", t[only[0]])
    if t.get("dtype") not in DTYPES:
        raise _bad(file, f"{at}.dtype", f"one of {', '.join(DTYPES)}", t.get("dtype"))
    above = t.get("above_range", "roofline")
    if above not in ("hold", "roofline"):
        raise _bad(file, f"{at}.above_range", "hold or roofline", above)
    kw: dict[str, Any] = dict(
        id=t["id"], kind=kind, dtype=t["dtype"], source=" ".join(t["source"].split()),
        passes=_str_list(t, "passes", file, at, PASSES),
        devices=_str_list(t, "devices", file, at, tuple(DEVICES)), file=file,
        hold_above=above == "hold")
    lib = t.get("library", "")
    if lib != "" and (kind not in GEMM_KINDS + ATTN_KINDS or not isinstance(lib, str)
                      or not lib.strip()):
        raise _bad(file, f"{at}.library", "a library name, on a GEMM or attention table",
                   lib)
    kw["library"] = lib
    if kind == MEMORY_OP:
        return Table(**kw, **parse_memory_table(t, file, at))
    if kind in RATE_KINDS:
        kw["gbps"] = _positive(t.get("gbps"), file, f"{at}.gbps")
        if kind == "mla_decode":
            kw["tflops"] = _positive(t.get("tflops"), file, f"{at}.tflops")
        return Table(**kw)
    if kind in ATTN_KINDS:
        kw["head_dim"] = _positive(t.get("head_dim"), file, f"{at}.head_dim", integer=True)
        if not isinstance(t.get("causal"), bool):
            raise _bad(file, f"{at}.causal", "true or false", t.get("causal"))
        kw["causal"] = t["causal"]
    table = Table(rows=_rows(t, file, at, kind), **kw)
    check_monotone(table)
    return table


def families(table: Table) -> dict[tuple[int, int], list[Row]]:
    """A GEMM table's rows by weight shape (n, k); an attention table: one family."""
    out: dict[tuple[int, int], list[Row]] = {}
    for r in table.rows:
        out.setdefault((r.n, r.k), []).append(r)
    return out


def curve(rows: list[Row], groups: int) -> list[Row]:
    """The rows a kernel of ``groups`` experts is priced along, by axis: at each axis
    value the row whose group count is nearest ``groups`` (in ratio; ties: fewer)."""
    best: dict[float, Row] = {}
    for r in rows:
        cur = best.get(r.axis)
        key = (abs(math.log(r.groups / groups)), r.groups)
        if cur is None or key < (abs(math.log(cur.groups / groups)), cur.groups):
            best[r.axis] = r
    return [best[a] for a in sorted(best)]


def check_monotone(table: Table) -> None:
    """Every curve a kernel can be priced along must have time non-decreasing in FLOPs
    between rows: along a curve the rate may grow at most in proportion to the axis
    (tokens per group, or sequence length). Raises InputError naming the rows."""
    for rows in families(table).values():
        shapes = [(r.axis, r.groups) for r in rows]
        if len(set(shapes)) != len(shapes):
            raise _bad(table.file, f"{table.id}.rows", "one row per shape",
                       f"two rows at {max(shapes, key=shapes.count)}")
        for g in sorted({r.groups for r in rows}):
            pts = curve(rows, g)
            for a, b in zip(pts, pts[1:], strict=False):
                if b.tflops / a.tflops > b.axis / a.axis:
                    raise _bad(table.file, f"{table.id}.rows", "time non-decreasing between "
                               "rows (rate growing at most as fast as the shape)",
                               f"{a.tflops:g} -> {b.tflops:g} TFLOP/s over "
                               f"{a.axis:g} -> {b.axis:g}")


def load_file(path: str | Path) -> list[Table]:
    file = str(path)
    data = read_yaml(path, "a mapping with tables: [...]")
    extra = sorted(set(data) - {"tables"})
    if extra:
        raise _bad(file, extra[0], "only tables", extra[0])
    tables = data.get("tables")
    if not isinstance(tables, list) or not tables:
        raise _bad(file, "tables", "a non-empty list of tables", tables)
    return [_table(t, file, f"tables[{i}]") for i, t in enumerate(tables)]


def load_catalog(path: str | Path | None = None) -> tuple[Table, ...]:
    """Every table of ``path`` (a YAML file, or a folder of them); the shipped catalog
    (``moesim/data/kernels``) when None. Table ids must be unique."""
    if path is None:
        root = resources.files("moesim") / "data" / "kernels"
        files = sorted((p for p in root.iterdir() if p.name.endswith((".yaml", ".yml"))),
                       key=lambda p: p.name)
    else:
        p = Path(path)
        if not p.exists():
            raise InputError(str(p), "", "a kernel catalog (a YAML file or a folder of them)",
                             "no such file")
        files = sorted(p.glob("*.y*ml")) if p.is_dir() else [p]
        if not files:
            raise InputError(str(p), "", "a folder holding *.yaml kernel tables", "none")
    out: list[Table] = []
    seen: dict[str, str] = {}
    for f in files:
        for t in load_file(Path(str(f))):
            if t.id in seen:
                raise InputError(t.file, f"{t.id}.id", "a table id used once", f"also in "
                                 f"{seen[t.id]}")
            seen[t.id] = t.file
            out.append(t)
    return tuple(out)
