"""Bandwidth by occupancy and ``compute.memory_kernels: deepseek`` (moesim.compute.occupancy).

Hand figures from gpu-benches' gpu-stream H200 curve (scale kernel, 132 SMs):
- 25.0 % is a point: 1,395 GB/s; 19 % lies 0.2/3.1 of the way from 18.8 % (1,120) to
  21.9 % (1,250): 1120 + 130 · 0.2 / 3.1 = 1,128.387 GB/s; 1.5 % is half of the first
  point's 3 %: 240 / 2 = 120 GB/s; past 100 %: 3,165.
- 4 blocks at 25 % (the routing-map kernels): 4 of the 132 SMs, 4 · 1395 / 132 =
  42.2727 GB/s; 0.4 MB take 0.4e6 / 42.2727e9 = 9.4624 µs (at the 3,000 GB/s stream
  rate: 0.1333 µs).
- reduce_fused (unpermute) at 75 % with 112 B in flight per thread (each of 128 threads
  holds 56 BF16 of a 7,168 row: TileKernels' reduce_fused): 75 · 112 / 8 = 1,050 %,
  past the curve (3,165 GB/s), so a 3,000 GB/s stream rate caps it, and a 2,000 one.
- bytes in flight scale the occupancy (Little's law): flash-attention's norm, 19 % with
  112 B per thread, is 19 · 112 / 8 = 266 %, at the stream rate; its backward, 13 % with
  32 B, is 52 %: 2263 + 71 · 2 / 3.1 = 2,308.806 GB/s.
"""

from __future__ import annotations

import math

import pytest

from moesim.compute.base import Kernel
from moesim.compute.catalog import CatalogModel
from moesim.compute.catalog_data import load_file
from moesim.compute.devices import get_device
from moesim.compute.memory_kernels import IMPLS
from moesim.compute.occupancy import DEEPSEEK, curve_gbps, rate_gbps
from moesim.compute.roofline import RooflineModel
from moesim.compute.select import parse
from moesim.errors import InputError
from moesim.validation.gpu.classes import simulated_class

H100 = get_device("H100")
STREAM = """
tables:
  - id: stream
    kind: memory
    dtype: any
    passes: [fwd, dgrad, wgrad]
    devices: [H100]
    gbps: {gbps}
    source: a test
"""


def model(tmp_path, impl: str, gbps: float = 3000) -> CatalogModel:
    p = tmp_path / "stream.yaml"
    p.write_text(STREAM.format(gbps=gbps))
    return CatalogModel(RooflineModel(H100, precision="bf16", launch_overhead_s=0.0),
                        tuple(load_file(p)), memory_kernels=impl)


def kernel(name: str, nbytes: float, kclass: str = "norm", pass_: str = "fwd") -> Kernel:
    return Kernel(name, 0.0, nbytes, kind="memory", pass_=pass_, kclass=kclass)


def test_the_curve_by_hand():
    assert curve_gbps(25.0) == 1395
    assert math.isclose(curve_gbps(19.0), 1120 + 130 * 0.2 / 3.1, rel_tol=1e-12)
    assert math.isclose(curve_gbps(19.0), 1128.387, rel_tol=1e-6)
    assert curve_gbps(1.5) == 120.0 and curve_gbps(0.0) == 0.0
    assert curve_gbps(100.0) == curve_gbps(150.0) == 3165


def test_blocks_and_the_stream_cap_by_hand():
    assert math.isclose(rate_gbps(25.0, 4, 132, 3000), 4 * 1395 / 132, rel_tol=1e-12)
    assert math.isclose(rate_gbps(25.0, 4, 132, 3000), 42.2727, rel_tol=1e-5)
    assert rate_gbps(25.0, 0, 132, 3000) == 1395          # 0 blocks: every SM
    assert rate_gbps(25.0, 500, 132, 3000) == 1395        # more blocks than SMs
    assert rate_gbps(100.0, 0, 132, 3000) == 3000         # the stream rate caps it
    assert rate_gbps(75.0, 0, 132, 3000) == 2844


def test_deepseek_prices_its_own_kernels_by_occupancy(tmp_path):
    ds, fused = model(tmp_path, "deepseek"), model(tmp_path, "fused")
    route = kernel("get_fused_mapping", 0.4e6, kclass="permute")
    p = ds.price(route)
    assert math.isclose(p.time_s, 0.4e6 / (4 * 1395 / 132 * 1e9), rel_tol=1e-12)
    assert math.isclose(p.time_s, 9.4624e-6, rel_tol=1e-4)
    assert "4 blocks" in p.detail and "gpu-stream" in p.detail
    assert math.isclose(fused.price(route).time_s, 0.4e6 / 3000e9, rel_tol=1e-12)
    # flash-attention's norm: 19 % x 112 B / 8 B = 266 %, past the curve: the stream
    # rate, recomputed or not (3 MB in 1 µs)
    for name in ("norm", "recompute.norm"):
        assert DEEPSEEK["norm"].effective == 19.0 * 14
        assert math.isclose(ds.price(kernel(name, 3e6)).time_s, 1e-6, rel_tol=1e-12)
    # its backward: 13 % x 32 B / 8 B = 52 %, 2/3.1 of the way from 50 % (2,263) to
    # 53.1 % (2,334): 2,308.806 GB/s; 2,308.806 MB take 1 ms
    nb = ds.price(kernel("norm_bwd", 2308.806e6, pass_="dgrad"))
    assert math.isclose(nb.time_s, 1e-3, rel_tol=1e-6) and "32 B in flight" in nb.detail
    # unpermute at 75 % x 112 B / 8 B = 1,050 %: the stream's 3,000 GB/s (3 MB in 1 µs),
    # the stream's 2,000 under 2,000
    assert DEEPSEEK["unpermute"].effective == DEEPSEEK["permute_bwd"].effective == 1050.0
    up = kernel("unpermute", 3e6, kclass="permute")
    assert math.isclose(ds.price(up).time_s, 1e-6, rel_tol=1e-12)
    assert math.isclose(model(tmp_path, "deepseek", 2000).price(up).time_s,
                        3e6 / 2000e9, rel_tol=1e-12)


