"""Kernels of the reference code listed beside published rates
(moesim.model.kernels.reference; on when ``compute.memory_kernels`` is not ``stream``).

Hand-worked bytes on DeepSeek's profiled pair (``deepseek-v3-fb-pair``: 4,096 tokens,
hidden 7,168, 256 experts, top-8, EP64, so 4 local experts of 4096 · 8 · 64 / 256 = 8,192
rows each as the inventory balances them): an FP8 element with its 1×128 scale is
1 + 4/128 = 1.03125 bytes, a cast reads 2 and writes 1.03125 bytes per element.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.model.kernels import reference as R
from moesim.program.inventory import layer_ops
from moesim.scenario import load_scenario
from moesim.wiring import resolve

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "scenarios" / "deepseek-v3-fb-pair.yaml"
FP8 = 1 + 4 / 128


def test_which_scenarios_list_them():
    assert R.for_scenario("stream", "fp8", "fp8", "fp8") == ()
    three = (R.ROUTING_MAP, R.FP8_ACT_CACHE, R.FP8_GRAD_DISPATCH)
    assert R.for_scenario("fused", "fp8", "fp8", "fp8") == three
    assert R.for_scenario("fused", "fp8", "fp8", "fp8", True) == R.NAMES
    # Megatron's sort is not DeepSeek's code
    assert R.SORT_CHUNKS not in R.for_scenario("deepseek", "fp8", "fp8", "fp8", True)
    assert R.for_scenario("liger", "bf16", "bf16", "bf16") == (R.ROUTING_MAP,)
    assert R.for_scenario("eager", "fp8", "bf16", "fp8") == (R.ROUTING_MAP,
                                                              R.FP8_GRAD_DISPATCH)


def _kernels(impl: str, pass_: str, *sets: str) -> dict[str, list]:
    res = resolve(load_scenario(PAIR, [f"compute.memory_kernels={impl}", *sets]))
    layer = next(i for i in range(res.model.layers) if res.model.is_moe_layer(i))
    out: dict[str, list] = {}
    for o in layer_ops(res, layer, pass_):
        for k in o.kernels:
            out.setdefault(k.name, []).append(k)
    return out


def test_stream_lists_none_of_them():
    names = set(_kernels("stream", "fwd")) | set(_kernels("stream", "dgrad"))
    assert not names & {"get_fused_mapping", "clean_and_count_expert", R.CACHE_CAST,
                        R.CAST_BACK, R.ATTN_CAST_BACK}


def test_the_pairs_kernels_by_hand():
    f, b = _kernels("fused", "fwd"), _kernels("fused", "dgrad")
    res = resolve(load_scenario(PAIR, ["compute.memory_kernels=fused"]))
    assert res.model.reference_kernels == (R.ROUTING_MAP, R.FP8_ACT_CACHE,
                                           R.FP8_GRAD_DISPATCH)   # DeepEP: no sort
    t, h, e = 4096, 7168, 256
    a = t * 8                                     # the rank's token copies (top-8)
    (gm,), (cc,) = f["get_fused_mapping"], f["clean_and_count_expert"]
    assert gm.bytes == a * 12 + 4 * e and gm.kclass == "permute"
    assert cc.bytes == a * 8 + 4 * e
    # each of the 4 local experts: its rows x 2 * 2048 (gate and up) cast, and back
    caches, backs = f[R.CACHE_CAST], b[R.CAST_BACK]
    assert len(caches) == len(backs) == 4
    rows = t * 8 * 64 // e                        # 8,192 rows per local expert
    assert caches[0].bytes == pytest.approx(rows * 4096 * (2 + FP8), rel=1e-12)
    assert backs[0].bytes == caches[0].bytes and backs[0].kclass == "cast"
    # the attention output (128 heads x 128) cast back for the attention backward
    (ab,) = b[R.ATTN_CAST_BACK]
    assert ab.bytes == pytest.approx(t * 128 * 128 * (2 + FP8), rel=1e-12)
    # FP8 gradients to the experts: token gradients cast, copies written in FP8
    (ub,) = b["unpermute_bwd"]
    assert ub.bytes == pytest.approx(FP8 * (t + a) * h + 4 * a, rel=1e-12)
    stream_ub = _kernels("stream", "dgrad")["unpermute_bwd"][0]
    assert stream_ub.bytes == 2 * (t * h + 2 * a * h) + 2 * 4 * a


def test_megatrons_sort_chunks_by_hand():
    """Megatron's all-to-all dispatcher (NCCL) with 4 local experts (EP64 of 256): the
    4,096 · 8 = 32,768 rows the rank sends (and, balanced, receives) sorted with their
    FP32 probs after the dispatch, 32,768 · 2 · (2 · 7168 + 4) = 939,786,240 B, and
    unsorted before the combine without them, 32,768 · 2 · 2 · 7168 = 939,524,096 B;
    the backward moves the same bytes; none under stream, deepseek or DeepEP."""
    def names(impl: str, backend: str, pass_: str) -> dict[str, list]:
        return _kernels(impl, pass_, f"parallel.ep_backend.kind={backend}")
    f, b = names("fused", "nccl", "fwd"), names("fused", "nccl", "dgrad")
    assert sorted(k.bytes for k in f["sort_chunks_by_idxs"]) == [939_524_096, 939_786_240]
    assert sorted(k.bytes for k in b["sort_chunks_by_idxs"]) == [939_524_096, 939_786_240]
    assert {k.kclass for k in f["sort_chunks_by_idxs"]} == {"permute"}
    assert {k.pass_ for k in b["sort_chunks_by_idxs"]} == {"dgrad"}
    for impl, backend in (("stream", "nccl"), ("deepseek", "nccl"), ("fused", "deepep")):
        assert "sort_chunks_by_idxs" not in names(impl, backend, "fwd")


def test_which_scenarios_sort_by_local_expert():
    """toy-cpu: 8 experts over EP2 (4 local), NCCL's all-to-all, a training step: listed;
    mixtral-8x7b-ep8: 8 experts over EP8, one local expert: not; serving: not."""
    def refs(name: str, over=()) -> tuple:
        return resolve(load_scenario(ROOT / "scenarios" / f"{name}.yaml",
                                     list(over))).model.reference_kernels
    assert R.SORT_CHUNKS in refs("toy-cpu")
    assert R.SORT_CHUNKS not in refs("toy-cpu", ["compute.memory_kernels=deepseek"])
    assert R.SORT_CHUNKS not in refs("mixtral-8x7b-ep8")
    assert R.SORT_CHUNKS not in refs("mixtral-8x7b-serve")
