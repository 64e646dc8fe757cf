"""Quantised checkpoints (issue 41, item 2): bytes per weight and KV element on the toy
model, a Marlin-class INT4 GEMM's time worked out by hand, and bad input (unknown mode,
a mode the device cannot run) as one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.compute.base import Kernel
from moesim.compute.catalog import price
from moesim.compute.devices import get_device
from moesim.compute.quant import FORMATS, mode_of
from moesim.compute.select import compute_model, describe, parse
from moesim.errors import InputError
from moesim.memory.checkpoint import checkpoint_spec
from moesim.model.presets import PRESETS
from moesim.serve.kv import kv_bytes_per_token
from moesim.serve.memory import weight_bytes
from tests._util import refused

REPO = Path(__file__).resolve().parents[1]
TOY = PRESETS["toy"]
# the toy model's parameters on one rank (tp = ep = 1), by hand: per layer MHA attention
# 4·512² = 1,048,576, two norms 1,024, router 512·8 = 4,096, 8 SwiGLU experts
# 8·3·512·1024 = 12,582,912 (13,636,608 per layer, 2 layers); embedding and LM head
# 32,000·512 each; the final norm 512
TOY_PARAMS = 2 * 13_636_608 + 2 * 16_384_000 + 512


def test_format_bytes_per_element():
    # INT4 with an FP16 scale per group of 128: 4 + 16/128 bits (Marlin's 0.125 bits)
    assert FORMATS["int4"].weight_bytes() == (4 + 0.125) / 8
    assert FORMATS["int8"].weight_bytes() == (8 + 0.125) / 8
    # NVFP4: an 8-bit E4M3 scale per 16 values; MXFP8: an 8-bit E8M0 scale per 32
    assert FORMATS["nvfp4"].weight_bytes() == 4.5 / 8
    assert FORMATS["mxfp8"].act_bytes() == 8.25 / 8
    # DeepSeek-V3's FP8 blocks: an FP32 scale per 128x128 weights, per 1x128 activations
    assert FORMATS["fp8-block"].weight_bytes() == 1 + 4 / 128 ** 2
    assert FORMATS["fp8-block"].act_bytes() == 1 + 4 / 128


@pytest.mark.parametrize("weights, per_param", [
    (None, 2), ("fp8", 1), ("int4", 33 / 64), ("nvfp4", 9 / 16), ("int8", 65 / 64)])
def test_toy_weight_bytes_per_mode(weights, per_param):
    section = parse({} if weights is None else {"weights": weights}, "s.yaml")
    spec = checkpoint_spec(TOY, section)
    assert weight_bytes(TOY, 1, 1) == 2 * TOY_PARAMS
    assert weight_bytes(spec, 1, 1) == TOY_PARAMS * per_param
    if weights is None:
        assert spec is TOY          # off: the model itself, byte-identical summaries


def test_kv_cache_bytes_fp8():
    # 2 (K, V) x 2 layers x 8 KV heads x 64 features per token: 2 bytes, FP8 1 byte
    assert kv_bytes_per_token(TOY, 2) == 2 * 2 * 8 * 64 * 2
    assert kv_bytes_per_token(TOY, 1) == 2 * 2 * 8 * 64


def _gemm(m: int, n: int, k: int) -> Kernel:
    return Kernel("dense_gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m=m, n=n,
                  k=k, kind="gemm", pass_="fwd", kclass="gemm")


def test_marlin_int4_decode_gemm_by_hand():
    a100 = get_device("A100")
    model = compute_model({"weights": "int4"}, "s.yaml", a100)
    p = price(model, _gemm(1, 4096, 4096))
    # bytes: the BF16 input and output row (2·4096 each) and the INT4 weight with its
    # scales, 4096² x 0.515625 = 8,650,752
    nbytes = 2 * 4096 + 2 * 4096 + 4096 * 4096 * 0.515625
    memory = nbytes / (2.04e12 * 0.8)                 # the roofline's achieved HBM rate
    math = 2 * 4096 * 4096 / (312e12 * 0.75 / 16)     # one row in a 16-row FP16 tile
    assert memory > math
    assert p.time_s == pytest.approx(4e-6 + memory, rel=1e-12)
    assert p.source == "catalog"      # Marlin's published regime (up to 32 rows)
    # above 32 rows the same formula is the roofline's, and counted so
    assert price(model, _gemm(64, 4096, 4096)).source == "roofline"


def test_kernels_other_than_weight_gemms_unchanged():
    h100 = get_device("H100")
    base = compute_model({}, "s.yaml", h100)
    q = compute_model({"weights": "int4"}, "s.yaml", h100)
    for k in (Kernel("norm", 0.0, 1e6, kind="memory", pass_="fwd"),
              Kernel("lm_head", 2.0 * 8 * 4096 * 1000, 1e7, m=8, n=1000, k=4096,
                     kind="gemm", pass_="fwd"),
              Kernel("dense_gemm_dgrad", 2.0 * 8 * 4096 * 4096, 1e7, m=8, n=4096, k=4096,
                     kind="gemm", pass_="dgrad")):
        assert q.time_s(k) == base.time_s(k)


def test_modes_and_describe():
    assert mode_of("int8", None, "s").activations == "bf16"
    assert mode_of("int8", "int8", "s").math == "int8"
    assert mode_of("fp8-block", None, "s").activations == "fp8-block"
    assert describe(parse({"weights": "int4"}, "s")).endswith("; int4 weights, bf16 activations")
    assert describe(parse({}, "s")) == "kernel catalog, roofline where it has no row"


@pytest.mark.parametrize("section, device, field", [
    ({"weights": "int3"}, "H100", "compute.weights"),
    ({"activations": "fp8"}, "H100", "compute.activations"),
    ({"weights": "int4", "activations": "fp8"}, "H100", "compute.activations"),
    ({"weights": "nvfp4"}, "H100", "compute.weights"),
    ({"weights": "mxfp8"}, "H100", "compute.weights"),
    ({"weights": "fp8"}, "A100", "compute.weights"),
])
def test_bad_modes_one_line(section, device, field):
    with pytest.raises(InputError) as e:
        compute_model(parse(section, "s.yaml"), "s.yaml", get_device(device))
    assert field in str(e.value) and "\n" not in str(e.value)


def test_nvfp4_on_h100_exit_2(capsys, tmp_path):
    line = refused(capsys, ["serve", REPO / "scenarios" / "mixtral-8x7b-serve.yaml",
                            "--set", "compute.weights=nvfp4", "-o", tmp_path / "o"],
                   "compute.weights", "H100", "nvfp4")
    assert "fp4" in line


def test_unknown_mode_exit_2(capsys, tmp_path):
    refused(capsys, ["run", REPO / "scenarios" / "toy-cpu.yaml", "--set",
                     "compute.weights=int2", "-o", tmp_path / "o"], "compute.weights", "int2")


def test_blackwell_formats_on_a_device_with_an_fp4_peak():
    # a device with FP4 and INT8 peaks (no catalog table covers it: the roofline alone);
    # numbers chosen to work by hand, not a real part
    from moesim.compute.devices import DeviceSpec
    dev = DeviceSpec("fp4-test", 1e15, 1e11, 4e12, peak_fp8_flops=2e15,
                     peak_fp4_flops=4e15, peak_int8_ops=2e15)
    m, n, k = 4096, 4096, 4096
    eff = 0.75 * 4096 / (4096 + 128)                  # the roofline's curve at 4096 rows
    for weights, acts, peak, w_bytes, a_bytes in (
            ("nvfp4", None, 4e15, 4.5 / 8, 4.5 / 8),
            ("mxfp8", None, 2e15, 8.25 / 8, 8.25 / 8),
            ("int8", "int8", 2e15, 8.125 / 8, 1.0)):
        section = {"weights": weights, **({"activations": acts} if acts else {})}
        p = price(compute_model(section, "s.yaml", dev), _gemm(m, n, k))
        math = 2 * m * n * k / (peak * eff)
        memory = (a_bytes * m * k + w_bytes * k * n + 2 * m * n) / (4e12 * 0.8)
        assert p.time_s == pytest.approx(4e-6 + max(math, memory), rel=1e-12), weights
        assert p.source == "roofline"


def test_qwen3_06b_preset_by_hand():
    # the Qwen speed benchmark's model (Qwen/Qwen3-0.6B config.json): per layer q 1024 x 2048
    # + k, v 2 x 1024 x 1024 + o 2048 x 1024 = 6,291,456; FFN 3 x 1024 x 3072 = 9,437,184;
    # norms 2 x 1024 -> 15,730,688 x 28 = 440,459,264; tied embedding 151936 x 1024
    # = 155,582,464; final norm 1024
    from moesim.model.params import count_params
    from moesim.model.presets import PRESETS
    assert count_params(PRESETS["qwen3-0.6b"]).total == 596_042_752