def test_deepseek_prices_every_other_kernel_as_fused(tmp_path):
    ds, fused = model(tmp_path, "deepseek"), model(tmp_path, "fused")
    for k in (kernel("per_token_cast_to_fp8", 3e6, kclass="cast"),
              kernel("residual_add", 3e6, kclass="elementwise"),
              kernel("_copy_tensor_kernel", 3e6, kclass="elementwise")):
        assert k.name.removeprefix("recompute.") not in DEEPSEEK
        assert ds.price(k).time_s == fused.price(k).time_s == 3e6 / 3000e9


def test_the_knob_takes_deepseek_and_tables_do_not():
    assert "deepseek" in IMPLS
    assert parse({"memory_kernels": "deepseek"}, "s").memory_kernels == "deepseek"
    with pytest.raises(InputError, match=r"compute\.memory_kernels"):
        parse({"memory_kernels": "dpsk"}, "s")


def test_a_table_naming_deepseek_is_refused(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("tables:\n  - id: one\n    kind: memory_op\n    op: cast\n"
                 "    impls: [deepseek]\n    dtype: any\n    passes: [fwd]\n"
                 "    devices: [H100]\n    source: s\n    gbps: 1500\n")
    with pytest.raises(InputError, match=r"impls"):
        load_file(p)


def test_batched_transpose_is_elementwise_on_both_sides():
    # the profile's classifier puts transposes under elementwise; the inventory's FP8
    # transpose has kclass cast, and compares under elementwise too
    assert simulated_class(kernel("batched_transpose", 1e6, kclass="cast")) == "elementwise"
    assert simulated_class(kernel("per_token_cast_to_fp8", 1e6, kclass="cast")) == "cast"


def test_waves_on_the_sms_deepep_leaves_by_hand(tmp_path):
    """On 112 of the 132 SMs (DeepEP holds 20), 3,000 GB/s stream:
    - ln_bwd (grid 132, one block per SM, 13 % · 32 B / 8 B = 52 %: 2,308.806 GB/s on
      132): 112 blocks move 112/132 of the bytes at 112/132 of that rate, then 20 blocks
      the other 20/132 at 20/132 of it: twice the time (not 132/112);
    - ln_fwd (grid 396 = 132 x 3, 3 per SM at 19 %, 112 B: each block 88.667 % of
      gpu-stream's occupancy): on 132 SMs the stream rate, 3,000 GB/s; on 112, 336
      blocks at min(3000, 112 · 3165 / 132 = 2,685.45) then 60 blocks one per SM at
      60 · curve(88.667) / 132 = 60 · (3042 + 37 · 1.1667 / 3.1) / 132 = 1,389.06 GB/s:
      3000 · (336/396 / 2685.45 + 60/396 / 1389.06) = 1.27510 times;
    - cast_back (grid 112, one per SM) loses nothing: 1;
    - under fused the S / sms rule: 132 / 112."""
    from moesim.compute.occupancy import wave_ratio
    from moesim.compute.sm_share import OnSms
    assert wave_ratio(DEEPSEEK["norm_bwd"], 112, 132, 3000) == 2.0
    assert math.isclose(wave_ratio(DEEPSEEK["norm"], 112, 132, 3000), 1.27510, rel_tol=1e-5)
    assert wave_ratio(DEEPSEEK["cast_back"], 112, 132, 3000) == 1.0
    assert wave_ratio(DEEPSEEK["expert_act_bwd"], 112, 132, 3000) is None  # per SM unknown
    ds, fused = model(tmp_path, "deepseek"), model(tmp_path, "fused")
    k = kernel("norm_bwd", 1e8, pass_="dgrad")
    assert math.isclose(OnSms(ds, 112).time_s(k), 2 * ds.time_s(k), rel_tol=1e-12)
    assert math.isclose(OnSms(fused, 112).time_s(k), fused.time_s(k) * 132 / 112,
                        rel_tol=1e-12)
    back = kernel("cast_back", 1e8, kclass="cast", pass_="dgrad")
    assert math.isclose(OnSms(ds, 112).time_s(back), ds.time_s(back), rel_tol=1e-12)
    # on its 112 blocks, alone as beside DeepEP: 112 · curve(50 %) / 132 =
    # 112 · 2263 / 132 = 1,920.12 GB/s (the profile's 42 % is 112 blocks' 32 warps
    # averaged over 132 SMs: 27.15 warps per SM)
    assert math.isclose(ds.time_s(back), 1e8 / (112 * 2263 / 132 * 1e9), rel_tol=1e-12)
