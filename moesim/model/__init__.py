"""Model description, presets, parameter counts and per-op costs (pure planning code)."""

from moesim.model.params import ParamCount, count_params
from moesim.model.presets import PRESETS
from moesim.model.read import model_from_dict, model_warnings
from moesim.model.spec import ModelSpec

__all__ = ["PRESETS", "ModelSpec", "ParamCount", "count_params", "model_from_dict",
           "model_warnings"]
