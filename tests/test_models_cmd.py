"""``moesim models``: presets, devices and topologies, one line each (moesim.cli.models_cmd)."""

from __future__ import annotations

import json
from pathlib import Path

from moesim.cli import main
from moesim.compute.devices import DEVICES
from moesim.model import PRESETS
from moesim.topology import presets

HF = Path(__file__).resolve().parent / "data" / "hf"


def test_one_line_per_preset_device_and_topology(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # three headings, then one line per entry
    assert len(lines) == 3 + len(PRESETS) + len(DEVICES) + len(presets())
    rows = [ln.split()[0] for ln in lines if ln.startswith("  ")]
    assert rows == [*sorted(PRESETS), *DEVICES, *presets()]
    toy = next(ln for ln in lines if ln.startswith("  toy "))
    assert "8 experts top-2" in toy and "2 layers" in toy
    h100 = next(ln for ln in lines if ln.startswith("  H100 "))
    assert "79.6 GiB" in h100 and "989 TFLOP/s" in h100


def test_json_figures_by_hand(capsys):
    assert main(["models", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    toy = next(m for m in res["models"] if m["name"] == "toy")
    # toy: 2 layers, h 512, 8 heads of 64 (MHA), 8 SwiGLU experts of 1024, top-2, vocab
    # 32000 untied. Per layer: attention 4 x 512^2 = 1,048,576; norms 2 x 512; router
    # 512 x 8; experts 8 x 3 x 512 x 1024 = 12,582,912 -> 13,636,608. Embedding and head
    # 2 x 32000 x 512 = 32,768,000; final norm 512.
    assert toy["params_total"] == 2 * 13_636_608 + 32_768_000 + 512 == 60_041_728
    # active: 2 of 8 experts per layer
    assert toy["params_active"] == 60_041_728 - 2 * 6 * 3 * 512 * 1024 == 41_167_360
    h100 = next(d for d in res["devices"] if d["name"] == "H100")
    assert h100["memory_bytes"] == 81559 * 2**20
    topo = {t["name"]: (t["gpus_per_node"], t["nodes"], t["device"]) for t in res["topologies"]}
    assert topo["dgx-h100"] == (8, 1, "H100") and topo["fat-tree"] == (1, 16, None)


def test_a_config_json_shows_the_model_it_maps_to(capsys):
    assert main(["models", str(HF / "mixtral-8x7b.json"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["architecture"] == "MixtralForCausalLM" and res["unmapped"] == []
    m = res["model"]
    assert (m["layers"], m["n_experts"], m["top_k"], m["kv_heads"]) == (32, 8, 2, 8)
    assert main(["models", str(HF / "gpt-oss-120b.json")]) == 0
    out = capsys.readouterr().out
    assert "not mapped: quantization_config.quant_method=mxfp4" in out


def test_a_missing_config_is_one_line(capsys, tmp_path):
    assert main(["models", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"moesim models: error: command line: CONFIG_JSON: expected an existing "
                   f"Hugging Face config.json (or the checkpoint folder holding it), got "
                   f"'{tmp_path / 'nope.json'}'"]
