"""A scenario that names a calibration as its compute and network model (issue 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.cli import main
from moesim.compute.calibrated import load_calibration
from moesim.errors import InputError
from moesim.wiring import resolve_path, simulate

ROOT = Path(__file__).resolve().parents[1]
CALIB = ROOT / "traces" / "calib-uniform-cpu.json"


def test_recording_machine_is_the_calibration():
    res = resolve_path("recording-machine")
    cal = load_calibration(CALIB)
    # the cpu device entry is fed by the calibration
    assert res.device.name == "cpu"
    assert res.device.peak_bf16_flops == cal.gemm_flops_per_s
    assert res.device.hbm_Bps == cal.memory_bytes_per_s
    assert res.device.launch_overhead_s == cal.op_gap_s
    # every kernel is timed by the calibration
    assert res.compute == cal
    # 2 ranks on one host; a transfer alone takes latency + bytes / bandwidth
    topo = res.topology
    assert len(topo.gpus) == 2 and {topo.host_of(g) for g in topo.gpus} == {0}
    path = topo.route(topo.gpus[0], topo.gpus[1])
    assert float(topo.latency_s[list(path)].sum()) == pytest.approx(cal.comm.latency_s)
    assert min(float(topo.capacity_Bps[lk]) for lk in path) == pytest.approx(
        cal.comm.bandwidth_Bps)
    out = simulate(res, record_series=False)
    assert out.step_time_s > 0
    # MFU is against the calibrated peak: model FLOPs / (step × 2 ranks × peak)
    assert out.summary["mfu"] == pytest.approx(
        out.summary["model_flops"] / (out.step_time_s * 2 * cal.gemm_flops_per_s), rel=1e-9)


@pytest.mark.parametrize("params, field", [
    ({"ranks": 2}, "cluster.params.file"),
    ({"file": str(CALIB), "ranks": 0}, "cluster.params.ranks"),
    ({"file": str(CALIB), "ranks": 2, "nodes_per": 1}, "cluster.params.nodes_per"),
])
def test_calibration_cluster_bad_params(tmp_path, params, field):
    import yaml
    doc = yaml.safe_load((ROOT / "scenarios" / "recording-machine.yaml").read_text())
    doc["cluster"]["params"] = params
    doc["compute"] = {"kind": "calibration", "file": str(CALIB)}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as err:
        resolve_path(str(p))
    assert err.value.field == field


def test_cli_runs_it(capsys):
    assert main(["run", "recording-machine", "--no-files", "--quiet"]) == 0
    assert "recording-machine: step" in capsys.readouterr().out


def test_gpu_recording_feeds_its_gpu_entry(tmp_path):
    """An nccl recording's calibration names the GPU record logged ("NVIDIA H200" →
    the catalog's H200); a scenario on that device takes its figures from it, one on
    another device keeps the catalog's."""
    import dataclasses
    import json

    from moesim.cli.calibrate_cmd import device_of
    from moesim.compute.devices import get_device
    from moesim.wiring.resolve import calibrated_device

    d = tmp_path / "rec"
    d.mkdir()
    (d / "routing.json").write_text(json.dumps(
        {"args": {"backend": "nccl"}, "host": {"cuda_device": "NVIDIA H200"}}))
    assert device_of(str(d), "nccl") == "H200"
    assert device_of(str(d), "gloo") == "cpu"
    (d / "routing.json").write_text(json.dumps({"args": {"backend": "nccl"}, "host": {}}))
    assert device_of(str(d), "nccl") == "gpu"
    cal = dataclasses.replace(load_calibration(CALIB), device="H200")
    scn = resolve_path("recording-machine").scenario
    h200 = calibrated_device(get_device("H200"), cal, scn)
    assert h200.peak_bf16_flops == cal.gemm_flops_per_s and h200.name == "H200"
    assert calibrated_device(get_device("H100"), cal, scn) == get_device("H100")
