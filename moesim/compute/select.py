"""The scenario's ``compute`` section → the compute model a run uses.

``compute.kind`` says what prices the kernels:

- ``catalog`` (the default, also when the section is left out): the kernel catalog
  (:mod:`moesim.compute.catalog`) where it covers the device (H100, H800, A100 as
  shipped; H200 and H200-NVL for memory-bound kernels), the roofline for every kernel it
  does not cover and on every other device (CPU);
- ``roofline``: the same section under its older name (the roofline's parameters);
- ``calibration``: every kernel priced from recorded traces (``file``); no ``model`` or
  ``catalog``.

Under ``catalog`` or ``roofline``, ``model`` chooses: ``catalog`` (default) as above, or
``roofline`` for the roofline alone (:mod:`moesim.compute.roofline`), e.g. the what-if
``--set compute.model=roofline``.

The roofline's own fields (``precision``, ``mfu_large``, ...) set the fallback under
``catalog`` too. ``compute.gemm_library: NAME`` prices GEMMs by the tables of that kernel
library (a table's ``library``; shipped: ``dpsk-cutlass``, DeepSeek's in-house CUTLASS
kernels of its public training profile) instead of the default tables (DeepGEMM).
``compute.attention_library: cudnn`` prices attention by Transformer Engine's fused
(cuDNN) attention tables, the backend Transformer Engine prefers on Hopper, instead of
FlashAttention's (the default). ``compute.catalog: PATH`` replaces the shipped tables with a YAML file or a folder of
them (relative to the scenario file, else to the working folder), in the format of
``moesim/data/kernels``. :func:`describe` says in words what a section asked for; the
step summary's ``kernel_pricing`` echoes it with what priced each kernel.

``compute.weights`` (``bf16`` | ``fp8`` | ``fp8-block`` | ``mxfp8`` | ``nvfp4`` | ``int8`` |
``int4``), ``compute.activations`` (the weights' partner by default; ``int8`` weights take
``bf16`` or ``int8``) and ``compute.sparsity`` (``none`` | ``2:4``), all off by default,
price the forward weight GEMMs of a quantised or 2:4-sparse checkpoint
(:mod:`moesim.compute.quant`, :mod:`moesim.compute.sparsity`,
:class:`moesim.compute.quant_model.QuantModel`); a mode the device cannot run is one
line, exit 2.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moesim.compute import quant
from moesim.compute import sparsity as sparse
from moesim.compute.base import ComputeModel
from moesim.compute.catalog import CatalogModel
from moesim.compute.catalog_data import ATTN_KINDS, GEMM_KINDS, load_catalog
from moesim.compute.devices import DeviceSpec
from moesim.compute.memory_kernels import DEFAULT_IMPL as DEFAULT_MEMORY
from moesim.compute.memory_kernels import FUSIONS
from moesim.compute.memory_kernels import IMPLS as MEMORY_IMPLS
from moesim.compute.quant_model import QuantModel
from moesim.compute.roofline import _ROOFLINE_KEYS, MFU_LARGE, PRECISIONS, RooflineModel
from moesim.compute.roofline import _number as _roofline_number
from moesim.compute.roofline import compute_model_from_dict as _roofline_dict
from moesim.errors import InputError

MODELS = ("catalog", "roofline")
DEFAULT_MODEL = "catalog"
#: ``compute.kind``: the default first
KINDS = ("catalog", "roofline", "calibration")
DEFAULT_KIND = "catalog"


#: ``compute.expert_launches``: ``per_expert`` (default) launches each routed expert's
#: kernels on their own, as Transformer Engine's GroupedLinear does for Megatron-Core
#: (one GEMM per local expert, on several streams: Megatron-LM MoE README,
#: ``--moe-grouped-gemm``); ``grouped`` runs all of a rank's experts in one launch per
#: kernel, as vLLM's fused MoE (vllm/model_executor/layers/fused_moe/fused_moe.py: one
#: ``fused_moe_kernel`` per expert GEMM for every expert) and DeepGEMM's grouped GEMMs do;
#: serving steps use ``grouped`` unless the scenario says otherwise
EXPERT_LAUNCHES = ("per_expert", "grouped")

#: ``compute.fp8_wgrad``: how an FP8 dense weight-gradient GEMM is priced by a catalog.
#: ``deepgemm`` (default): DeepGEMM's block-scaled wgrad tables (DeepSeek-V3's recipe);
#: ``cublas``: at its forward twin's rate (the same m x n x k from the forward tables), as
#: cuBLAS runs Transformer Engine's per-tensor-scaled FP8 GEMMs: TransformerEngine
#: docs/examples/gemm_profiling/gemm_profiling.rst (1609c890e), one layer's four FP8
#: current-scaling GEMMs on H200 NVL, Fprop 5.577 ms, Wgrad 5.547 ms
FP8_WGRAD = ("deepgemm", "cublas")

#: ``compute.fp8_recipe``: which FP8 training recipe's quantisation kernels surround the
#: FP8 GEMMs (Megatron-LM's ``--fp8-recipe`` names). ``blockwise`` (default): DeepSeek-V3's
#: 1x128 / 128x128 scaling as its public profile launches it (casts fused into the
#: dispatch and the SwiGLU); ``tensorwise``: Transformer Engine's per-tensor current
#: scaling (Float8CurrentScaling), an amax pass, a scale kernel and a cast-transpose per
#: quantised tensor (moesim.model.kernels.tensorwise)
FP8_RECIPES = ("blockwise", "tensorwise")


@dataclass(frozen=True)
class ComputeSection:
    """The ``compute`` section, checked when the scenario is read (:func:`parse`); what
    needs the device (an fp8 peak) or files (a catalog's libraries, a calibration) is
    checked by :func:`compute_model`. A new key: a field here and a row of
    :data:`FIELDS`."""

    kind: str = DEFAULT_KIND              # catalog | roofline | calibration
    model: str = DEFAULT_MODEL            # catalog | roofline (kind catalog or roofline)
    catalog: str | None = None            # a kernel catalog file or folder (model: catalog)
    gemm_library: str = ""                # GEMM tables of that library ("": the default)
    attention_library: str = ""           # attention tables of that library ("": FlashAttention)
    expert_launches: str = "per_expert"   # per_expert | grouped (EXPERT_LAUNCHES)
    memory_kernels: str = DEFAULT_MEMORY  # stream | eager | fused | liger (memory_kernels.IMPLS)
    fp8_wgrad: str = "deepgemm"           # deepgemm | cublas (FP8_WGRAD)
    fp8_recipe: str = "blockwise"         # blockwise | tensorwise (FP8_RECIPES)
    # fused kernel pairs (memory_kernels.FUSIONS; moesim.model.kernels.fusion), written as
    # a list or as names joined by commas; () = none
    fusion: tuple[str, ...] = ()
    file: str | None = None               # kind: calibration: the calibration file
    # the roofline's parameters (moesim.compute.roofline; None: its default)
    precision: str | None = None
    mfu_large: float | None = None
    min_efficiency: float | None = None
    half_efficiency_tokens: float | None = None
    hbm_efficiency: float | None = None
    launch_overhead_us: float | None = None
    # a quantised / 2:4-sparse checkpoint (moesim.compute.quant; None / "none": off)
    weights: str | None = None            # bf16 | fp8 | fp8-block | mxfp8 | nvfp4 | int8 | int4
    activations: str | None = None        # the weights' partner (quant.MODES)
    sparsity: str = "none"                # none | 2:4
    #: the section as written (Scenario.to_dict's echo; not a key)
    written: dict = field(default_factory=dict, compare=False, repr=False)

    def as_dict(self) -> dict:
        """The section as written (keys given, in order)."""
        return copy.deepcopy(self.written)

    def with_default(self, key: str, value: Any, source: str) -> ComputeSection:
        """The section with ``key: value`` where it does not set ``key`` itself."""
        return parse({key: value, **self.as_dict()}, source)

    @property
    def grouped(self) -> bool:
        return self.expert_launches == "grouped"

    @property
    def quant(self) -> quant.QuantMode:
        """The checked (weights, activations) mode (bf16: off)."""
        return quant.mode_of(self.weights, self.activations, "<compute>")


def _choice(allowed: tuple[str, ...]) -> Any:
    def check(d: dict, key: str, source: str) -> None:
        if d[key] not in allowed:
            raise InputError(source, f"compute.{key}", " or ".join(allowed), d[key])
    return check


#: keys naming a library, where "" (the default tables) is a valid value
_LIBRARIES = ("gemm_library", "attention_library")


def _name(expected: str) -> Any:
    def check(d: dict, key: str, source: str) -> None:
        if key == "catalog" and d[key] is None:
            return
        if key in _LIBRARIES and d[key] is None:   # --set compute.KEY= : the default
            d[key] = ""
            return
        if not isinstance(d[key], str) or (key not in _LIBRARIES and not d[key]):
            raise InputError(source, f"compute.{key}", expected, d[key])
    return check


def _fraction(d: dict, key: str, source: str) -> None:
    _roofline_number(d, key, source, 0, 1, True)


def _nonneg(d: dict, key: str, source: str) -> None:
    _roofline_number(d, key, source, 0, float("inf"), False)


def _min_efficiency(d: dict, key: str, source: str) -> None:
    _roofline_number(d, key, source, 0, float(d.get("mfu_large", MFU_LARGE)), True)


def _fusion(d: dict, key: str, source: str) -> None:
    """``compute.fusion``: a list of fusion names or one string of them joined by commas
    (``--set compute.fusion=norm_cast,residual_norm``); stored as a tuple."""
    v = d[key]
    names = [n.strip() for n in v.split(",") if n.strip()] if isinstance(v, str) else v
    if (not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names)
            or any(n not in FUSIONS for n in names)):
        raise InputError(source, "compute.fusion", f"a list of {', '.join(FUSIONS)}", v)
    d[key] = tuple(dict.fromkeys(names))


def _precision(d: dict, key: str, source: str) -> None:
    if d[key] not in PRECISIONS:
        raise InputError(source, "compute.precision", _ROOFLINE_KEYS["precision"], d[key])


#: the section's keys -> their check ``(section, key, source)``, in the order a section
#: is checked; a key of the roofline's is one of the roofline's (moesim.compute.roofline)
FIELDS: dict[str, Any] = {
    "expert_launches": lambda d, k, s: _launches(d[k], s),
    "kind": _choice(KINDS),
    "model": _choice(MODELS),
    "catalog": _name("a path to a kernel catalog YAML file or folder"),
    "gemm_library": _name("a library name"),
    "attention_library": _name("a library name"),
    "memory_kernels": _choice(MEMORY_IMPLS),
    "fp8_wgrad": _choice(FP8_WGRAD),
    "fp8_recipe": _choice(FP8_RECIPES),
    "fusion": _fusion,
    "file": _name("a path to a calibration file"),
    "mfu_large": _fraction, "min_efficiency": _min_efficiency,
    "half_efficiency_tokens": _nonneg, "hbm_efficiency": _fraction,
    "launch_overhead_us": _nonneg, "precision": _precision,
    "weights": lambda d, k, s: _quant(d, s),
    "activations": lambda d, k, s: _quant(d, s),
    "sparsity": lambda d, k, s: d.__setitem__(k, sparse.check(d[k], s)),
}
_CATALOG_KEYS = ("model", "catalog", "gemm_library", "attention_library", "memory_kernels",
                 "fp8_wgrad")
#: the quantisation and sparsity keys (moesim.compute.quant): any kind but calibration
QUANT_KEYS = ("weights", "activations", "sparsity")


def _quant(d: dict, source: str) -> None:
    quant.mode_of(d.get("weights"), d.get("activations"), source)


def _launches(v: Any, source: str) -> None:
    if v not in EXPERT_LAUNCHES:
        raise InputError(source, "compute.expert_launches", " or ".join(EXPERT_LAUNCHES), v)


def parse(d: Any, source: str) -> ComputeSection:
    """Check a ``compute`` mapping as far as it goes without the device; every problem is
    one :class:`InputError` (the same line :func:`compute_model` gives)."""
    if isinstance(d, ComputeSection):
        return d
    d = {} if d is None else d
    if not isinstance(d, Mapping):
        raise InputError(source, "compute", "a mapping (kind, model, precision, ...)", d)
    d = dict(d)
    written = copy.deepcopy(dict(d))
    for key in ("expert_launches", "kind", "fusion"):
        if key in d:
            FIELDS[key](d, key, source)
    kind = d.get("kind", DEFAULT_KIND)
    if kind == "calibration":
        given = sorted(set(d) & set(_CATALOG_KEYS))
        if given:
            raise InputError(source, f"compute.{given[0]}", "no model or catalog with kind: "
                             "calibration (the calibration prices every kernel)", d[given[0]])
        extra = sorted(set(d) - {"kind", "file", "expert_launches", "fusion"})
        if extra and extra[0] in QUANT_KEYS:
            raise InputError(source, f"compute.{extra[0]}", "no quantisation or sparsity "
                             "with kind: calibration (it prices the kernels it recorded)",
                             d[extra[0]])
        if extra:
            raise InputError(source, f"compute.{extra[0]}", "only kind and file for "
                             "calibration", extra[0])
        FIELDS["file"]({"file": d.get("file")}, "file", source)
    else:
        for key in ("model", "catalog"):
            if key in d:
                FIELDS[key](d, key, source)
        if d.get("catalog") is not None and d.get("model", DEFAULT_MODEL) != "catalog":
            raise InputError(source, "compute.catalog", "no catalog with model: roofline",
                             d["catalog"])
        for key in ("gemm_library", "attention_library", "memory_kernels", "fp8_wgrad",
                    "fp8_recipe"):
            if key in d:
                FIELDS[key](d, key, source)
        for key in d:
            if key not in (*_CATALOG_KEYS, "kind", "expert_launches", "fusion", "fp8_recipe",
                           *_ROOFLINE_KEYS, *QUANT_KEYS):
                raise InputError(source, f"compute.{key}",
                                 f"one of kind, {', '.join(_ROOFLINE_KEYS)}", key)
        for key in _ROOFLINE_KEYS:
            if key in d:
                FIELDS[key](d, key, source)
        for key in QUANT_KEYS:
            if key in d:
                FIELDS[key](d, key, source)
    return ComputeSection(**d, written=written)


def describe(d: Any) -> str:
    """What a (checked) ``compute`` section asks for, in words."""
    d = d.as_dict() if isinstance(d, ComputeSection) else d
    d = {} if not isinstance(d, Mapping) else d
    kind = d.get("kind", DEFAULT_KIND)
    if kind == "calibration":
        return f"calibration ({d.get('file')})"
    if d.get("model", DEFAULT_MODEL) == "roofline":
        return "roofline only"
    lib, attn = d.get("gemm_library"), d.get("attention_library")
    src = f"catalog {d['catalog']}" if d.get("catalog") else "kernel catalog"
    return (src + (f", {lib} GEMMs" if lib else "") + (f", {attn} attention" if attn else "")
            + ", roofline where it has no row"
            + _describe_quant(d))


def _describe_quant(d: Mapping) -> str:
    """The quantisation / sparsity of a section in words ("" when off)."""
    words = []
    if d.get("weights") is not None:
        m = quant.mode_of(d.get("weights"), d.get("activations"), "<compute>")
        words.append(f"{m.weights} weights, {m.activations} activations")
    sparsity = sparse.check(d.get("sparsity", "none"), "<compute>")
    if sparsity != "none":
        words.append(f"{sparsity} sparse weights")
    return "; " + ", ".join(words) if words else ""


def compute_model(d: Any, source: str, device: DeviceSpec) -> ComputeModel:
    """The compute model for a scenario's ``compute`` section (or mapping) ``d`` on
    ``device``."""
    d = d.as_dict() if isinstance(d, ComputeSection) else {} if d is None else d
    if not isinstance(d, dict):
        raise InputError(source, "compute", "a mapping (kind, model, precision, ...)", d)
    launches = d.get("expert_launches", "per_expert")
    if launches not in EXPERT_LAUNCHES:
        raise InputError(source, "compute.expert_launches", " or ".join(EXPERT_LAUNCHES),
                         launches)
    model = _compute_model({k: v for k, v in d.items()
                            if k not in ("expert_launches", "fusion", "fp8_recipe", *QUANT_KEYS)},
                           source, device)
    return _quantised(model, d, source, device)


def _quantised(model: ComputeModel, d: Mapping, source: str,
               device: DeviceSpec) -> ComputeModel:
    """``model`` wrapped for a quantised / sparse checkpoint when the section asks."""
    if not any(k in d for k in QUANT_KEYS):
        return model
    if d.get("kind") == "calibration":
        key = next(k for k in QUANT_KEYS if k in d)
        raise InputError(source, f"compute.{key}", "no quantisation or sparsity with kind: "
                         "calibration (it prices the kernels it recorded)", d[key])
    mode = quant.mode_of(d.get("weights"), d.get("activations"), source)
    sparsity = sparse.check(d.get("sparsity", "none"), source)
    quant.check_device(mode, device, source)
    sparse.check_device(sparsity, device, source)
    if not mode.on and sparsity == "none":
        return model
    return QuantModel(model, mode, sparsity)


def grouped_experts(compute: Any) -> bool:
    """Whether a scenario's ``compute`` section (or a checked mapping) runs a rank's
    routed experts in one launch per kernel (``expert_launches: grouped``)."""
    if isinstance(compute, ComputeSection):
        return compute.grouped
    return isinstance(compute, Mapping) and compute.get("expert_launches") == "grouped"



def _compute_model(d: dict, source: str, device: DeviceSpec) -> ComputeModel:
    kind = d.get("kind", DEFAULT_KIND)
    if kind not in KINDS:
        raise InputError(source, "compute.kind", " or ".join(KINDS), kind)
    if kind == "catalog":   # the roofline's fields set the fallback; model: roofline
        d = {**d, "kind": "roofline"}   # (a what-if: --set compute.model=roofline) drops it
    rest = {k: v for k, v in d.items() if k not in _CATALOG_KEYS}
    if d.get("kind") == "calibration":
        given = sorted(set(d) & set(_CATALOG_KEYS))
        if given:
            raise InputError(source, f"compute.{given[0]}", "no model or catalog with kind: "
                             "calibration (the calibration prices every kernel)", d[given[0]])
        return _roofline_dict(rest, source, device)
    which = d.get("model", DEFAULT_MODEL)
    if which not in MODELS:
        raise InputError(source, "compute.model", " or ".join(MODELS), which)
    path = d.get("catalog")
    if path is not None and (not isinstance(path, str) or not path):
        raise InputError(source, "compute.catalog", "a path to a kernel catalog YAML file "
                         "or folder", path)
    if path is not None and which != "catalog":
        raise InputError(source, "compute.catalog", "no catalog with model: roofline", path)
    lib = "" if d.get("gemm_library") is None else d["gemm_library"]   # model: roofline
    # ignores it (a catalog choice)
    if not isinstance(lib, str):
        raise InputError(source, "compute.gemm_library", "a library name", lib)
    roofline = _roofline_dict(rest, source, device)
    if which == "roofline" or not isinstance(roofline, RooflineModel):
        return roofline
    if path is not None:
        p = Path(path)
        if not p.is_absolute() and Path(source).is_file() and (Path(source).parent / p).exists():
            p = Path(source).parent / p     # relative to the scenario file, else to the cwd
        tables = load_catalog(p)
    else:
        tables = shipped_catalog()
    for key, kinds in (("gemm_library", GEMM_KINDS), ("attention_library", ATTN_KINDS)):
        want = "" if d.get(key) is None else d[key]
        if not isinstance(want, str):
            raise InputError(source, f"compute.{key}", "a library name", want)
        known = sorted({t.library for t in tables if t.library and t.kind in kinds})
        if want != "" and want not in known:
            raise InputError(source, f"compute.{key}", f"a library of the catalog's "
                             f"{'GEMM' if kinds is GEMM_KINDS else 'attention'} tables "
                             f"({', '.join(known) or 'none'})", want)
    mem = d.get("memory_kernels", DEFAULT_MEMORY)
    if mem not in MEMORY_IMPLS:
        raise InputError(source, "compute.memory_kernels", " or ".join(MEMORY_IMPLS), mem)
    wgrad = d.get("fp8_wgrad", FP8_WGRAD[0])
    if wgrad not in FP8_WGRAD:
        raise InputError(source, "compute.fp8_wgrad", " or ".join(FP8_WGRAD), wgrad)
    model = CatalogModel(roofline, tables, gemm_library=lib, memory_kernels=mem,
                         attention_library="" if d.get("attention_library") is None
                         else d["attention_library"], fp8_wgrad=wgrad)
    return model if model.tables else roofline


_SHIPPED: list = []


def shipped_catalog():
    """The tables shipped in ``moesim/data/kernels`` (read once per process)."""
    if not _SHIPPED:
        _SHIPPED.append(load_catalog())
    return _SHIPPED[0]
