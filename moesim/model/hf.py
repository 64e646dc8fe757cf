"""A model from its Hugging Face ``config.json`` (``model: {hf_config: PATH}``).

Every open-weights checkpoint ships a ``config.json`` naming its architecture and dims.
This module reads the ones of the MoE families below into :class:`ModelSpec` fields and
lists what it could not map (docs/model.md, "A model from its config.json"):

- ``DeepseekV3ForCausalLM`` (DeepSeek-V3/R1, Kimi-K2), ``DeepseekV32ForCausalLM``
  (DeepSeek-V3.2), ``DeepseekV2ForCausalLM``: MLA, routed + shared experts, leading dense
  layers. A layer is MoE when ``i >= first_k_dense_replace and i % moe_layer_freq == 0``
  (deepseek-ai's modeling_deepseek.py ``DeepseekV3DecoderLayer``; the same rule in
  huggingface/transformers models/deepseek_v3/modeling_deepseek_v3.py).
- ``Qwen3MoeForCausalLM``: GQA, routed experts; a layer is MoE when it is not in
  ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (transformers
  models/qwen3_moe/modeling_qwen3_moe.py ``Qwen3MoeDecoderLayer``).
- ``MixtralForCausalLM``: GQA, every layer MoE, ``intermediate_size`` is an expert's width;
  ``sliding_window`` (when set) windows every layer (models/mixtral/modeling_mixtral.py).
- ``GptOssForCausalLM``: GQA with learned sinks, every layer MoE, ``layer_types`` naming
  sliding and full layers (models/gpt_oss/configuration_gpt_oss.py; its default alternates
  from a sliding first layer).

Fields that change no step's time or memory (token ids, RoPE, norm epsilon, routing
scales) are read and ignored; a field that would change them and that moesim cannot
represent (biases, a sparse-attention indexer, sub-byte quantisation, an irregular layer
pattern) or that it does not know is listed in :attr:`HFModel.unmapped`, which the
scenario's resolver prints as one warning line and keeps in the summary.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moesim.errors import InputError
from moesim.model.spec import MAX_DIM, MAX_LAYERS

#: architecture (``architectures[0]``) -> family; ``model_type`` when ``architectures`` is absent
ARCHITECTURES = {
    "DeepseekV3ForCausalLM": "deepseek", "DeepseekV32ForCausalLM": "deepseek",
    "DeepseekV2ForCausalLM": "deepseek", "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral", "GptOssForCausalLM": "gpt_oss",
}
MODEL_TYPES = {"deepseek_v3": "deepseek", "deepseek_v32": "deepseek", "deepseek_v2": "deepseek",
               "kimi_k2": "deepseek", "qwen3_moe": "qwen3_moe", "mixtral": "mixtral",
               "gpt_oss": "gpt_oss"}
#: bytes per weight element of a stated ``torch_dtype`` (``dtype`` in transformers >= 4.56)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: keys that change neither a step's time nor its memory in moesim's model: read, ignored
IGNORED = frozenset({
    "_name_or_path", "architectures", "model_type", "auto_map", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "rms_norm_eps",
    "attention_dropout", "use_cache", "rope_theta", "rope_scaling", "rope_parameters",
    "max_position_embeddings", "initial_context_length", "router_aux_loss_coef",
    "aux_loss_alpha", "seq_aux", "output_router_logits", "norm_topk_prob",
    "routed_scaling_factor", "scoring_func", "topk_method", "router_jitter_noise",
    "pretraining_tp", "ep_size", "swiglu_limit", "hidden_act", "rope_interleave",
    "torch_dtype", "dtype", "attention_bias", "mlp_bias", "tie_word_embeddings",
})
#: the largest config.json read (a real one is a few KB)
MAX_BYTES = 1 << 20
_REQUIRED = object()


@dataclass(frozen=True)
class HFModel:
    """What a config.json maps to: ModelSpec ``fields``, the HF key each came from
    (``origin``) and what could not be mapped (``unmapped``, one entry per field)."""

    path: Path
    architecture: str
    fields: dict[str, Any]
    origin: dict[str, str]
    unmapped: tuple[str, ...]

    def warning(self) -> str | None:
        """One line listing the unmapped fields (None when everything mapped)."""
        if not self.unmapped:
            return None
        return (f"{self.path}: {self.architecture}: not mapped from config.json: "
                + "; ".join(self.unmapped))


def config_path(value: Any, source: str) -> Path:
    """The config.json a scenario's ``model.hf_config`` names: a path relative to the
    scenario file's folder, or, when nothing is there, to the working directory (a path
    given with ``--set`` on the command line); a checkpoint folder holding ``config.json``
    stands for that file."""
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise InputError(source, "model.hf_config",
                         "a path to a Hugging Face config.json (or the folder holding it)",
                         value)
    given = Path(value).expanduser()
    src = Path(source)
    places = [given] if given.is_absolute() or not src.is_file() else \
        [src.parent / given, given]
    for p in places:
        if p.is_dir() and (p / "config.json").is_file():
            p = p / "config.json"
        if p.is_file():
            return p
    raise InputError(source, "model.hf_config", "an existing config.json file (a relative "
                     "path is read beside the scenario file)", value)


def load(value: Any, source: str) -> HFModel:
    """Read and map the config.json named by ``model.hf_config`` in ``source``."""
    p = config_path(value, source)
    return _mapped(str(p), _text(p))


@functools.lru_cache(maxsize=32)
def _mapped(path: str, text: str) -> HFModel:
    """The mapping of one file's text (a scenario is resolved several times per run)."""
    p = Path(path)
    name = (p.parent.name if p.name == "config.json" and p.parent.name else p.stem).lower()
    return from_config(parse(text, path), path, name or "hf-model", p)


