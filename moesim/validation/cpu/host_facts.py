"""Which machine a recording was made on, and whether a calibration fits it.

A calibration holds the speeds of the machine its recordings ran on (FLOP rate,
memory bandwidth, host gaps, gloo latency and bandwidth). Validating a recording
from another machine against it measures the difference between the machines, not
the simulator. ``moesim record`` writes the host facts into ``routing.json``
(CPU model and cores, the CUDA device, torch version, backend);
``moesim calibrate`` copies its sources' facts into the calibration (``recorded_on``)
and ``moesim validate`` compares them with the recording's and warns when they
differ (:func:`differences`). Foreign traces without a ``routing.json`` have no facts:
nothing is compared.
"""

from __future__ import annotations

import json
from pathlib import Path

#: facts that change measured speeds: (name, where in routing.json)
FACTS = (("cpu_model", ("host", "cpu_model")), ("cpu_count", ("host", "cpu_count")),
         ("cuda_device", ("host", "cuda_device")), ("torch_version", ("torch_version",)),
         ("backend", ("args", "backend")))


def recording_facts(trace_dir: str | Path) -> dict:
    """Host facts of a ``moesim record`` directory (empty without a readable
    ``routing.json``)."""
    p = Path(trace_dir) / "routing.json"
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    out = {}
    for name, path in FACTS:
        v = doc
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None and not isinstance(v, dict | list):
            out[name] = v
    return out


def calibration_facts(sources: list[str | Path]) -> dict:
    """Facts shared by the recordings a calibration is fitted on; a fact on which they
    differ holds the sorted list of their values."""
    per = [recording_facts(s) for s in sources]
    out: dict = {}
    for name, _ in FACTS:
        vals = sorted({str(f[name]) if not isinstance(f[name], int) else f[name]
                       for f in per if name in f}, key=str)
        if vals:
            out[name] = vals[0] if len(vals) == 1 else vals
    return out


def differences(calibration: dict | None, recording: dict) -> list[str]:
    """``name: calibration X, recording Y`` for every fact both know and that differs."""
    out = []
    for name, _ in FACTS:
        if not calibration or name not in calibration or name not in recording:
            continue
        c, r = calibration[name], recording[name]
        same = r in c if isinstance(c, list) else r == c
        if not same:
            out.append(f"{name}: calibration {c!r}, recording {r!r}")
    return out


def warning_line(calibration_doc: dict, trace_dir: str | Path) -> str | None:
    """The line ``moesim validate`` prints, or None when nothing is to be said."""
    rec = recording_facts(trace_dir)
    if not rec:
        return None
    cal = calibration_doc.get("recorded_on")
    if not isinstance(cal, dict) or not cal:
        return ("note: the calibration records no host facts (written before moesim "
                "calibrate stored them): cannot check that it was fitted on this "
                "recording's machine")
    diff = differences(cal, rec)
    if not diff:
        return None
    return ("warning: the recording was made on another machine than the calibration ("
            + "; ".join(diff) + "): simulated times use the calibration machine's speeds, "
            "so the errors measure the machines' difference; calibrate on recordings of "
            "this machine")
