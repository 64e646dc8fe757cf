"""Device memory as the cards report it (nvidia-smi's MiB), and KV-cache capacities derived
from a memory fraction of it, worked out by hand."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from moesim.compute import devices
from moesim.compute.devices import DEVICES, get_device
from moesim.model import PRESETS
from moesim.serve.kv import kv_bytes_per_token
from moesim.serve.memory import weight_bytes

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20

#: nvidia-smi totals (devices.py cites where each was seen)
REPORTED_MIB = {"H100": 81559, "H200": 143771, "H200-NVL": 143771, "H800": 81559,
                "A100": 81920, "H20": 97871, "B200": 183359}
#: no nvidia-smi figure found to cite: the datasheet's GB (devices.py says so)
DATASHEET_BYTES = {"GB200": 186e9}


def test_every_gpu_has_the_memory_nvidia_smi_reports():
    gpus = [k for k in DEVICES if k != "cpu" and k not in DATASHEET_BYTES]
    assert sorted(gpus) == sorted(REPORTED_MIB)
    assert all(DEVICES[k].hbm_bytes == b for k, b in DATASHEET_BYTES.items())
    for name, mib in REPORTED_MIB.items():
        assert DEVICES[name].hbm_bytes == mib * MiB
    # the "80 GB" card: 85.52e9 bytes, 79.6 GiB, 6.9 % above 80e9
    assert get_device("H100").hbm_bytes == 85_520_809_984
    assert round(get_device("H100").hbm_bytes / 2**30, 1) == 79.6


def test_device_table_cites_usable_mib():
    src = Path(devices.__file__).read_text(encoding="utf-8")
    sources = (ROOT / "docs" / "sources.md").read_text(encoding="utf-8")
    for mib in set(REPORTED_MIB.values()):
        shown = f"{mib:,} MiB"
        assert shown in src and shown in sources, shown
    # where each nvidia-smi figure was seen
    for cite in ("NVIDIA/nccl issue #1264", "sgl-project/sglang issue #3196",
                 "modal-labs/modal-client PR #2797"):
        assert cite in src and cite in sources
    assert not re.search(r"\b(80|141) \* GB\b", src)


def test_rollout_kv_capacity_by_hand():
    """Mixtral 8x7B, one GPU of an EP8/TP1 engine on an H100 at kv_fraction 0.9."""
    from moesim.rl.run import kv_capacity
    spec = PRESETS["mixtral-8x7b"]
    # weights on one GPU: dense (embedding + head 2·32000·4096, 32 layers of q,o 4096² and
    # k,v 4096·1024, two norms 4096, router 4096·8, final norm 4096) + one expert per layer
    # (3·4096·14336 per layer), 2 bytes each
    dense = 2 * 32000 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 4096 + 4096 * 8) \
        + 4096
    expert = 32 * 3 * 4096 * 14336
    weights = 2 * (dense + expert)
    assert weights == 14_485_561_344 == weight_bytes(spec, 1, 8)
    per_token = 2 * 32 * 8 * 128 * 2            # K and V, 32 layers, 8 KV heads of 128, bf16
    assert per_token == 131_072 == kv_bytes_per_token(spec, 2, 1)
    free = 0.9 * 81559 * MiB - weights           # 76,968,728,985.6 - weights
    assert int(free // per_token) == 476_708
    ro = SimpleNamespace(kv_fraction=0.9, tp=1, ep=8, kv_dtype="bf16")
    setup = SimpleNamespace(cfg=SimpleNamespace(rollout=ro),
                            res=SimpleNamespace(model=spec, device=get_device("H100")))
    assert kv_capacity(setup) == 476_708
    # the same fraction of the datasheet's 80e9 bytes left 6.9 % less memory, 18 % fewer tokens
    assert int((0.9 * 80e9 - weights) // per_token) == 438_800


def test_serving_kv_tokens_by_hand():
    """The serving-under-load KV capacity: kv_fraction of the reported memory, less the
    weights and the step's activations, over the bytes per token."""
    from moesim.serve.memory import table
    from moesim.serve.run import resolve_serve
    from moesim.traffic.config import LoadConfig
    from moesim.traffic.deploy import kv_tokens_per_member
    res, cfg = resolve_serve("mixtral-8x7b-serve")
    lc = LoadConfig(source="test", kv_fraction=0.9)
    t = table(res.model, cfg, res.device.hbm_bytes)
    assert t["weights_bytes"] == 14_485_561_344 and t["kv_per_token_bytes"] == 131_072
    free = 0.9 * 85_520_809_984 - 14_485_561_344 - t["activations_bytes"]
    assert kv_tokens_per_member(res, cfg, lc) == int(free // 131_072)
