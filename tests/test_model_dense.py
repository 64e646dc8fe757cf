"""Dense presets (no experts): parameter counts against the published ones, and the
layers all dense."""

from __future__ import annotations

import pytest

from moesim.model.params import count_params
from moesim.model.presets import PRESETS
from moesim.model.spec import validate

#: the model cards' counts
PUBLISHED = {"llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 405.9e9,
             "qwen3-32b": 32.8e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_dense_parameter_counts_within_half_a_percent(name):
    spec = validate(PRESETS[name], "preset")
    assert not spec.moe and not any(spec.is_moe_layer(i) for i in range(spec.layers))
    total = count_params(spec).total
    assert abs(total / PUBLISHED[name] - 1) < 0.005


def test_llama_8b_by_hand():
    # per layer: q 4096 x 4096 + k, v 2 x 4096 x 1024 + o 4096 x 4096 = 41,943,040;
    # FFN 3 x 4096 x 14336 = 176,160,768; norms 2 x 4096 -> 218,112,000 x 32 layers
    # = 6,979,584,000; embedding + head 2 x 128256 x 4096 = 1,050,673,152; final norm 4096
    assert count_params(PRESETS["llama-3.1-8b"]).total == 8_030_261_248
