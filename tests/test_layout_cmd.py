"""``moesim layout`` and ``moesim memory --matmul``: groups and tensors worked by hand."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.memory.matmul import matmul_report
from moesim.units import GiB


def test_layout_rank_37_of_the_qwen3_recipe(capsys):
    # TP2 EP32 PP8 DP16 on 32 nodes of 8: attention rank = tp + 2*dp + 32*pp, so rank 37 is
    # tp 1, dp 2, pp 1; experts rank = ep + 32*pp (etp 1, edp 1): ep 5
    assert main(["layout", "qwen3-235b-256gpu", "--rank", "37", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["coords"] == {"tp": 1, "cp": 0, "dp": 2, "pp": 1, "ep": 5, "etp": 0, "edp": 0}
    g = t["groups"]
    assert g["tp"]["ranks"] == [36, 37] and not g["tp"]["crosses_nodes"]
    assert g["ep"]["ranks"] == list(range(32, 64)) and g["ep"]["nodes"] == [
        r // 8 for r in range(32, 64)]
    assert g["dp"]["ranks"] == list(range(33, 64, 2)) and g["dp_cp"] == {**g["dp"],
        "megatron": "DATA_PARALLEL_GROUP_WITH_CP", "carries": "dense gradient reduction"}
    assert g["pp"]["ranks"] == list(range(5, 256, 32)) and g["pp"]["crosses_nodes"]
    assert g["edp"]["ranks"] == [37] and g["etp"]["ranks"] == [37]


def test_layout_with_etp_and_text(capsys):
    assert main(["layout", "qwen3-235b-256gpu", "--rank", "37", "--set", "parallel.etp=2",
                 "--set", "parallel.ep=16"]) == 0
    out = capsys.readouterr().out
    assert "MoE etp=2 ep=16 edp=1" in out
    assert "etp       2  36,37" in out and "ep       16  33-63 step 2" in out


@pytest.mark.parametrize("argv, text", [
    (["layout", "qwen3-235b-256gpu", "--rank", "256"], "command line: --rank: expected a rank"),
    (["layout", "qwen3-235b-256gpu", "--set", "parallel.ep=64"],
     "parallel.ep: expected etp*ep (etp=1, ep=64) to divide tp*cp*dp = 32"),
    (["memory", "--matmul", "8", "8", "8", "--tp", "3"], "--tp: expected a divisor of n = 8"),
    (["memory", "--matmul", "8", "8", "8", "--dtype", "int3"], "--dtype: expected one of"),
    (["memory"], "scenario: expected a scenario file or --matmul"),
])
def test_bad_input_is_one_line(argv, text, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1


def test_matmul_65536_bf16_by_hand():
    # 2 bytes x 65536^2 = 8 GiB per tensor; forward X, W, Y = 24 GiB
    t = matmul_report(65536, 65536, 65536, "bf16", tp=8, pp=8)
    by = {x["name"].split()[0]: x for x in t["tensors"]}
    assert all(by[k]["bytes"] == 8 * GiB for k in ("X", "W", "Y", "dY", "dX", "dW"))
    assert t["forward_bytes"] == 24 * GiB
    # training: + dY, dX, dW and 12 bytes per parameter of Adam state = 24 + 24 + 48
    assert by["Adam"]["bytes"] == 48 * GiB and t["training_bytes"] == 96 * GiB
    # W, dW and Adam: 16 bytes per parameter
    assert by["W"]["bytes"] + by["dW"]["bytes"] + by["Adam"]["bytes"] == 16 * 65536**2
    # tp 8 splits W and Y (and dW, dY, Adam) by columns; X and dX stay whole
    assert by["W"]["gpu_bytes"] == by["Y"]["gpu_bytes"] == 1 * GiB
    assert by["X"]["gpu_bytes"] == by["dX"]["gpu_bytes"] == 8 * GiB
    assert t["forward_gpu_bytes"] == 10 * GiB and t["training_gpu_bytes"] == 26 * GiB
    # pp 8 cannot split one matmul: one stage holds all of it
    assert t["stage_gpu_bytes"] == [26 * GiB] + [0.0] * 7


def test_matmul_tp1_and_fp32():
    t = matmul_report(2, 3, 4, "fp32")
    assert t["forward_bytes"] == 4 * (6 + 12 + 8)
    # fp32: weights 4 + grads 4 + Adam m, v 8 = 16 bytes per parameter
    assert t["training_bytes"] == 4 * (6 + 12 + 8) + 4 * (8 + 6 + 12) + 8 * 12
    assert t["forward_gpu_bytes"] == t["forward_bytes"]


def test_memory_and_memory_matmul_print_the_same_unit(capsys):
    """Issue 20 item 12: `memory --matmul` reports the unit `memory` does, GiB (2^30
    bytes, the unit device memory is reported in, issue 36 item 4). bf16 at m = k = n =
    65536: 2 × 65536² = 2^33 bytes = 8 GiB per tensor, 24 GiB in forward."""
    assert main(["memory", "--matmul", "65536", "65536", "65536"]) == 0
    text = capsys.readouterr().out
    assert "GiB (2^30 bytes)" in text and "GB (10^9" not in text
    assert "forward (X, W, Y): 24.000 GiB in all" in text
    w_row = next(ln for ln in text.splitlines() if ln.startswith("W "))
    assert "8.000" in w_row
    assert main(["memory", "toy-cpu"]) == 0
    assert "GiB (2^30 bytes)" in capsys.readouterr().out