def _text(p: Path) -> str:
    src = str(p)
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise InputError(src, "", f"a Hugging Face config.json of at most {MAX_BYTES:,} bytes",
                         f"{size:,} bytes")
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(src, "", "a UTF-8 JSON file (a Hugging Face config.json)",
                         "bytes that are not UTF-8") from None


def read_config(p: Path) -> dict:
    """The JSON object in ``p``; one InputError line naming the file otherwise."""
    return parse(_text(p), str(p))


def parse(text: str, src: str) -> dict:
    """The JSON object in ``text`` (``src`` names it in errors)."""
    try:
        cfg = json.loads(text, object_pairs_hook=_no_repeats(src))
    except json.JSONDecodeError as err:
        raise InputError(src, f"line {err.lineno} column {err.colno}",
                         "valid JSON (a Hugging Face config.json)", err.msg) from None
    except RecursionError:
        raise InputError(src, "", "a JSON object of model fields", "nesting too deep") from None
    if not isinstance(cfg, dict):
        raise InputError(src, "", "a JSON object of model fields (a Hugging Face config.json)",
                         type(cfg).__name__)
    return cfg


def _no_repeats(src: str):
    """A json ``object_pairs_hook`` refusing a key given twice (json keeps the last)."""
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for k, v in pairs:
            if k in out:
                raise InputError(src, k, "each key once (this one is given twice)", v)
            out[k] = v
        return out
    return hook


class _Reader:
    """Reads keys of one config, checking each value, and remembers which it read."""

    def __init__(self, cfg: dict, src: str) -> None:
        self.cfg, self.src, self.used = cfg, src, set()

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        v = self.cfg.get(key, default)
        return default if v is None else v

    def int(self, key: str, default: Any = _REQUIRED, lo: int = 1, top: int = MAX_DIM,
            what: str = "") -> int:
        self.used.add(key)
        v = self.cfg.get(key)
        if v is None:
            if default is _REQUIRED:
                raise InputError(self.src, key, f"an integer{what} (required: the "
                                 "model cannot be sized without it)")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and math.isfinite(v) and v == int(v):
                v = int(v)   # 4096.0: a whole number written as a float
            else:
                raise InputError(self.src, key, f"an integer{what}", v)
        if not lo <= v <= top:
            raise InputError(self.src, key, f"an integer from {lo} to {top:,}{what}", v)
        return v

    def bool(self, key: str, default: bool) -> bool:
        self.used.add(key)
        v = self.cfg.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InputError(self.src, key, "true or false", v)
        return v


