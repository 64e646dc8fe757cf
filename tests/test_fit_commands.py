"""One memory verdict on ``run``, one-step ``serve`` and ``memory`` (moesim.memory.fit):
``fit`` and ``oom`` in the JSON summary, a warning on stderr, exit 2 with ``--strict``;
bytes worked out by hand for a layout that fits and one that does not."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main

H100_BYTES = 81559 * 2**20          # nvidia-smi's 81,559 MiB
CPU_BYTES = 64e9                    # the cpu placeholder's nominal memory


def _toy_params(vocab: int) -> int:
    """Parameters on one rank of toy-cpu (2 layers, hidden 512, 8 heads of 64, 8 experts
    of FFN 1024, EP2: 4 local experts per layer): embedding and head 2·V·512; per layer
    q, k, v, o 4·512², two norms 2·512, router 512·8; the final norm 512; experts
    2 layers · 4 · 3·512·1024."""
    dense = 2 * vocab * 512 + 2 * (4 * 512 * 512 + 2 * 512 + 512 * 8) + 512
    return dense + 2 * 4 * 3 * 512 * 1024


def _run_json(capsys, *argv):
    code = main(["run", "toy-cpu", "--no-files", "--json", *argv])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_run_that_fits_by_hand(capsys):
    code, s, err = _run_json(capsys)
    assert code == 0 and "warning" not in err
    # bf16 weights 2 + bf16 gradients 2 + Adam (fp32 master, m, v) 12 bytes per parameter,
    # ZeRO 0: every parameter on every rank
    states = 16 * _toy_params(32000)
    assert states == 16 * 47_458_816 == 759_341_056
    row = s["memory"]["per_rank"][0]["by_category"]
    assert row["weights"] + row["gradients"] + row["optimizer"] == states
    need = max(r["peak_bytes"] for r in s["memory"]["per_rank"])
    assert s["fit"] == {"oom": False, "checks": [
        {"what": "training step", "need_bytes": need, "capacity_bytes": CPU_BYTES,
         "oom": False}]}
    assert s["oom"] is False and states < need < CPU_BYTES


def test_run_that_does_not_fit_by_hand(capsys):
    code, s, err = _run_json(capsys, "--set", "model.vocab=4000000")
    # 16 bytes x 4,110,690,816 parameters = 65.77e9 bytes before any activation: over 64e9
    states = 16 * _toy_params(4_000_000)
    assert states == 65_771_053_056 > CPU_BYTES
    assert code == 0 and s["oom"] is True and s["fit"]["oom"] is True
    (check,) = s["fit"]["checks"]
    assert check["need_bytes"] > states and check["oom"] is True
    assert err.count("moesim run: warning: training step needs ") == 1
    assert "GiB of 59.6 GiB per GPU: does not fit" in err
    # the text summary says the figures are for a step that does not fit
    assert main(["run", "toy-cpu", "--no-files", "--quiet", "--set", "model.vocab=4000000"]) == 0
    out = capsys.readouterr().out
    assert "memory per GPU (** does not fit **): training step" in out
    assert "for a step that does not fit in device memory" in out


def test_run_strict_exits_2_in_one_line(capsys, tmp_path):
    out_dir = tmp_path / "o"
    assert main(["run", "toy-cpu", "--quiet", "--strict", "-o", str(out_dir),
                 "--set", "model.vocab=4000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("moesim run: error: command line: --strict: expected a layout that "
                          "fits in device memory, got 'training step needs ")
    assert not (out_dir / "summary.json").exists()
    # a layout that fits is not refused
    assert main(["run", "toy-cpu", "--quiet", "--strict", "--no-files"]) == 0


def _serve_json(capsys, batch: int, context: int, *extra):
    code = main(["serve", "mixtral-8x7b-serve", "--no-files", "--json", *extra,
                 "--set", f"serve.batch_per_gpu={batch}", "--set", f"serve.context={context}"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else None), out.err


# Mixtral 8x7B decode on one H100 of EP8/TP1: weights 14,485,561,344 bytes (the dense part
# and one expert per layer, tests/test_device_memory.py); KV 2 (K, V) · 32 layers · 8 heads
# · 128 · 2 bytes = 131,072 bytes per token, batch · context tokens per GPU
WEIGHTS = 14_485_561_344
KV_TOKEN = 131_072


def test_serve_step_that_fits_by_hand(capsys):
    code, s, err = _serve_json(capsys, 32, 2048)
    need = WEIGHTS + 32 * 2048 * KV_TOKEN                   # 23,075,495,936 + activations
    mem = s["memory"]
    assert mem["kv_total_bytes"] == 32 * 2048 * KV_TOKEN and mem["weights_bytes"] == WEIGHTS
    assert mem["peak_bytes_max"] == pytest.approx(need + mem["activations_bytes"])
    assert code == 0 and s["oom"] is False and "warning" not in err
    assert s["fit"]["checks"] == [{"what": "serving step", "need_bytes": mem["peak_bytes_max"],
                                   "capacity_bytes": H100_BYTES, "oom": False}]


def test_serve_step_that_does_not_fit_by_hand(capsys):
    code, s, err = _serve_json(capsys, 72, 8192)
    kv = 72 * 8192 * KV_TOKEN
    assert kv == 77_309_411_328 and WEIGHTS + kv > H100_BYTES   # over before activations
    assert code == 0 and s["oom"] is True and s["memory"]["oom"] is True
    assert s["fit"]["checks"][0]["need_bytes"] > WEIGHTS + kv
    assert "moesim serve: warning: serving step needs 85.5 GiB of 79.6 GiB per GPU: does not " \
           "fit" in err
    # the largest batch that fits at context 8192: (capacity - weights - activations) / KV
    # per request = (85,520,809,984 - 14,485,561,344 - ~0.04 GiB) / 1 GiB -> 66
    assert s["memory"]["largest_batch_per_gpu"] == 66
    assert main(["serve", "mixtral-8x7b-serve", "--no-files", "--quiet",
                 "--set", "serve.batch_per_gpu=72", "--set", "serve.context=8192"]) == 0
    out = capsys.readouterr().out
    assert "TPOT" in out and "tokens/s above are for a step that does not fit in device " \
                             "memory: at most 66 requests per GPU fit" in out
    code, _, err = _serve_json(capsys, 72, 8192, "--strict")
    assert code == 2 and err.count("\n") == 1
    assert "moesim serve: error: command line: --strict: expected a layout that fits" in err


def test_memory_command_states_the_same_verdict(capsys):
    assert main(["memory", "toy-cpu", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["oom"] is False and t["fit"]["checks"][0]["what"] == "training step"
    assert t["fit"]["checks"][0]["capacity_bytes"] == CPU_BYTES
    assert main(["memory", "toy-cpu", "--set", "model.vocab=4000000"]) == 0
    out = capsys.readouterr().out
    assert "memory of one rank per pipeline stage, GiB (2^30 bytes)" in out
    assert "memory per GPU (** does not fit **): training step" in out
    # the same need as `moesim run` reports for the same layout
    assert main(["memory", "toy-cpu", "--json", "--set", "model.vocab=4000000"]) == 0
    t = json.loads(capsys.readouterr().out)
    _, s, _ = _run_json(capsys, "--set", "model.vocab=4000000")
    assert t["oom"] is True and t["fit"] == s["fit"]


def test_memory_strict_exits_2_after_the_table(capsys):
    # deepseek-v3-2048 without its recompute recipe: every stage over capacity (README)
    sets = ["--set", "memory.recompute=none", "--set", "memory.activation_dtype=bf16"]
    assert main(["memory", "deepseek-v3-2048", *sets, "--strict"]) == 2
    out, err = capsys.readouterr()
    assert "OOM" in out and err.count("\n") == 1
    assert "moesim memory: error: command line: --strict: expected a layout that fits" in err
    assert main(["memory", "deepseek-v3-2048", "--strict"]) == 0   # as shipped it fits
