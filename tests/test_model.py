"""ModelSpec, presets, loader errors and parameter counts."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.errors import InputError
from moesim.model import PRESETS, ModelSpec, count_params, model_from_dict


def test_mixtral_counts_within_2_percent():
    c = count_params(PRESETS["mixtral-8x7b"])
    assert c.total == pytest.approx(46.7e9, rel=0.02)
    assert c.active == pytest.approx(12.9e9, rel=0.02)


def test_deepseek_v3_counts_within_2_percent():
    # 61 main layers; the MTP module is not part of the 671B / 37B
    c = count_params(PRESETS["deepseek-v3"])
    assert c.total == pytest.approx(671e9, rel=0.02)
    assert c.active == pytest.approx(37e9, rel=0.02)


def test_qwen3_235b_counts_within_1_percent():
    # the model card: 235B total, 22B activated; 94 layers x 128 experts x 3 x 4096 x 1536
    c = count_params(PRESETS["qwen3-235b-a22b"])
    assert c.routed_experts == 94 * 128 * 3 * 4096 * 1536
    assert c.total == pytest.approx(235e9, rel=0.01)
    assert c.active == pytest.approx(22e9, rel=0.01)


def test_switch_base_128_about_7b():
    # Switch Transformers Table 9: Switch-Base (128 experts) has 7B parameters
    c = count_params(PRESETS["switch-base"])
    assert c.total == pytest.approx(7.4e9, rel=0.05)
    assert c.lm_head == 0  # tied embeddings


def test_toy_counts_by_hand():
    s = PRESETS["toy"]
    h, f, e, v = 512, 1024, 8, 32000
    c = count_params(s)
    assert c.embedding == v * h and c.lm_head == v * h
    assert c.attention == 2 * 4 * h * h            # q, k, v, o of h x h, 2 layers
    assert c.router == 2 * h * e
    assert c.routed_experts == 2 * e * 3 * h * f
    assert c.norms == 2 * 2 * h + h
    assert c.dense_ffn == 0 and c.shared_experts == 0
    assert c.total == sum(v for k, v in c.as_dict().items() if k not in ("total", "active"))
    # active: only top_k = 2 of 8 experts per layer
    assert c.active == c.total - 2 * (e - 2) * 3 * h * f


def test_moe_layer_pattern():
    ds = PRESETS["deepseek-v3"]
    assert [ds.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert ds.n_moe_layers == 58
    sw = PRESETS["switch-base"]
    assert [sw.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert sw.n_moe_layers == 12


def test_preset_with_override():
    s = model_from_dict({"preset": "mixtral-8x7b", "layers": 4, "top_k": 1}, "s.yaml")
    assert s.layers == 4 and s.top_k == 1 and s.hidden == 4096
    assert isinstance(s, ModelSpec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.layers = 5  # type: ignore[misc]


def test_explicit_dims():
    s = model_from_dict({"name": "mine", "layers": 3, "hidden": 256, "heads": 4, "vocab": 1000,
                         "n_experts": 4, "top_k": 1, "expert_ffn": 512}, "s.yaml")
    assert s.name == "mine" and s.n_moe_layers == 3
    assert s.kv_heads == 4 and s.head_dim == 64          # filled from heads and hidden
    dense = model_from_dict({"layers": 2, "hidden": 64, "heads": 2, "vocab": 100,
                             "n_experts": 0, "dense_ffn": 256}, "s.yaml")
    assert not dense.moe and dense.n_moe_layers == 0


def test_explicit_dims_must_be_complete():
    with pytest.raises(InputError) as ei:
        model_from_dict({"layers": 2, "hidden": 64, "heads": 2, "vocab": 100, "n_experts": 4,
                         "top_k": 1}, "s.yaml")
    assert ei.value.field == "model.expert_ffn" and "no preset given" in str(ei.value)
    with pytest.raises(InputError) as ei:
        model_from_dict({"layers": 2, "hidden": 64, "heads": 2, "vocab": 100,
                         "n_experts": 0}, "s.yaml")
    assert ei.value.field == "model.dense_ffn"


@pytest.mark.parametrize("d, field, text", [
    ({"preset": "gpt-9"}, "model.preset", "deepseek-v3, gpt-oss-120b, llama-3.1-405b, llama-3.1-70b, llama-3.1-8b, mixtral-8x7b, qwen3-0.6b, qwen3-235b-a22b, qwen3-30b-a3b, qwen3-32b, switch-base, toy"),
    ({"preset": "toy", "layerz": 3}, "model.layerz", "a model field"),
    ({"preset": "toy", "layers": "four"}, "model.layers", "an integer"),
    ({"preset": "toy", "layers": 2.5}, "model.layers", "an integer"),
    ({"preset": "toy", "gated": 1}, "model.gated", "a bool"),
    ({"preset": "toy", "top_k": 9}, "model.top_k", "between 1 and n_experts"),
    ({"preset": "toy", "attention": "linear"}, "model.attention", "mha, gqa, mla"),
    ({"preset": "toy", "attention": "gqa", "kv_heads": 3}, "model.kv_heads", "divisor"),
    ({"preset": "toy", "layers": -1}, "model.layers", ">= 0"),
    ({"preset": "toy", "layers": 0}, "model.layers", ">= 1"),
    ([1, 2], "model", "mapping"),
    ({"layers": 2, "hidden": 64, "heads": 0, "vocab": 9, "n_experts": 0, "dense_ffn": 8},
     "model.heads", ">= 1"),
])
def test_bad_model_input(d, field, text):
    with pytest.raises(InputError) as ei:
        model_from_dict(d, "scen.yaml")
    assert ei.value.field == field
    assert ei.value.source == "scen.yaml"
    assert text in str(ei.value)
    assert str(ei.value).startswith(f"scen.yaml: {field}: expected")
