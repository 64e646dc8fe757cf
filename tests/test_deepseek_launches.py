"""DeepSeek's kernels as its training code launches them (moesim.model.kernels.deepseek;
``compute.memory_kernels: deepseek`` only).

Hand-worked on DeepSeek's profiled pair (``deepseek-v3-fb-pair``: 4,096 tokens, hidden
7,168, 4 local experts of fc1 (n, k) = (4,096, 7,168) and fc2 (7,168, 2,048)): an FP8
weight element with its 128×128 scale is 1 + 4/128² bytes, a transpose reads and writes
it: 2 × (1 + 4/16,384) × n × k.
"""

from __future__ import annotations

from pathlib import Path

from moesim.model.kernels import deepseek as D
from moesim.model.kernels import reference as R
from moesim.model.kernels.linear import cast_bytes
from moesim.model.kernels.make import mem
from moesim.program.inventory import layer_ops
from moesim.scenario import load_scenario
from moesim.wiring import resolve

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "scenarios" / "deepseek-v3-fb-pair.yaml"
W8 = 1 + 4 / 128 ** 2


class _Spec:
    reference_kernels = (R.DEEPSEEK_LAUNCHES,)


def test_only_deepseek_lists_them():
    assert R.DEEPSEEK_LAUNCHES not in R.for_scenario("fused", "fp8", "fp8", "fp8")
    assert R.for_scenario("deepseek", "fp8", "fp8", "fp8") == (
        R.ROUTING_MAP, R.FP8_ACT_CACHE, R.FP8_GRAD_DISPATCH, R.DEEPSEEK_LAUNCHES)
    assert R.for_scenario("deepseek", "bf16", "bf16", "bf16") == (R.ROUTING_MAP,
                                                                  R.DEEPSEEK_LAUNCHES)


def test_scale_transpose_follows_each_token_cast():
    cast = mem("per_token_cast_to_fp8", cast_bytes(4096, 7168), "dgrad", "cast")
    rot = mem("recompute.rotary_kernel", 1000.0, "fwd", "elementwise")
    out = D.launches(_Spec(), [rot, cast])
    assert [k.name for k in out] == ["recompute.rotary_kernel", "per_token_cast_to_fp8",
                                     "scale_transpose"]
    # rotary: the same 1000 bytes over two launches (q's and k's)
    assert out[0].count == 2 and out[0].bytes == 1000.0
    # 4096 x 7168 / 128 FP32 scales read and written: 2 x 4 x 229,376 = 1,835,008 B
    st = out[2]
    assert abs(st.bytes - 1_835_008) < 1e-6
    assert st.pass_ == "dgrad" and st.kclass == "elementwise" and st.count == 1
    # not listed: the list as it is
    assert D.launches(object(), [rot, cast]) == [rot, cast]


def _ops(impl: str) -> dict[str, dict[str, list]]:
    res = resolve(load_scenario(PAIR, [f"compute.memory_kernels={impl}"]))
    layer = next(i for i in range(res.model.layers) if res.model.is_moe_layer(i))
    out: dict[str, dict[str, list]] = {}
    for p in ("fwd", "dgrad"):
        for o in layer_ops(res, layer, p):
            for k in o.kernels:
                out.setdefault(p, {}).setdefault(k.name, []).append(k)
    return out


def test_the_experts_weight_transposes_move_to_the_forward():
    ds, fu = _ops("deepseek"), _ops("fused")
    fwd_t = ds["fwd"]["batched_transpose"]
    # the 4 local experts' two weights each, in the forward
    fc1, fc2 = 2 * W8 * 4096 * 7168, 2 * W8 * 7168 * 2048
    assert sorted(k.bytes for k in fwd_t) == sorted([fc1, fc2] * 4)
    assert all(k.pass_ == "fwd" for k in fwd_t)
    assert "batched_transpose" not in fu["fwd"]
    # moved, not added: the backward keeps the other 7 (attention 5, shared expert 2)
    assert len(fu["dgrad"]["batched_transpose"]) == 15
    assert len(ds["dgrad"]["batched_transpose"]) == 7
    total = sum(k.bytes for k in fu["dgrad"]["batched_transpose"])
    assert abs(sum(k.bytes for k in fwd_t + ds["dgrad"]["batched_transpose"]) - total) < 1


def test_router_small_kernels_and_transposes_counted():
    ds, fu = _ops("deepseek"), _ops("fused")
    (ops,) = ds["fwd"][D.ROUTER_OPS]
    assert ops.count == 33 and ops.bytes == 0 and ops.kclass == "router"
    assert D.ROUTER_OPS not in fu["fwd"]
    # one scale transpose per token cast, in both passes
    for p in ("fwd", "dgrad"):
        casts = sum(k.count for k in ds[p]["per_token_cast_to_fp8"])
        assert sum(k.count for k in ds[p][D.SCALE_T]) == casts
    assert D.SCALE_T not in fu["fwd"]
    assert [k.count for k in ds["fwd"]["rotary_kernel"]] == [2]


def test_the_routing_weights_gradient_by_hand():
    ds, fu = _ops("deepseek"), _ops("fused")
    wg = ds["dgrad"][D.WEIGHT_GRAD]
    # each of the 4 local experts' 8,192 rows: its FP8 SwiGLU input (2 x 2048 wide, with
    # scales), the BF16 gradient of its 2048 outputs, one FP32 out:
    # 8192 x (4096 x 1.03125 + 2048 x 2 + 4) = 8192 x 8324 = 68,190,208 B
    assert [k.bytes for k in wg] == [68_190_208.0] * 4
    assert all(k.kclass == "elementwise" and k.pass_ == "dgrad" for k in wg)
    assert D.WEIGHT_GRAD not in fu["dgrad"] and D.WEIGHT_GRAD not in ds["fwd"]