def _architecture(cfg: dict, src: str) -> tuple[str, str]:
    archs = cfg.get("architectures")
    known = ", ".join(sorted(ARCHITECTURES))
    if archs is not None:
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise InputError(src, "architectures", "a list naming the model class, e.g. "
                             "[\"MixtralForCausalLM\"]", archs)
        if archs[0] not in ARCHITECTURES:
            raise InputError(src, "architectures", f"one of {known} (the architectures "
                             "moesim maps)", archs[0])
        return archs[0], ARCHITECTURES[archs[0]]
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in MODEL_TYPES:
        return mt, MODEL_TYPES[mt]
    raise InputError(src, "architectures", f"one of {known} (or a model_type of "
                     f"{', '.join(sorted(MODEL_TYPES))})", mt if mt is not None else archs)


def from_config(cfg: dict, src: str, name: str, path: Path | None = None) -> HFModel:
    """Map one parsed config.json (``src`` names it in errors) to ModelSpec fields."""
    arch, family = _architecture(cfg, src)
    r = _Reader(cfg, src)
    unmapped: list[str] = []
    f: dict[str, Any] = {"name": name}
    origin: dict[str, str] = {}

    def put(field: str, value: Any, key: str) -> None:
        f[field], origin[field] = value, key

    put("layers", r.int("num_hidden_layers", top=MAX_LAYERS), "num_hidden_layers")
    put("hidden", r.int("hidden_size"), "hidden_size")
    put("heads", r.int("num_attention_heads"), "num_attention_heads")
    put("vocab", r.int("vocab_size"), "vocab_size")
    put("tied_embeddings", r.bool("tie_word_embeddings", False), "tie_word_embeddings")
    put("gated", True, "architectures")   # every family's MLP is gate * up -> down (SwiGLU)
    if family == "deepseek":
        pattern = _deepseek(r, put, unmapped)
    else:
        pattern = _gqa(r, family, put, unmapped)
    _place_moe(pattern, f, origin, unmapped)
    _dtype(r, put, unmapped)
    if r.bool("attention_bias", False):
        unmapped.append("attention_bias=true (the q/k/v/o biases are not counted)")
    if family == "gpt_oss":
        unmapped.append("expert and router biases of GptOss (not counted)")
    if r.bool("mlp_bias", False):
        unmapped.append("mlp_bias=true (the MLP biases are not counted)")
    for key in sorted(set(cfg) - r.used - IGNORED):
        unmapped.append(f"{key} (not a field moesim knows)")
    return HFModel(path or Path(src), arch, f, origin, tuple(unmapped))


