"""2:4 structured sparsity (issue 41, item 3): weight bytes (half plus 2-bit metadata),
a sparse GEMM's time on a tiny shape by hand, and a device without sparse tensor cores
refused in one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.compute.base import Kernel
from moesim.compute.catalog import price
from moesim.compute.devices import get_device
from moesim.compute.select import compute_model, parse
from moesim.compute.sparsity import check, sparse_weight_bytes
from moesim.errors import InputError
from moesim.memory.checkpoint import weight_element_bytes
from moesim.model.presets import PRESETS
from tests._util import refused

REPO = Path(__file__).resolve().parents[1]


def test_sparse_bytes():
    # half the values + 2 bits per kept value: BF16 0.5·2 + 0.5·0.25 = 1.125 bytes
    assert sparse_weight_bytes(2) == 1.125
    # INT4 + 2:4 (Sparse-Marlin's storage): 0.5·0.515625 + 0.125
    spec = PRESETS["toy"]
    both = parse({"weights": "int4", "sparsity": "2:4"}, "s.yaml")
    assert weight_element_bytes(spec, both) == 0.5 * 33 / 64 + 0.125


def test_yaml_base60_reading_of_2_4():
    # an unquoted 2:4 reaches the section as 124 from a YAML 1.1 reader
    assert check(124, "s") == "2:4"
    assert parse({"sparsity": 124}, "s").sparsity == "2:4"


def _gemm(m: int, n: int, k: int) -> Kernel:
    return Kernel("expert_gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m=m, n=n,
                  k=k, kind="gemm", pass_="fwd", kclass="gemm")


def test_sparse_gemm_a100_by_hand():
    model = compute_model({"sparsity": "2:4"}, "s.yaml", get_device("A100"))
    m, n, k = 256, 512, 1024
    p = price(model, _gemm(m, n, k))
    # dense math on the roofline: 0.75 · 256/(256+128) of 312 TFLOP/s, then the published
    # CUTLASS speed-up on A100, 0.870/0.630
    math = 2 * m * n * k / (312e12 * 0.75 * 256 / 384) / (0.870 / 0.630)
    memory = (2 * m * k + 1.125 * k * n + 2 * m * n) / (2.04e12 * 0.8)
    assert math > memory
    assert p.time_s == pytest.approx(4e-6 + math, rel=1e-12)


def test_sparse_gemm_h100_roofline_twice():
    model = compute_model({"sparsity": "2:4"}, "s.yaml", get_device("H100"))
    m, n, k = 256, 512, 1024
    p = price(model, _gemm(m, n, k))
    math = 2 * m * n * k / (989e12 * 0.75 * 256 / 384) / 2
    memory = (2 * m * k + 1.125 * k * n + 2 * m * n) / (3.35e12 * 0.8)
    assert p.time_s == pytest.approx(4e-6 + max(math, memory), rel=1e-12)
    assert p.source == "roofline"      # no Hopper figure published: counted


def test_decode_gemm_gains_the_bytes():
    model = compute_model({"sparsity": "2:4"}, "s.yaml", get_device("H100"))
    base = compute_model({}, "s.yaml", get_device("H100"))
    kern = _gemm(1, 4096, 4096)
    nbytes = 2 * 4096 + 1.125 * 4096 * 4096 + 2 * 4096
    assert price(model, kern).time_s == pytest.approx(4e-6 + nbytes / (3.35e12 * 0.8))
    assert price(model, kern).time_s < price(base, kern).time_s


def test_no_sparse_cores_one_line():
    with pytest.raises(InputError) as e:
        compute_model(parse({"sparsity": "2:4"}, "s"), "s", get_device("cpu"))
    assert "compute.sparsity" in str(e.value) and "cpu" in str(e.value)
    with pytest.raises(InputError):
        parse({"sparsity": "1:4"}, "s")


def test_cpu_exit_2(capsys, tmp_path):
    refused(capsys, ["run", REPO / "scenarios" / "toy-cpu.yaml", "--set",
                     "compute.sparsity=2:4", "-o", tmp_path / "o"], "compute.sparsity", "cpu")


def test_sparse_fp8_checkpoint_halves_its_stored_bytes():
    # model.weight_bytes: 1 (an FP8 checkpoint served): serving hands the model the
    # stored bytes (QuantModel.stored) in place of its WeightBytes wrapper, so the 2:4
    # weight is 0.5·1 + 0.125 bytes per element, counted once
    model = compute_model({"sparsity": "2:4"}, "s.yaml", get_device("H100")).stored(1)
    kern = _gemm(1, 4096, 4096)
    nbytes = 2 * 4096 + 0.625 * 4096 * 4096 + 2 * 4096
    assert model.time_s(kern) == pytest.approx(4e-6 + nbytes / (3.35e12 * 0.8))
