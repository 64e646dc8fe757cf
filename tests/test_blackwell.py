"""Blackwell (issue 41, item 5): B200 and GB200 devices, the dgx-b200 and gb200-nvl72
topologies, DeepEP's limit inside a 72-GPU NVLink domain, EP layouts on a rack.

Every expected number is worked out by hand from the datasheets (docs/blackwell.md) and
the topology files: NVLink 5 at 900 GB/s per direction x 0.802 (18 links x 40.1 GB/s,
NCCL's SM100_NVLINK_BW) = 721.8 GB/s per GPU, 1.665 µs per link.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.cli import main
from moesim.collectives.simulate import simulate_collective
from moesim.compute.devices import DEVICES
from moesim.ep.plan import NUM_MAX_NVL_PEERS
from moesim.serve.run import resolve_serve, simulate_serve
from moesim.topology import load_topology
from moesim.units import MiB

NVL5 = 900e9 * 0.802        # bytes/s per GPU per direction, achievable
LINK_S = 1.665e-6           # one GPU<->switch link


@pytest.mark.parametrize("name, bf16, fp8, fp4, int8, hbm, hbm_bps", [
    # DGX B200 datasheet and HGX B200 specs, per GPU, dense = half of sparse:
    # BF16 36/8/2, FP8 72/8/2, FP4 144/8/2, INT8 72/8/2 P; 64 TB/s / 8; 183,359 MiB (nvidia-smi)
    ("B200", 2.25e15, 4.5e15, 9.0e15, 4.5e15, 183359 * MiB, 8e12),
    # GB200 NVL72 page, per superchip of 2 GPUs, sparse: BF16 10, FP8 20, FP4 40, INT8 20 P;
    # 372 GB and 16 TB/s -> per GPU dense 2.5, 5, 10, 5; 186 GB; 8 TB/s
    ("GB200", 2.5e15, 5.0e15, 10.0e15, 5.0e15, 186e9, 8e12),
])
def test_blackwell_devices_equal_the_datasheets(name, bf16, fp8, fp4, int8, hbm, hbm_bps):
    d = DEVICES[name]
    assert (d.peak_bf16_flops, d.peak_fp8_flops, d.peak_fp4_flops, d.peak_int8_ops) == \
        (bf16, fp8, fp4, int8)
    assert d.hbm_bytes == hbm and d.hbm_Bps == hbm_bps
    assert d.sms == 0     # no SM count in NVIDIA's Blackwell technical brief


@pytest.mark.parametrize("name, int8", [
    ("H100", 1979e12), ("H200", 1979e12), ("H200-NVL", 1670.5e12), ("H800", 1979e12),
    ("A100", 624e12), ("H20", 296e12)])
def test_int8_peaks_and_no_fp4_before_blackwell(name, int8):
    # H100/H200 datasheets: INT8 3,958 TOPS with sparsity; H200 NVL 3,341; A100 624 dense
    d = DEVICES[name]
    assert d.peak_int8_ops == int8 and d.peak_fp4_flops == 0.0


def test_nvl72_is_one_nvlink_domain_of_72():
    t = load_topology("gb200-nvl72", nodes=2)
    assert (len(t.gpus), t.gpus_per_node, t.device) == (144, 72, "GB200")
    # GPU 0 to GPU 71 of one rack: one switch level, 2 NVLink links
    assert t.path_nodes("n0.gpu0", "n0.gpu71") == ["n0.gpu0", "n0.nvswitch", "n0.gpu71"]
    assert t.capacity_Bps[t.link_id[("n0.gpu0", "n0.nvswitch")]] == pytest.approx(NVL5)
    # across racks: rail 71's NIC (PXN relay over NVLink first), 47.5 GB/s
    assert "n0.nic71" in t.path_nodes("n0.gpu0", "n1.gpu71")
    b = load_topology("dgx-b200", nodes=2)
    assert (b.gpus_per_node, b.device) == (8, "B200")
    assert b.capacity_Bps[b.link_id[("n0.gpu0", "n0.nvswitch")]] == pytest.approx(NVL5)


def test_nvl72_all_to_all_priced_by_hand():
    # 72 ranks, S = 72 MB per rank, S/72 = 1 MB to each of 71 peers at once: every GPU's
    # uplink and downlink carry 71 flows of equal share, 71 MB at 721.8 GB/s, plus the
    # two links' latency
    t = load_topology("gb200-nvl72")
    r = simulate_collective(t, "all_to_all", 72e6)
    assert r["flows"] == 72 * 71
    assert r["time_s"] == pytest.approx(71e6 / NVL5 + 2 * LINK_S, rel=1e-9)


def test_nvl72_ring_all_reduce_priced_by_hand():
    # ring over 72: 2 x 71 steps of S / 72 each, every step at the full NVLink rate (each
    # uplink carries one flow) and 2 link latencies per step
    t = load_topology("gb200-nvl72")
    r = simulate_collective(t, "all_reduce", 72e6, algo="ring")
    steps = 2 * 71
    assert r["time_s"] == pytest.approx(steps * (1e6 / NVL5 + 2 * LINK_S), rel=1e-9)


def test_deepep_normal_kernels_refuse_more_than_8_nvlink_peers(capsys):
    ranks = ",".join(str(r) for r in range(16))
    assert main(["collective", "--topology", "gb200-nvl72", "--op", "ep_dispatch",
                 "--kernel", "deepep", "--tokens", "16", "--ranks", ranks]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at most 8 NVLink peers" in err[0]
    assert NUM_MAX_NVL_PEERS == 8
    # 8 ranks of the rack: the intranode kernels, as on a DGX B200 (same links): same time
    args = ["--op", "ep_dispatch", "--kernel", "deepep", "--tokens", "64", "--hidden",
            "1024", "--experts", "16", "--top-k", "2", "--json"]
    assert main(["collective", "--topology", "gb200-nvl72", "--ranks", "0,1,2,3,4,5,6,7",
                 *args]) == 0
    rack = capsys.readouterr().out
    assert main(["collective", "--topology", "dgx-b200", *args]) == 0
    server = capsys.readouterr().out
    assert json.loads(rack)["time_s"] == json.loads(server)["time_s"]
    # the low-latency kernels reach all 16 peers over NVLink
    assert main(["collective", "--topology", "gb200-nvl72", "--op", "ep_dispatch", "--kernel",
                 "deepep-ll", "--tokens", "16", "--ranks", ranks, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks_per_node"] == 16


def test_ep_layout_what_if_on_a_rack():
    # DeepSeek-V3 decode on the rack, 5 layers (3 dense, 2 MoE): EP64 vs EP8. Each GPU holds
    # 256/ep routed experts of 3 x 7168 x 2048 FP8 weights per MoE layer: EP8 holds
    # 2 layers x (32 - 4) experts x 44,040,192 bytes more
    out = {}
    for ep in (64, 8):
        res, cfg = resolve_serve("deepseek-v3-decode-gb200", ["model.layers=5", f"serve.ep={ep}"])
        out[ep] = simulate_serve(res, cfg, spans=False).summary
    extra = out[8]["memory"]["weights_bytes"] - out[64]["memory"]["weights_bytes"]
    assert extra == 2 * 28 * 3 * 7168 * 2048
    for s in out.values():
        assert np.isfinite(s["step_time_s"]) and s["step_time_s"] > 0
        assert s["world"] == 64


def test_ep_larger_than_the_world_is_one_line(capsys):
    assert main(["serve", "deepseek-v3-decode-gb200", "--no-files",
                 "--set", "serve.ep=128"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serve.ep" in err[0]
