"""A model from a scenario's ``model`` section: a preset (:mod:`moesim.model.presets`)
or a Hugging Face config.json (:mod:`moesim.model.hf`) with overrides, or explicit dims,
checked by :func:`moesim.model.spec.validate`."""

from __future__ import annotations

import dataclasses
from typing import Any

from moesim.errors import InputError
from moesim.model.hf import load as hf_load
from moesim.model.presets import PRESETS
from moesim.model.spec import FIELDS, ModelSpec, check_type, validate


def model_from_dict(d: Any, source: str) -> ModelSpec:
    """Build a ModelSpec from ``{"preset": name, **overrides}``, ``{"hf_config": path,
    **overrides}`` or explicit dims.

    Raises InputError(source, "model.<field>", expected, got) on an unknown preset,
    an unknown key, a wrong type or inconsistent dims; a config.json's own problems name
    that file and its key.
    """
    if not isinstance(d, dict):
        raise InputError(source, "model", "a mapping of model fields, {preset: NAME} or "
                         "{hf_config: PATH}", d)
    fields = dict(d)
    base = ModelSpec()
    if "hf_config" in fields:
        if fields.get("preset") is not None:
            raise InputError(source, "model.hf_config", "either preset or hf_config, not both "
                             "(with --set, --set model.preset= drops the file's preset)",
                             fields["hf_config"])
        fields.pop("preset", None)
        return _from_hf(fields, source)
    if "preset" in fields:
        name = fields.pop("preset")
        if not isinstance(name, str) or name not in PRESETS:
            raise InputError(source, "model.preset", f"one of {', '.join(sorted(PRESETS))}", name)
        base = PRESETS[name]
    for key, value in fields.items():
        if key not in FIELDS:
            raise InputError(
                source, f"model.{key}", f"a model field ({', '.join(['preset', 'hf_config', *FIELDS])})", key
            )
        check_type(key, value, source)
    if "preset" not in d:
        _require_explicit(fields, source)
        fields.setdefault("kv_heads", fields["heads"])
        fields.setdefault("head_dim", fields["hidden"] // max(fields["heads"], 1) or 1)
        if not fields["n_experts"]:
            fields.setdefault("top_k", 0)
    return validate(dataclasses.replace(base, **fields), source)


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


def _from_hf(fields: dict, source: str) -> ModelSpec:
    """A config.json's fields with the scenario's overrides on top. An inconsistency in a
    value the config.json gave is reported against that file and its key."""
    hf = hf_load(fields.pop("hf_config"), source)
    for key, value in fields.items():
        if key not in FIELDS:
            raise InputError(source, f"model.{key}", "a model field (hf_config, "
                             f"{', '.join(FIELDS)})", key)
        check_type(key, value, source)
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
    if not isinstance(d, dict) or "hf_config" not in d:
        return []
    line = hf_load(d["hf_config"], source).warning()
    return [line] if line else []