def _deepseek(r: _Reader, put, unmapped: list[str]) -> list[bool]:
    """MLA, routed and shared experts, leading dense layers (DeepSeek-V2/V3, Kimi-K2)."""
    heads = r.cfg.get("num_attention_heads")
    put("attention", "mla", "architectures")
    put("q_lora_rank", r.int("q_lora_rank", 0, lo=0), "q_lora_rank")  # null: no q compression
    put("kv_lora_rank", r.int("kv_lora_rank"), "kv_lora_rank")
    rope, nope = r.int("qk_rope_head_dim"), r.int("qk_nope_head_dim")
    put("qk_rope_dim", rope, "qk_rope_head_dim")
    put("qk_nope_dim", nope, "qk_nope_head_dim")
    put("v_head_dim", r.int("v_head_dim"), "v_head_dim")
    put("kv_heads", r.int("num_key_value_heads", heads), "num_key_value_heads")
    put("head_dim", nope + rope, "qk_nope_head_dim")
    layers = r.cfg["num_hidden_layers"]
    experts = r.int("n_routed_experts", 0, lo=0)
    put("n_experts", experts, "n_routed_experts")
    put("top_k", r.int("num_experts_per_tok", 0, lo=0) if experts else 0, "num_experts_per_tok")
    width = r.int("moe_intermediate_size", 0, lo=0)
    put("expert_ffn", width, "moe_intermediate_size")
    shared = r.int("n_shared_experts", 0, lo=0)
    put("n_shared_experts", shared, "n_shared_experts")
    put("shared_ffn", width if shared else 0, "moe_intermediate_size")
    put("dense_ffn", r.int("intermediate_size", 0, lo=0), "intermediate_size")
    put("mtp_layers", r.int("num_nextn_predict_layers", 0, lo=0, top=MAX_LAYERS),
        "num_nextn_predict_layers")
    first = r.int("first_k_dense_replace", 0, lo=0, top=MAX_LAYERS)
    freq = r.int("moe_layer_freq", 1, top=MAX_LAYERS)
    groups, topk_group = r.int("n_group", 1), r.int("topk_group", 1)
    if groups > 1 and topk_group < groups:
        unmapped.append(f"n_group={groups}, topk_group={topk_group} (group-limited routing; "
                        "routing.max_nodes sets node-limited routing)")
    index = [k for k in ("index_n_heads", "index_head_dim", "index_topk") if k in r.cfg]
    if index:
        r.used.update(index)
        unmapped.append(", ".join(f"{k}={r.cfg[k]}" for k in index) + " (DeepSeek Sparse "
                        "Attention's indexer: attention is priced dense, indexer weights "
                        "not counted)")
    return [bool(experts) and i >= first and i % freq == 0 for i in range(layers)]


