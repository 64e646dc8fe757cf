"""A model from its Hugging Face config.json (``model: {hf_config: PATH}``, moesim.model.hf).

Fixtures: tests/data/hf/ (README.md there says where each file came from).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

from moesim.cli import main
from moesim.errors import InputError
from moesim.model import PRESETS, count_params, model_from_dict, model_warnings
from moesim.model.hf import load
from moesim.wiring import resolve_path

HF = Path(__file__).resolve().parent / "data" / "hf"


def spec(fixture: str, **over):
    return model_from_dict({"hf_config": str(HF / f"{fixture}.json"), **over}, "command line")


# ----------------------------------------------------------- published parameter counts

# (fixture, published total, published active, whether the published active count leaves
# out the embedding lookup, relative tolerance on total, on active). Conventions: DeepSeek
# (the checkpoint's README_WEIGHTS.md: 36.6B activated "including 0.9B for the output
# Head", reproduced in tenstorrent/tt-metal models/demos/deepseek_v3/reference/) and
# OpenAI (the gpt-oss model card: 5.13B active of 116.83B) count the output head but not
# the embedding table; Mistral (46.7B / 12.9B) and Qwen (30.5B / 3.3B, 235B / 22B) count
# both. Published figures are rounded to 2-3 digits, hence the tolerances.
PUBLISHED = [
    ("deepseek-v3", 671e9, 36.6e9, True, 0.001, 0.005),
    ("deepseek-v3.2-exp", 671e9, 36.6e9, True, 0.001, 0.005),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, False, 0.005, 0.02),
    ("qwen3-235b-a22b", 235e9, 22e9, False, 0.005, 0.01),
    ("mixtral-8x7b", 46.7e9, 12.9e9, False, 0.001, 0.005),
    # the card's 116.83B includes ~0.04B of biases moesim does not count
    ("gpt-oss-120b", 116.83e9, 5.13e9, True, 0.001, 0.005),
]


@pytest.mark.parametrize("name,total,active,no_embedding,tol_total,tol_active", PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_counts_from_the_config_match_the_published_totals(name, total, active, no_embedding,
                                                           tol_total, tol_active):
    c = count_params(spec(name))
    assert c.total == pytest.approx(total, rel=tol_total)
    act = c.active - c.embedding if no_embedding else c.active
    assert act == pytest.approx(active, rel=tol_active)


def test_kimi_k2_counts_match_the_checkpoint():
    # Kimi-K2 is DeepSeek-V3's architecture with 384 experts, 64 heads, one dense layer.
    # The checkpoint report's tensor tally (1,026,470,731,056) adds the FP8 scale tensors:
    # one fp32 scale per 128 x 128 block, 60 MoE layers x 384 experts x 3 matrices x
    # (2048/128 x 7168/128 = 896) of them = 61,931,520, and small ones (biases, rotary)
    c = count_params(spec("kimi-k2-instruct"))
    expert_scales = 60 * 384 * 3 * (2048 // 128) * (7168 // 128)
    assert c.total + expert_scales == pytest.approx(1_026_470_731_056, rel=1e-5)
    # the model card: 1T total, 32B activated (2 digits: +-1.6 % of rounding)
    assert c.active - c.embedding == pytest.approx(32e9, rel=0.02)


def test_deepseek_expert_weights_by_hand():
    # 58 MoE layers (61 - 3 dense) x 256 experts x 3 x 7168 x 2048
    c = count_params(spec("deepseek-v3"))
    assert c.routed_experts == 58 * 256 * 3 * 7168 * 2048
    assert c.shared_experts == 58 * 3 * 7168 * 2048
    assert c.dense_ffn == 3 * 3 * 7168 * 18432


# ----------------------------------------------------------- same dims as the presets

# what the checkpoint states and the preset deliberately leaves out
EXPECTED_DIFFERENCES = {
    # the Hub checkpoint is FP8 (quantization_config) and holds one MTP module; the preset
    # is the bf16 training model of the report's 671B (MTP excluded)
    "deepseek-v3": {"weight_bytes": (1, 2), "mtp_layers": (1, 0)},
    # no dense layer: the config's intermediate_size is the expert width
    "gpt-oss-120b": {"dense_ffn": (0, 2880)},
}


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b",
                                  "mixtral-8x7b", "gpt-oss-120b"])
def test_the_shipped_config_gives_the_presets_dims(name):
    got, want = spec(name), PRESETS[name]
    diffs = {f.name: (getattr(got, f.name), getattr(want, f.name))
             for f in dataclasses.fields(want) if getattr(got, f.name) != getattr(want, f.name)}
    assert diffs == EXPECTED_DIFFERENCES.get(name, {})
    assert count_params(got) == count_params(want)


def to_hf(s) -> dict:
    """A config.json written from a ModelSpec with the Hub's key names (the inverse of
    moesim.model.hf, written independently of it)."""
    common = {"num_hidden_layers": s.layers, "hidden_size": s.hidden, "vocab_size": s.vocab,
              "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
              "tie_word_embeddings": s.tied_embeddings, "torch_dtype": "bfloat16"}
    if s.attention == "mla":
        return {**common, "architectures": ["DeepseekV3ForCausalLM"],
                "q_lora_rank": s.q_lora_rank, "kv_lora_rank": s.kv_lora_rank,
                "qk_rope_head_dim": s.qk_rope_dim, "qk_nope_head_dim": s.qk_nope_dim,
                "v_head_dim": s.v_head_dim, "n_routed_experts": s.n_experts,
                "num_experts_per_tok": s.top_k, "moe_intermediate_size": s.expert_ffn,
                "n_shared_experts": s.n_shared_experts, "intermediate_size": s.dense_ffn,
                "first_k_dense_replace": s.first_dense_layers, "moe_layer_freq": 1,
                "num_nextn_predict_layers": s.mtp_layers}
    common["head_dim"] = s.head_dim
    if s.attention_sinks:
        kinds = ["full_attention" if (i + 1) % s.window_full_every == 0 else
                 "sliding_attention" for i in range(s.layers)]
        return {**common, "architectures": ["GptOssForCausalLM"], "sliding_window": s.window,
                "layer_types": kinds, "num_local_experts": s.n_experts,
                "num_experts_per_tok": s.top_k, "intermediate_size": s.expert_ffn}
    if s.dense_ffn:
        return {**common, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": s.n_experts,
                "num_experts_per_tok": s.top_k, "moe_intermediate_size": s.expert_ffn,
                "intermediate_size": s.dense_ffn, "decoder_sparse_step": 1,
                "mlp_only_layers": []}
    return {**common, "architectures": ["MixtralForCausalLM"], "num_local_experts": s.n_experts,
            "num_experts_per_tok": s.top_k, "intermediate_size": s.expert_ffn,
            "sliding_window": None}


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b",
                                  "mixtral-8x7b"])
def test_a_config_built_from_a_preset_reads_back_as_the_preset(name, tmp_path):
    preset = PRESETS[name]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(to_hf(preset)))
    got = model_from_dict({"hf_config": str(path)}, "command line")
    assert got == preset
    assert load(str(path), "command line").unmapped == ()


def test_gpt_oss_preset_reads_back_but_for_its_unused_dense_width(tmp_path):
    preset = PRESETS["gpt-oss-120b"]
    path = tmp_path / "gpt-oss-120b.json"
    path.write_text(json.dumps(to_hf(preset)))
    got = model_from_dict({"hf_config": str(path)}, "command line")
    assert got == dataclasses.replace(preset, dense_ffn=0)


# ----------------------------------------------------------- what is mapped, what is not

def test_attention_kinds_and_windows():
    ds, mix, oss = spec("deepseek-v3"), spec("mixtral-8x7b"), spec("gpt-oss-120b")
    assert (ds.attention, ds.q_lora_rank, ds.kv_lora_rank, ds.head_dim) == ("mla", 1536, 512, 192)
    assert (mix.attention, mix.kv_heads, mix.head_dim, mix.window) == ("gqa", 8, 128, 0)
    assert (oss.window, oss.window_full_every, oss.attention_sinks) == (128, 2, True)


def test_unmapped_fields_are_listed():
    assert load(str(HF / "mixtral-8x7b.json"), "x").unmapped == ()
    v32 = load(str(HF / "deepseek-v3.2-exp.json"), "x").warning()
    assert "index_n_heads=64" in v32 and "n_group=8, topk_group=4" in v32
    oss = load(str(HF / "gpt-oss-120b.json"), "x").unmapped
    assert any(u.startswith("quantization_config.quant_method=mxfp4") for u in oss)
    assert any(u.startswith("attention_bias=true") for u in oss)


def test_an_unknown_key_is_listed_not_dropped(tmp_path):
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    cfg["num_frobnicators"] = 3
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg))
    assert load(str(p), "x").unmapped == ("num_frobnicators (not a field moesim knows)",)


def _write(tmp_path, name, **change):
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    for k, v in change.items():
        if v is ...:
            cfg.pop(k)
        else:
            cfg[k] = v
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


def test_deepseek_moe_frequency_is_placed_exactly(tmp_path):
    # DeepSeek's rule: MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0.
    # 10 layers, first 1, every 2nd: MoE at 2, 4, 6, 8 = moesim first_dense 1, freq 2
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    cfg.update(num_hidden_layers=10, first_k_dense_replace=1, moe_layer_freq=2)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg))
    s = model_from_dict({"hf_config": str(p)}, "x")
    assert [i for i in range(10) if s.is_moe_layer(i)] == [2, 4, 6, 8]
    assert load(str(p), "x").unmapped[1:] == ()   # only the group-limited routing


def test_an_irregular_moe_pattern_keeps_its_count_and_says_so(tmp_path):
    cfg = json.loads((HF / "qwen3-30b-a3b.json").read_text())
    cfg.update(num_hidden_layers=6, mlp_only_layers=[1, 4])
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg))
    s = model_from_dict({"hf_config": str(p)}, "x")
    assert s.n_moe_layers == 4 and [s.is_moe_layer(i) for i in range(6)] == [0, 0, 1, 1, 1, 1]
    assert any("the MoE layer pattern (4 MoE layers of 6 at [0, 2, 3, 5]" in u
               for u in load(str(p), "x").unmapped)


def test_a_sliding_window_on_every_layer(tmp_path):
    s = model_from_dict({"hf_config": str(_write(tmp_path, "c.json", sliding_window=4096))}, "x")
    assert (s.window, s.window_full_every) == (4096, 0)


def test_window_patterns_from_layer_types(tmp_path):
    cfg = json.loads((HF / "gpt-oss-120b.json").read_text())
    cfg["num_hidden_layers"] = 6
    for kinds, want, said in [
        (["sliding_attention"] * 6, (128, 0), False),                     # every layer
        (["sliding_attention", "sliding_attention", "full_attention"] * 2, (128, 3), False),
        (["full_attention"] * 6, (0, 0), False),                          # no window
        (["full_attention"] + ["sliding_attention"] * 5, (0, 0), True),   # irregular
    ]:
        cfg["layer_types"] = kinds
        p = tmp_path / "c.json"
        p.write_text(json.dumps(cfg))
        s = model_from_dict({"hf_config": str(p)}, "x")
        assert (s.window, s.window_full_every) == want, kinds
        noted = any(u.startswith("the sliding/full layer pattern")
                    for u in load(str(p), "x").unmapped)
        assert noted == said, kinds


def test_overrides_apply_on_top_of_the_config():
    s = spec("mixtral-8x7b", layers=4, name="small")
    assert (s.layers, s.name, s.hidden) == (4, "small", 4096)


# ----------------------------------------------------------- in a scenario

def _scenario(folder: Path, model: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "hf", "cluster": {"topology": "dgx-h100", "nodes": 1},
                                 "model": model, "parallel": {"ep": 8}}))
    return p


def test_a_relative_path_is_read_beside_the_scenario(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    shutil.copy(HF / "qwen3-30b-a3b.json", tmp_path / "sub" / "q.json")
    p = _scenario(tmp_path / "sub", {"hf_config": "q.json", "layers": 2})
    monkeypatch.chdir(tmp_path)   # not the scenario's folder
    res = resolve_path(p)
    assert (res.model.layers, res.model.hidden, res.model.n_experts) == (2, 2048, 128)
    assert res.warnings == ()


def test_set_on_the_command_line_reads_from_the_working_directory(tmp_path, monkeypatch,
                                                                   capsys):
    # a scenario elsewhere with a preset; the config.json given with --set sits in the
    # working directory, and --set model.preset= drops the file's preset
    p = _scenario(tmp_path / "elsewhere", {"preset": "toy"})
    (tmp_path / "here").mkdir()
    shutil.copy(HF / "mixtral-8x7b.json", tmp_path / "here" / "mix.json")
    monkeypatch.chdir(tmp_path / "here")
    over = ["model.hf_config=mix.json", "model.layers=2"]
    res = resolve_path(p, [*over, "model.preset="])
    assert (res.model.name, res.model.layers, res.model.n_experts) == ("mix", 2, 8)
    assert main(["memory", str(p), *[a for o in over for a in ("--set", o)]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["moesim memory: error: command line: --set model.hf_config: expected "
                   "either preset or hf_config, not both (with --set, --set model.preset= "
                   "drops the file's preset), got 'mix.json'"]


def test_a_checkpoint_folder_is_read_through_its_config_json(tmp_path):
    (tmp_path / "Qwen3-30B-A3B").mkdir()
    shutil.copy(HF / "qwen3-30b-a3b.json", tmp_path / "Qwen3-30B-A3B" / "config.json")
    res = resolve_path(_scenario(tmp_path, {"hf_config": "Qwen3-30B-A3B", "layers": 2}))
    assert res.model.name == "qwen3-30b-a3b"


def test_the_warning_reaches_the_scenario_and_stderr(tmp_path, capsys):
    shutil.copy(HF / "gpt-oss-120b.json", tmp_path / "g.json")
    p = _scenario(tmp_path, {"hf_config": "g.json", "layers": 2})
    assert any("GptOssForCausalLM: not mapped" in w for w in resolve_path(p).warnings)
    assert model_warnings({"preset": "toy"}, "x") == []
    assert main(["memory", str(p)]) == 0
    out = capsys.readouterr()
    assert "not mapped from config.json: quantization_config.quant_method=mxfp4" in out.out + out.err


# ----------------------------------------------------------- bad input: one line, exit 2

BAD = [
    ("malformed", "{\"hidden_size\": 4096,", "s.yaml): line 1 column 22: expected valid JSON"),
    ("not an object", "[1, 2]", "s.yaml): expected a JSON object of model fields"),
    ("not utf-8", b"\xff\xfe{}", "s.yaml): expected a UTF-8 JSON file"),
    ("a key twice", "{\"hidden_size\": 4096, \"hidden_size\": 2048}",
     "s.yaml): hidden_size: expected each key once (this one is given twice), got 2048"),
    ("infinity", "{\"architectures\": [\"MixtralForCausalLM\"], \"num_hidden_layers\": "
     "Infinity}", "s.yaml): num_hidden_layers: expected an integer, got inf"),
]


@pytest.mark.parametrize("what,text,line", BAD, ids=[b[0] for b in BAD])
def test_a_broken_file_is_one_line_naming_it(what, text, line, tmp_path, capsys):
    c = tmp_path / "c.json"
    c.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["memory", str(_scenario(tmp_path, {"hf_config": "c.json"}))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "c.json (named by " in err[0] and line in err[0], err


FIELD_ERRORS = [
    ({"hidden_size": ...}, "hidden_size: expected an integer (required"),
    ({"hidden_size": float("nan")}, "hidden_size: expected an integer, got nan"),
    ({"hidden_size": "4096"}, "hidden_size: expected an integer, got '4096'"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers: expected an integer from 1 to 1,024"),
    ({"num_local_experts": -8}, "num_local_experts: expected an integer from 1"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings: expected true or false"),
    ({"architectures": ["LlamaForCausalLM"]}, "architectures: expected one of "
     "DeepseekV2ForCausalLM"),
    ({"num_key_value_heads": 5}, "num_key_value_heads (model.kv_heads): expected a divisor "
     "of heads (32), got 5"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok (model.top_k): expected between 1 and "
     "n_experts (8), got 9"),
]


@pytest.mark.parametrize("change,line", FIELD_ERRORS, ids=[str(c) for c, _ in FIELD_ERRORS])
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(change, line, tmp_path,
                                                               capsys):
    c = _write(tmp_path, "c.json", **change)
    assert main(["memory", str(_scenario(tmp_path, {"hf_config": "c.json"}))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"moesim memory: error: {c} (named by "), err
    assert f"s.yaml): {line}" in err[0], err


@pytest.mark.parametrize("model,line", [
    ({"hf_config": "missing.json"}, "model.hf_config: expected an existing config.json file"),
    ({"hf_config": 3}, "model.hf_config: expected a path to a Hugging Face config.json"),
    ({"hf_config": "c.json", "preset": "toy"}, "model.hf_config: expected either preset or "
     "hf_config, not both"),
    ({"hf_config": "."}, "model.hf_config: expected an existing config.json file"),
    ({"hf_config": "c.json", "layres": 2}, "model.layres: expected a model field"),
])
def test_a_bad_model_section_names_the_scenario(model, line, tmp_path, capsys):
    _write(tmp_path, "c.json")
    p = _scenario(tmp_path, model)
    assert main(["memory", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{p}: {line}" in err[0], err


def test_an_override_that_breaks_the_config_names_the_scenario(tmp_path):
    _write(tmp_path, "c.json")
    with pytest.raises(InputError) as e:
        model_from_dict({"hf_config": str(tmp_path / "c.json"), "top_k": 9}, "s.yaml")
    assert (e.value.source, e.value.field) == ("s.yaml", "model.top_k")
