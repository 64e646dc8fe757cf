"""Bad model/compute input reaches the user as one line and exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.cli import main

TOY = Path(__file__).resolve().parents[1] / "scenarios" / "toy-cpu.yaml"


def _scenario(tmp_path: Path, old: str, new: str) -> Path:
    text = TOY.read_text()
    assert old in text
    p = tmp_path / "bad.yaml"
    p.write_text(text.replace(old, new, 1))
    return p


@pytest.mark.parametrize("old, new, field, expected", [
    ("model: {preset: toy}", "model: {preset: toyy}", "model.preset",
     "one of deepseek-v3, gpt-oss-120b, llama-3.1-405b, llama-3.1-70b, llama-3.1-8b, mixtral-8x7b, qwen3-0.6b, qwen3-235b-a22b, qwen3-30b-a3b, qwen3-32b, switch-base, toy"),
    ("model: {preset: toy}", "model: {preset: toy, hiden: 3}", "model.hiden", "a model field"),
    ("model: {preset: toy}", "model: {preset: toy, top_k: 2.5}", "model.top_k", "an integer"),
    ("device: cpu", "device: tpu", "cluster.device", "one of H100, H200, H200-NVL, H800, A100, H20, B200, GB200, cpu"),
    ("compute: {kind: catalog}", "compute: {kind: catalog, mfu_large: 2}",
     "compute.mfu_large", "a fraction in (0, 1]"),
])
def test_bad_input_one_line_exit_2(tmp_path, capsys, old, new, field, expected):
    assert TOY.exists(), "the shipped scenario is part of the repository"
    path = _scenario(tmp_path, old, new)
    assert main(["memory", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}: {field}: expected {expected}" in err