def _gqa(r: _Reader, family: str, put, unmapped: list[str]) -> list[bool]:
    """MHA/GQA families: Qwen3-MoE, Mixtral, GPT-OSS."""
    heads, hidden = r.cfg["num_attention_heads"], r.cfg["hidden_size"]
    layers = r.cfg["num_hidden_layers"]
    kv = r.int("num_key_value_heads", heads)
    put("kv_heads", kv, "num_key_value_heads")
    put("head_dim", r.int("head_dim", max(hidden // heads, 1)), "head_dim")
    put("attention", "mha" if kv == heads else "gqa", "num_key_value_heads")
    if family == "qwen3_moe":
        experts = r.int("num_experts", 0, lo=0)
        put("expert_ffn", r.int("moe_intermediate_size", 0, lo=0), "moe_intermediate_size")
        put("dense_ffn", r.int("intermediate_size", 0, lo=0), "intermediate_size")
        step = r.int("decoder_sparse_step", 1, top=MAX_LAYERS)
        only = r.raw("mlp_only_layers", [])
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                 for i in only):
            raise InputError(r.src, "mlp_only_layers", "a list of layer indices", only)
        pattern = [bool(experts) and i not in only and (i + 1) % step == 0
                   for i in range(layers)]
    else:   # mixtral, gpt_oss: intermediate_size is one expert's width, every layer MoE
        experts = r.int("num_local_experts")
        put("expert_ffn", r.int("intermediate_size"), "intermediate_size")
        put("dense_ffn", 0, "intermediate_size")
        pattern = [True] * layers
    put("n_experts", experts, "num_experts" if family == "qwen3_moe" else "num_local_experts")
    top_k = r.int("num_experts_per_tok", None, lo=0)
    if family == "gpt_oss":
        alias = r.int("experts_per_token", None, lo=0)
        top_k = top_k if top_k is not None else alias
    put("top_k", (top_k or 0) if experts else 0, "num_experts_per_tok")
    put("attention_sinks", family == "gpt_oss", "architectures")
    _window(r, family, layers, put, unmapped)
    return pattern


def _window(r: _Reader, family: str, layers: int, put, unmapped: list[str]) -> None:
    """Sliding-window attention: the window and every how many layers one is full."""
    window = r.int("sliding_window", 0, lo=0)
    types = r.raw("layer_types")
    use = r.bool("use_sliding_window", family != "qwen3_moe")
    first_window = r.int("max_window_layers", 0, lo=0, top=MAX_LAYERS)
    if not window or not use:
        put("window", 0, "sliding_window")
        return
    if types is None:
        if family == "gpt_oss":       # GptOssConfig's default: sliding, full, sliding, ...
            sliding = [(i + 1) % 2 == 1 for i in range(layers)]
        elif family == "qwen3_moe":   # Qwen3MoeConfig: sliding from max_window_layers on
            sliding = [i >= first_window for i in range(layers)]
        else:
            sliding = [True] * layers
    else:
        if not isinstance(types, list) or len(types) != layers:
            raise InputError(r.src, "layer_types", f"a list of {layers} layer types "
                             "(num_hidden_layers)", types)
        odd = sorted({str(t) for t in types} - {"sliding_attention", "full_attention"})
        if odd:
            unmapped.append(f"layer_types {', '.join(odd)} (taken as full attention)")
        sliding = [t == "sliding_attention" for t in types]
    every, exact = _full_every(sliding)
    if not exact:
        unmapped.append("the sliding/full layer pattern (moesim windows all layers or all but "
                        "every N-th; taken as full attention everywhere)")
        put("window", 0, "layer_types")
        return
    put("window", window if every != 1 else 0, "sliding_window")
    put("window_full_every", every if every != 1 else 0, "layer_types")


def _full_every(sliding: list[bool]) -> tuple[int, bool]:
    """N such that layer i is full iff (i + 1) % N == 0 (0: every layer windowed); the
    second value says whether such N reproduces the pattern."""
    if all(sliding):
        return 0, True
    n = sliding.index(False) + 1
    return n, [(i + 1) % n != 0 for i in range(len(sliding))] == sliding


def _place_moe(pattern: list[bool], f: dict, origin: dict, unmapped: list[str]) -> None:
    """moesim's rule (MoE when i >= first and (i - first) % freq == freq - 1) for the HF
    pattern; when none reproduces it, the same count of MoE layers placed last."""
    layers, moe = len(pattern), [i for i, m in enumerate(pattern) if m]
    if not moe:
        f.update(n_experts=0, top_k=0, first_dense_layers=0, moe_layer_freq=1)
        return
    m = moe[0]
    freq = moe[1] - m if len(moe) > 1 else max(layers - m, 1)
    first = m - (freq - 1)
    if first >= 0 and [i >= first and (i - first) % freq == freq - 1
                       for i in range(layers)] == pattern:
        f.update(first_dense_layers=first, moe_layer_freq=freq)
    else:
        f.update(first_dense_layers=layers - len(moe), moe_layer_freq=1)
        unmapped.append(f"the MoE layer pattern ({len(moe)} MoE layers of {layers} at "
                        f"{moe[:4]}{'...' if len(moe) > 4 else ''}: placed as the last "
                        f"{len(moe)} layers)")
    origin.setdefault("first_dense_layers", "first_k_dense_replace")
    origin.setdefault("moe_layer_freq", "moe_layer_freq")


def _dtype(r: _Reader, put, unmapped: list[str]) -> None:
    """``weight_bytes`` from ``quantization_config`` (fp8: 1) or ``torch_dtype``."""
    quant = r.raw("quantization_config")
    dtype = r.raw("torch_dtype", r.raw("dtype"))
    if dtype is not None and dtype not in DTYPE_BYTES:
        unmapped.append(f"torch_dtype={dtype} (weights taken as 2 bytes)")
    nbytes = DTYPE_BYTES.get(dtype, 2)
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        if method == "fp8":
            nbytes = 1
        else:
            unmapped.append(f"quantization_config.quant_method={method} (weight_bytes counts "
                            f"whole bytes per weight; weights taken as {nbytes} bytes)")
    put("weight_bytes", nbytes,
        "quantization_config" if quant is not None and nbytes == 1 else "torch_dtype")
