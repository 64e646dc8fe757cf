"""moesim validate warns when the recording comes from another machine than the
calibration (issue 12 item 20)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from moesim.cli import main
from moesim.validation.cpu.host_facts import calibration_facts, differences, recording_facts

ROOT = Path(__file__).resolve().parents[1]
CALIB = ROOT / "traces" / "calib-uniform-cpu.json"


def _moved(tmp_path: Path, **host) -> Path:
    """traces/hot as if recorded on another machine."""
    d = tmp_path / "hot-elsewhere"
    shutil.copytree(ROOT / "traces" / "hot", d)
    doc = json.loads((d / "routing.json").read_text())
    for k, v in host.items():
        if k == "torch_version":
            doc[k] = v
        else:
            doc["host"][k] = v
    (d / "routing.json").write_text(json.dumps(doc))
    return d


def test_facts_of_the_shipped_recordings_and_calibration():
    rec = recording_facts(ROOT / "traces" / "hot")
    assert rec == {"cpu_model": "AMD EPYC", "cpu_count": 2, "torch_version": "2.13.0+cpu",
                   "backend": "gloo"}
    cal = json.loads(CALIB.read_text())["recorded_on"]
    assert cal == calibration_facts([ROOT / "traces/uniform", ROOT / "traces/uniform-repeat"])
    assert differences(cal, rec) == []


def test_validate_warns_on_another_machine(tmp_path, capsys):
    d = _moved(tmp_path, cpu_model="Intel(R) Xeon(R) Platinum 8480+", cpu_count=112)
    assert main(["validate", str(d), "--calibration", str(CALIB), "--json"]) == 0
    cap = capsys.readouterr()
    (line,) = [ln for ln in cap.err.splitlines() if ln.startswith("warning:")]
    assert "another machine" in line
    assert "cpu_model: calibration 'AMD EPYC', recording 'Intel(R) Xeon(R) Platinum 8480+'" in line
    assert "cpu_count: calibration 2, recording 112" in line
    assert json.loads(cap.out)["host_warning"] == line


@pytest.mark.slow
def test_same_machine_no_warning_and_old_calibration_noted(tmp_path, capsys):
    assert main(["validate", str(ROOT / "traces" / "hot"), "--calibration", str(CALIB),
                 "--json"]) == 0
    cap = capsys.readouterr()
    assert "warning" not in cap.err and json.loads(cap.out)["host_warning"] is None
    old = json.loads(CALIB.read_text())
    del old["recorded_on"]
    p = tmp_path / "old-calib.json"
    p.write_text(json.dumps(old))
    assert main(["validate", str(ROOT / "traces" / "hot"), "--calibration", str(p)]) == 0
    assert "calibration records no host facts" in capsys.readouterr().err
