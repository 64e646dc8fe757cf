"""Kernel kinds and their pricing: the one registry the kernel catalog looks up.

A :class:`~moesim.compute.base.Kernel`'s ``kind`` names its family. The catalog
(:class:`moesim.compute.catalog.CatalogModel`) prices a kernel by the pricer registered
here for its kind; a kernel whose kind is "" or not registered, or that its pricer does
not cover, is priced by the roofline (:mod:`moesim.compute.roofline`), which the summary
says (``kernel_pricing``).

A pricer is ``price(model, kernel) -> (seconds, detail) | str``:

- ``model``: the :class:`~moesim.compute.catalog.CatalogModel` asking: ``model.device``,
  ``model.tables_for(kernel)`` (its published tables of the kernel's dtype),
  ``model.where(kernel)`` (the words for "no table for this");
- ``seconds``: the kernel's work over all its ``count`` launches, launch overhead
  excluded (the catalog adds ``count`` × the device's cost per launch, as the roofline
  does); ``detail``: what priced it, in words;
- a string instead of the pair: why this kernel is not covered; the roofline prices it.

Built in (:mod:`moesim.compute.catalog_pricing`): ``gemm``, ``grouped_gemm``,
``kgrouped_gemm`` (GEMM tables), ``attn_fwd``, ``attn_bwd`` (attention tables),
``memory``, ``mla_decode`` (bandwidth and compute ceilings; ``memory`` by op and size
under ``compute.memory_kernels``, :mod:`moesim.compute.memory_kernels`).

Adding a kind: give the kernel its ``kind`` where the layer's kernels are written
(``moesim/program/recipe.py``) and register its pricer once, here or at import of the
module that defines it::

    register_kind("my_kernel", my_price)

In a test (the registry is the same after the block as before it)::

    with registered_kind("toy", fixed_price(2e-6)):      # 2 µs per launch
        ...
    with registered_kind("toy", memory_bound(1000.0)):   # bytes at 1000 GB/s
        ...

or ``register_kind(...)`` in a fixture and ``unregister_kind("toy")`` after it. The
catalog only prices on devices it has tables for (H100, H800, A100; H200 and H200-NVL
for memory-bound kernels) and under ``compute.model: catalog`` (the default); elsewhere
(CPU) the roofline prices every kernel, a registered kind's included.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from moesim.compute import catalog_pricing, memory_kernels
from moesim.compute.base import Kernel
from moesim.errors import InputError

#: price(model, kernel) -> (seconds of work, detail) | why not covered
Pricer = Callable[[Any, Kernel], "tuple[float, str] | str"]


@dataclass(frozen=True)
class KernelKind:
    """A kernel kind: its name (``Kernel.kind``), its pricer, one line saying what it
    is."""

    name: str
    price: Pricer
    doc: str = ""


_KINDS: dict[str, KernelKind] = {}
#: catalog models whose remembered prices a change of the registry makes stale
_WATCHERS: weakref.WeakSet = weakref.WeakSet()


def register_kind(name: str, price: Pricer, doc: str = "") -> KernelKind:
    """Register ``price`` for kernels of kind ``name``; a name registered twice is a
    ValueError (unregister it first)."""
    if not isinstance(name, str) or not name:
        raise ValueError("a kernel kind is a non-empty string")
    if name in _KINDS:
        raise ValueError(f"kernel kind {name!r} is already registered")
    kind = _KINDS[name] = KernelKind(name, price, doc)
    _changed()
    return kind


def unregister_kind(name: str) -> None:
    """Forget kind ``name`` (kernels of that kind go back to the roofline)."""
    if _KINDS.pop(name, None) is None:
        raise KeyError(f"kernel kind {name!r} is not registered (registered: "
                       f"{', '.join(_KINDS)})")
    _changed()


@contextmanager
def registered_kind(name: str, price: Pricer, doc: str = "") -> Iterator[KernelKind]:
    """``register_kind`` for the duration of a ``with`` block."""
    kind = register_kind(name, price, doc)
    try:
        yield kind
    finally:
        unregister_kind(name)


def get_kind(name: str) -> KernelKind | None:
    """The registered kind ``name``, None if there is none."""
    return _KINDS.get(name)


def names() -> tuple[str, ...]:
    """Registered kind names, in registration order (the built-in ones first)."""
    return tuple(_KINDS)


def require_kind(name: str, source: str, field: str = "kind") -> KernelKind:
    """The registered kind ``name`` a user wrote in ``source`` at ``field``; else an
    InputError naming the field and the registered kinds."""
    kind = _KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise InputError(source, field, "a kernel kind: one of " + ", ".join(_KINDS), name)
    return kind


def watch(model: Any) -> None:
    """Call ``model.forget()`` whenever the registry changes (a catalog model's
    remembered prices, :class:`moesim.compute.catalog.CatalogModel`)."""
    _WATCHERS.add(model)


def _changed() -> None:
    for model in list(_WATCHERS):
        model.forget()


# ------------------------------------------------------- pricers for made-up kinds
def fixed_price(seconds_per_launch: float) -> Pricer:
    """A pricer giving every kernel ``count`` × ``seconds_per_launch`` of work."""
    def price(model: Any, kernel: Kernel) -> tuple[float, str]:
        return max(kernel.count, 1) * seconds_per_launch, f"fixed {seconds_per_launch:g} s"
    return price


def memory_bound(gbps: float) -> Pricer:
    """A pricer moving the kernel's ``bytes`` at ``gbps`` GB/s (1e9 bytes per second)."""
    def price(model: Any, kernel: Kernel) -> tuple[float, str]:
        return kernel.bytes / (gbps * 1e9), f"{gbps:g} GB/s"
    return price


# ------------------------------------------------------------------- built in
for _name in ("gemm", "grouped_gemm", "kgrouped_gemm"):
    register_kind(_name, catalog_pricing.gemm, "GEMM at its published rate by shape")
for _name in ("attn_fwd", "attn_bwd"):
    register_kind(_name, catalog_pricing.attention,
                  "flash attention at its published rate by seq and head dim")
def _memory(model: Any, kernel: Kernel) -> tuple[float, str] | str:
    """``memory``: the published rate by op, size and ``compute.memory_kernels``
    (:mod:`moesim.compute.memory_kernels`), else the streaming bandwidth."""
    return memory_kernels.price(model, kernel, catalog_pricing.rate)


register_kind("memory", _memory, "bandwidth-bound: bytes / published GB/s (by op and size "
              "under compute.memory_kernels)")
register_kind("mla_decode", catalog_pricing.rate,
              "MLA decode: the slower of published bandwidth and compute ceilings")
