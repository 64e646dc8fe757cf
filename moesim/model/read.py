"""A model from a scenario's ``model`` section: a preset (:mod:`moesim.model.presets`)
or a Hugging Face config.json (:mod:`moesim.model.hf`) with overrides, or explicit dims,
checked by :func:`moesim.model.spec.validate`."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import InputError
from moesim.model.hf import load as hf_load
from moesim.model.presets import PRESETS
from moesim.model.spec import FIELDS, ModelSpec, check_type, validate


@dataclass(frozen=True)
class ModelSection:
    """A scenario's ``model`` section, checked when the scenario is read
    (:func:`parse`): a preset, a Hugging Face config.json or explicit dims, with the
    :class:`ModelSpec` fields it sets (each of that field's type). The model itself is
    built by :func:`model_from_dict` (the dims checked together, a config.json read)."""

    preset: str | None = None           # a name of moesim.model.presets
    hf_config: str | None = None        # a config.json (read when the model is built)
    dims: tuple[tuple[str, Any], ...] = ()   # ModelSpec fields set, in the order given
    #: the section as written (Scenario.to_dict's echo; not a key)
    written: dict = field(default_factory=dict, compare=False, repr=False)

    def as_dict(self) -> dict:
        """The section as written (keys given, in order)."""
        return copy.deepcopy(self.written)

    def __bool__(self) -> bool:
        return bool(self.written)


def parse(d: Any, source: str) -> ModelSection:
    """Check a ``model`` mapping as far as it goes without building the model: a known
    preset, known fields of the right types, the dims a model without a preset needs.
    Raises InputError(source, "model.<field>", expected, got)."""
    if isinstance(d, ModelSection):
        return d
    if not isinstance(d, Mapping):
        raise InputError(source, "model", "a mapping of model fields, {preset: NAME} or "
                         "{hf_config: PATH}", d)
    fields = dict(d)
    written = copy.deepcopy(dict(d))
    if "hf_config" in fields:
        if fields.get("preset") is not None:
            raise InputError(source, "model.hf_config", "either preset or hf_config, not both "
                             "(with --set, --set model.preset= drops the file's preset)",
                             fields["hf_config"])
        fields.pop("preset", None)
        path = fields.pop("hf_config")
        for key, value in fields.items():
            if key not in FIELDS:
                raise InputError(source, f"model.{key}", "a model field (hf_config, "
                                 f"{', '.join(FIELDS)})", key)
            check_type(key, value, source)
        return ModelSection(hf_config=path, dims=tuple(fields.items()), written=written)
    preset = None
    if "preset" in fields:
        preset = fields.pop("preset")
        if not isinstance(preset, str) or preset not in PRESETS:
            raise InputError(source, "model.preset", f"one of {', '.join(sorted(PRESETS))}",
                             preset)
    for key, value in fields.items():
        if key not in FIELDS:
            raise InputError(
                source, f"model.{key}", f"a model field ({', '.join(['preset', 'hf_config', *FIELDS])})", key
            )
        check_type(key, value, source)
    if preset is None:
        _require_explicit(fields, source)
    return ModelSection(preset=preset, dims=tuple(fields.items()), written=written)


def model_from_dict(d: Any, source: str) -> ModelSpec:
    """Build a ModelSpec from a :class:`ModelSection` or its mapping: ``{"preset": name,
    **overrides}``, ``{"hf_config": path, **overrides}`` or explicit dims.

    Raises InputError(source, "model.<field>", expected, got) on an unknown preset,
    an unknown key, a wrong type or inconsistent dims; a config.json's own problems name
    that file and its key.
    """
    sec = parse(d, source)
    fields = dict(sec.dims)
    if sec.hf_config is not None:
        return _from_hf(sec.hf_config, fields, source)
    if sec.preset is not None:
        return validate(dataclasses.replace(PRESETS[sec.preset], **fields), source)
    fields.setdefault("kv_heads", fields["heads"])
    fields.setdefault("head_dim", fields["hidden"] // max(fields["heads"], 1) or 1)
    if not fields["n_experts"]:
        fields.setdefault("top_k", 0)
    return validate(dataclasses.replace(ModelSpec(), **fields), source)


def _require_explicit(fields: dict, source: str) -> None:
    """Without a preset, the dims that size the model must be given (no silent defaults)."""
    required = ["layers", "hidden", "heads", "vocab", "n_experts"]
    if fields.get("n_experts", 1):
        required += ["top_k", "expert_ffn"]
    if not fields.get("n_experts", 1) or fields.get("first_dense_layers", 0) \
            or fields.get("moe_layer_freq", 1) > 1:
        required.append("dense_ffn")
    for key in required:
        if key not in fields:
            raise InputError(source, f"model.{key}",
                             f"a value (no preset given, so {', '.join(required)} are required;"
                             f" presets: {', '.join(sorted(PRESETS))})")


def _from_hf(path: Any, fields: dict, source: str) -> ModelSpec:
    """A config.json's fields with the scenario's overrides (checked by :func:`parse`)
    on top. An inconsistency in a value the config.json gave is reported against that
    file and its key."""
    hf = hf_load(path, source)
    try:
        return validate(dataclasses.replace(ModelSpec(), **{**hf.fields, **fields}), source)
    except InputError as err:
        name = err.field.removeprefix("model.")
        if name in fields or name not in hf.origin:
            raise
        raise InputError(str(hf.path), f"{hf.origin[name]} (model.{name})", err.expected,
                         err.got) from None


def model_warnings(d: Any, source: str) -> list[str]:
    """The warning a ``{hf_config: PATH}`` model section gives: the config.json's fields
    moesim could not map (none for a preset or explicit dims)."""
    if isinstance(d, ModelSection):
        d = d.as_dict()
    if not isinstance(d, Mapping) or "hf_config" not in d:
        return []
    line = hf_load(d["hf_config"], source).warning()
    return [line] if line else []
