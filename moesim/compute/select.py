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
``compute.catalog: PATH`` replaces the shipped tables with a YAML file or a folder of
them (relative to the scenario file, else to the working folder), in the format of
``moesim/data/kernels``. :func:`describe` says in words what a section asked for; the
step summary's ``kernel_pricing`` echoes it with what priced each kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from moesim.compute.base import ComputeModel
from moesim.compute.catalog import CatalogModel
from moesim.compute.catalog_data import load_catalog
from moesim.compute.devices import DeviceSpec
from moesim.compute.roofline import RooflineModel
from moesim.compute.roofline import compute_model_from_dict as _roofline_dict
from moesim.errors import InputError

MODELS = ("catalog", "roofline")
DEFAULT_MODEL = "catalog"
#: ``compute.kind``: the default first
KINDS = ("catalog", "roofline", "calibration")
DEFAULT_KIND = "catalog"


def describe(d: Any) -> str:
    """What a (checked) ``compute`` section asks for, in words."""
    d = {} if not isinstance(d, Mapping) else d
    kind = d.get("kind", DEFAULT_KIND)
    if kind == "calibration":
        return f"calibration ({d.get('file')})"
    if d.get("model", DEFAULT_MODEL) == "roofline":
        return "roofline only"
    lib = d.get("gemm_library")
    src = f"catalog {d['catalog']}" if d.get("catalog") else "kernel catalog"
    return src + (f", {lib} GEMMs" if lib else "") + ", roofline where it has no row"


def compute_model(d: Any, source: str, device: DeviceSpec) -> ComputeModel:
    """The compute model for a scenario's ``compute`` mapping ``d`` on ``device``."""
    d = {} if d is None else d
    if not isinstance(d, dict):
        raise InputError(source, "compute", "a mapping (kind, model, precision, ...)", d)
    launches = d.get("expert_launches", "per_expert")
    if launches not in EXPERT_LAUNCHES:
        raise InputError(source, "compute.expert_launches", " or ".join(EXPERT_LAUNCHES),
                         launches)
    return _compute_model({k: v for k, v in d.items() if k != "expert_launches"}, source,
                          device)


def grouped_experts(compute: Any) -> bool:
    """Whether a scenario's ``compute`` mapping (checked by :func:`compute_model`) runs a
    rank's routed experts in one launch per kernel (``expert_launches: grouped``)."""
    return isinstance(compute, Mapping) and compute.get("expert_launches") == "grouped"


#: ``compute.expert_launches``: ``per_expert`` (default) launches each routed expert's
#: kernels on their own, as Transformer Engine's GroupedLinear does for Megatron-Core
#: (one GEMM per local expert, on several streams: Megatron-LM MoE README,
#: ``--moe-grouped-gemm``); ``grouped`` runs all of a rank's experts in one launch per
#: kernel, as vLLM's fused MoE (vllm/model_executor/layers/fused_moe/fused_moe.py: one
#: ``fused_moe_kernel`` per expert GEMM for every expert) and DeepGEMM's grouped GEMMs do;
#: serving steps use ``grouped`` unless the scenario says otherwise
EXPERT_LAUNCHES = ("per_expert", "grouped")


def _compute_model(d: dict, source: str, device: DeviceSpec) -> ComputeModel:
    kind = d.get("kind", DEFAULT_KIND)
    if kind not in KINDS:
        raise InputError(source, "compute.kind", " or ".join(KINDS), kind)
    if kind == "catalog":   # the roofline's fields set the fallback; model: roofline
        d = {**d, "kind": "roofline"}   # (a what-if: --set compute.model=roofline) drops it
    rest = {k: v for k, v in d.items() if k not in ("model", "catalog", "gemm_library")}
    if d.get("kind") == "calibration":
        given = sorted(set(d) & {"model", "catalog", "gemm_library"})
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
    lib = d.get("gemm_library", "")   # a catalog choice: model: roofline ignores it
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
    known = sorted({t.library for t in tables if t.library})
    if lib != "" and lib not in known:
        raise InputError(source, "compute.gemm_library", "a library of the catalog's GEMM "
                         f"tables ({', '.join(known) or 'none'})", lib)
    model = CatalogModel(roofline, tables, gemm_library=lib)
    return model if model.tables else roofline


_SHIPPED: list = []


def shipped_catalog():
    """The tables shipped in ``moesim/data/kernels`` (read once per process)."""
    if not _SHIPPED:
        _SHIPPED.append(load_catalog())
    return _SHIPPED[0]
