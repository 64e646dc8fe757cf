"""Kernel catalog compute model: each kernel at the rate its own authors measured.

A :class:`CatalogModel` prices a :class:`~moesim.compute.base.Kernel` by the pricer
registered for its ``kind`` (:mod:`moesim.compute.kinds`); the built-in ones read the
published table for the device, kind, dtype and pass (``moesim/data/kernels/*.yaml``, read
by :mod:`moesim.compute.catalog_data`; docs/kernels.md "Catalog"; how each family is
priced: :mod:`moesim.compute.catalog_pricing`).

Every catalog time adds ``count`` × the device's launch overhead, as the roofline does,
so switching models changes only the kernels' rates. Anything the catalog does not cover
(``kind`` "" or not registered, a dtype or device without a table, a shape below the
smallest row, or above the largest where the table does not hold its rate) is priced by
the roofline and says so (:meth:`CatalogModel.price`, :func:`coverage`).
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.compute import kinds
from moesim.compute.base import Kernel
from moesim.compute.catalog_data import ATTN_KINDS, GEMM_KINDS, Table
from moesim.compute.roofline import HIGH_PRECISION_KERNELS, RooflineModel

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


class CatalogModel:
    """A :class:`~moesim.compute.base.ComputeModel` from published kernel tables, the
    roofline for what they do not cover."""

    def __init__(self, roofline: RooflineModel, tables: tuple[Table, ...],
                 gemm_library: str = "", memory_kernels: str = "stream",
                 attention_library: str = "", fp8_wgrad: str = "deepgemm") -> None:
        self.roofline = roofline
        self.device = roofline.device
        self.precision = roofline.precision
        self.launch_overhead_s = roofline.launch_overhead_s
        self.graph_kernel_s = roofline.graph_kernel_s
        dev = self.device.name
        #: GEMMs are priced by the tables of this library only ("" = tables without one)
        self.gemm_library = gemm_library
        #: attention by the tables of this library only ("" = FlashAttention's tables;
        #: "cudnn": Transformer Engine's fused attention, moesim/data/kernels/cudnn_attention.yaml)
        self.attention_library = attention_library
        self.tables = tuple(t for t in tables if t.covers(dev)
                            and (t.kind not in GEMM_KINDS or t.library == gemm_library)
                            and (t.kind not in ATTN_KINDS or t.library == attention_library))
        lib = f",{gemm_library}" if gemm_library else ""
        lib += f",attn={attention_library}" if attention_library else ""
        #: memory-bound kernels: "stream" (the device's streaming bandwidth) or the
        #: implementation whose published rates by size price them
        #: (:mod:`moesim.compute.memory_kernels`)
        self.memory_kernels = memory_kernels
        mem = "" if memory_kernels == "stream" else f",memory={memory_kernels}"
        #: FP8 dense wgrad GEMMs: "deepgemm" (its wgrad tables) or "cublas" (at the forward
        #: twin's rate; moesim.compute.select.FP8_WGRAD)
        self.fp8_wgrad = fp8_wgrad
        wg = "" if fp8_wgrad == "deepgemm" else f",wgrad={fp8_wgrad}"
        self.name = f"catalog({dev},{self.precision}{lib}{mem}{wg})"
        #: pricing calls so far: source -> [kernels, seconds] (see :func:`coverage`)
        self.tally: dict[str, list[float]] = {"catalog": [0, 0.0], "roofline": [0, 0.0]}
        self._memo: dict[Kernel, Priced] = {}    # identical kernels price identically
        kinds.watch(self)      # a kind (un)registered makes remembered prices stale

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
        entry = kinds.get_kind(kind)
        if entry is None:
            return self._fallback(kernel, f"kind {kind!r} not in the catalog")
        got = entry.price(self, kernel)
        if isinstance(got, str):
            return self._fallback(kernel, got)
        seconds, detail = got
        n = max(kernel.count, 1)
        return Priced(n * self.roofline.per_launch_s(kernel) + seconds, "catalog", detail)

    def forget(self) -> None:
        """Drop the remembered prices (the registry of kinds changed)."""
        self._memo.clear()

    def tables_for(self, kernel: Kernel) -> list[Table]:
        """This catalog's tables of the kernel's dtype (or of any dtype), for a pricer."""
        dtype = self.dtype_of(kernel)
        return [t for t in self.tables if t.dtype in (dtype, "any")]

    def where(self, kernel: Kernel, dtype_note: str = "") -> str:
        """Why no table prices ``kernel``: none for its device, dtype, kind and pass."""
        return (f"no {self.device.name} {self.dtype_of(kernel)} {kernel.kind}"
                f"{' ' + kernel.pass_ if kernel.pass_ else ''} table{dtype_note}")


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

