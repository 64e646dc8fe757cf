"""DeepSeek's permutation kernels under ``compute.memory_kernels: deepseek``
(moesim.model.kernels.deepseek ``reduce_fused``, ``routing_map_launches``;
moesim.compute.occupancy).

Hand-worked on DeepSeek's profiled pair (``deepseek-v3-fb-pair``): 4,096 tokens, top-8,
so a = 32,768 expert rows on the rank, hidden h = 7,168, 256 experts; the rank receives
at most a tokens (the bound the model lists), so the received tokens' top-k indices are
a × 8 = 262,144 int64.

- unpermute, DeepSeek's reduce before the combine: read a BF16 rows, write a (received)
  BF16 rows, read each received token's 8 FP32 weights and 8 int32 positions:
  2 · 7,168 · 65,536 + 8 · 262,144 = 939,524,096 + 2,097,152 = 941,621,248 B.
- clean_and_count_expert: read 262,144 int64, write −1 over 262,144 int32 positions and
  3 × 32,768 int32 maps, 256 int32 counts: 3,145,728 + 393,216 + 1,024 = 3,539,968 B.
- get_fused_mapping: read 262,144 int64, write 4 int32 per row and 2 × 256 int32:
  2,097,152 + 524,288 + 2,048 = 2,623,488 B.
- unpermute_bwd, the FP8 gradient expand on the experts' side: the received (<= a) rows
  read and a written in FP8 with 1×128 scales (1 + 4/128 = 1.03125 B an element) plus
  an int32 row map: 2 · 1.03125 · 32,768 · 7,168 + 4 · 32,768 = 484,573,184 B, the
  forward's permute; on the tokens' side (fused) 1.03125 · (4,096 + 32,768) · 7,168 +
  131,072 = 272,629,760 B.
- priced: the routing-map kernels on 4 SMs at 25 % (gpu-stream: 1,395 GB/s on 132 SMs):
  4 · 1,395 / 132 = 42.2727 GB/s, so 2,623,488 B take 62.061 µs and 3,539,968 B 83.740 µs;
  the reduce at 75 % with 112 B in flight (1,050 %: past the curve) at the 3,000 GB/s
  stream rate: 313.874 µs.
"""

from __future__ import annotations

import math
from pathlib import Path

from moesim.compute.base import Kernel
from moesim.compute.catalog import CatalogModel
from moesim.compute.catalog_data import load_file
from moesim.compute.devices import get_device
from moesim.compute.roofline import RooflineModel
from moesim.model.kernels import deepseek as D
from moesim.program.inventory import layer_ops
from moesim.scenario import load_scenario
from moesim.wiring import resolve

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "scenarios" / "deepseek-v3-fb-pair.yaml"
STREAM = """
tables:
  - id: stream
    kind: memory
    dtype: any
    passes: [fwd, dgrad, wgrad]
    devices: [H100]
    gbps: 3000
    source: a test
"""


def _kernels(impl: str) -> dict[tuple[str, str], Kernel]:
    res = resolve(load_scenario(PAIR, [f"compute.memory_kernels={impl}"]))
    layer = next(i for i in range(res.model.layers) if res.model.is_moe_layer(i))
    return {(p, k.name): k for p in ("fwd", "dgrad") for o in layer_ops(res, layer, p)
            for k in o.kernels if k.kclass == "permute"}


def test_the_permutation_kernels_bytes_by_hand():
    ds, fu = _kernels("deepseek"), _kernels("fused")
    assert ds["fwd", "unpermute"].bytes == 941_621_248
    assert ds["fwd", "clean_and_count_expert"].bytes == 3_539_968
    assert ds["fwd", "get_fused_mapping"].bytes == 2_623_488
    # the same kernels under fused: Megatron's unpermute after the combine (a rows in,
    # a / 8 out, FP32 weights) and the index maps over a copies
    a, h = 32_768, 7_168
    assert fu["fwd", "unpermute"].bytes == 2 * (a * h + a // 8 * h) + 4 * a
    assert fu["fwd", "get_fused_mapping"].bytes == 12 * a + 4 * 256
    assert ds["dgrad", "unpermute_bwd"].bytes == 484_573_184 == ds["fwd", "permute"].bytes
    assert fu["dgrad", "unpermute_bwd"].bytes == 272_629_760
    # the backward's reduce (permute_bwd) already reads and writes a rows: unchanged
    assert ds["dgrad", "permute_bwd"].bytes == fu["dgrad", "permute_bwd"].bytes \
        == 4 * a * h + 4 * a


def test_the_rewrite_leaves_the_backward_and_other_names_alone():
    class Spec:
        reference_kernels = ("deepseek_launches",)
        hidden, top_k, n_experts = 7_168, 8, 256

    # the BF16 unpermute_bwd (no FP8 gradient dispatch listed) is left as it is
    bwd = Kernel("unpermute_bwd", 0.0, 5.0, kind="memory", pass_="dgrad", kclass="permute")
    other = Kernel("permute", 0.0, 7.0, kind="memory", pass_="fwd", kclass="permute")
    assert D.launches(Spec(), [bwd, other]) == [bwd, other]
    up = Kernel("recompute.unpermute", 2.0 * 10 * 7_168, 1.0, kind="memory", pass_="fwd",
                kclass="permute")
    (got,) = D.launches(Spec(), [up])
    # 10 rows: 2 x 7,168 x 20 + 8 x 80 = 287,360 B; the name kept
    assert got.name == "recompute.unpermute" and got.bytes == 287_360


def test_one_kernels_time_from_its_geometry_and_bytes(tmp_path):
    p = tmp_path / "stream.yaml"
    p.write_text(STREAM)
    ds = CatalogModel(RooflineModel(get_device("H100"), precision="bf16",
                                    launch_overhead_s=0.0), tuple(load_file(p)),
                      memory_kernels="deepseek")
    ks = _kernels("deepseek")
    per_sm = 4 * 1395 / 132 * 1e9                      # 42.2727 GB/s on 4 SMs
    gm = ds.price(ks["fwd", "get_fused_mapping"]).time_s
    cc = ds.price(ks["fwd", "clean_and_count_expert"]).time_s
    assert math.isclose(gm, 2_623_488 / per_sm, rel_tol=1e-12)
    assert math.isclose(gm, 62.061e-6, rel_tol=1e-4)
    assert math.isclose(cc, 83.740e-6, rel_tol=1e-4)
    up = ds.price(ks["fwd", "unpermute"])
    assert math.isclose(up.time_s, 941_621_248 / 3000e9, rel_tol=1e-12)
    assert math.isclose(up.time_s, 313.874e-6, rel_tol=1e-5)
    assert "112 B in flight" in up.detail


def test_the_gradient_expand_from_the_tokens_side_by_hand():
    class Spec:
        reference_kernels = ("fp8_grad_dispatch", "deepseek_launches")
        hidden, top_k, n_experts = 7_168, 8, 256

    # a = 10 copies of 2 tokens (top-8): 1.03125 x (2 + 10) x 7,168 + 4 x 10 = 88,744 B
    # on the tokens' side; on the experts' side 2 x 1.03125 x 10 x 7,168 + 40 = 147,880
    grad = Kernel("unpermute_bwd", 0.0, 88_744.0, kind="memory", pass_="dgrad",
                  kclass="permute")
    (got,) = D.launches(Spec(), [grad])
    assert got.bytes == 147_880
