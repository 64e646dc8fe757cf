"""benchmarks/deepseek_lone.py: the lone chunks of a DualPipe rank read from a trace, and
the profile's phases split into DeepEP's data kernels and notify kernels, by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import deepseek_lone as dl  # noqa: E402


def _x(rank, op, cat, stream, dur_us, layer, mb, phase):
    return {"ph": "X", "name": op, "cat": cat, "ts": 0.0, "dur": dur_us,
            "args": {"rank": rank, "op": op, "stream": stream, "layer": layer,
                     "microbatch": mb, "phase": phase}}


def test_lone_chunks_by_hand(tmp_path):
    # GPU 3 of pipeline rank 1 (2 GPUs a rank) holds layers 4 and 5, one a stage.
    # mb 0's forward of layer 4 runs alone (its dispatch on the compute stream): attn 100 +
    # router 20 us, a 5 us wait then a 50 us dispatch, experts 80 us, combine 60 us;
    # mb 1's forward of layer 5 runs in a pair (its dispatch on the ep stream): not lone.
    # mb 0's backward of layer 4 runs alone, its W later: attn 200, w_attn 40 us.
    ev = [_x(3, "fwd.attn", "compute", "compute", 100, 4, 0, "fwd"),
          _x(3, "fwd.router", "compute", "compute", 20, 4, 0, "fwd"),
          _x(3, "fwd.dispatch", "stall", "compute", 5, 4, 0, "fwd"),
          _x(3, "fwd.dispatch", "ep_dispatch", "compute", 50, 4, 0, "fwd"),
          _x(3, "fwd.experts", "compute", "compute", 80, 4, 0, "fwd"),
          _x(3, "fwd.combine", "ep_combine", "compute", 60, 4, 0, "fwd"),
          _x(3, "fwd.attn", "compute", "compute", 999, 5, 1, "fwd"),
          _x(3, "fwd.dispatch", "ep_dispatch", "ep", 999, 5, 1, "fwd"),
          _x(3, "bwd.combine", "ep_dispatch", "compute", 30, 4, 0, "bwd"),
          _x(3, "bwd.attn", "compute", "compute", 200, 4, 0, "bwd"),
          _x(3, "bwd.w_attn", "compute", "compute", 40, 4, 0, "bwd"),
          _x(2, "fwd.attn", "compute", "compute", 7, 4, 0, "fwd"),       # GPU 2 is read
          _x(0, "fwd.attn", "compute", "compute", 7, 0, 0, "fwd")]       # another rank
    ev[-2]["args"]["rank"] = 2
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    # GPU 2 is the first GPU of pipeline rank 1 in the trace: it has only one event, a
    # pair-less forward without an EP op, so no lone chunk
    sim = dl.sim_lone(str(path), 1, 2)
    assert sim["rank"] == 2 and sim["n"] == {"F": 0, "BW": 0}
    ev[-2]["args"]["rank"] = 9          # now GPU 3 is the first of pipeline rank 1
    path.write_text(json.dumps({"traceEvents": ev}))
    sim = dl.sim_lone(str(path), 1, 2)
    assert sim["rank"] == 3 and sim["n"] == {"F": 1, "BW": 1}
    f, bw = sim["F"], sim["BW"]
    assert f["attn(F)"]["compute"] == pytest.approx(120e-6)
    assert f["dispatch(F)"]["kernel"] == pytest.approx(50e-6)
    assert f["dispatch(F)"]["wait"] == pytest.approx(5e-6)
    assert f["mlp(F)"]["compute"] == pytest.approx(80e-6)
    assert f["combine(F)"]["kernel"] == pytest.approx(60e-6)
    assert bw["combine(B)"]["kernel"] == pytest.approx(30e-6)
    assert bw["attn(B)"]["compute"] == pytest.approx(200e-6)
    assert bw["attn(W)"]["compute"] == pytest.approx(40e-6)


def test_profile_phases_split_by_hand():
    # two layers' dispatch(F): busy 6 + 5 ms, of which data kernel 4 + 3.5, notify 1.5 + 1,
    # layout 0.1 + 0.1
    g = {"phases": [
        {"phase": "dispatch(F)", "gpu_busy_s": 6e-3,
         "comm": {"layout": 1e-4, "notify": 1.5e-3, "dispatch": 4e-3}},
        {"phase": "dispatch(F)", "gpu_busy_s": 5e-3,
         "comm": {"layout": 1e-4, "notify": 1e-3, "dispatch": 3.5e-3}},
        {"phase": "attn(F)", "gpu_busy_s": 4e-3, "comm": {}}]}
    p = dl.profile_lone(g)
    assert p["dispatch(F)"] == pytest.approx({"busy": 11e-3, "kernel": 7.5e-3,
                                              "notify": 2.7e-3})
    assert p["attn(F)"] == {"busy": 4e-3, "kernel": 0.0, "notify": 0.0}


def test_lone_chunks_at_the_published_rate_by_hand():
    # forward: attn 4 ms; dispatch 6 ms busy of which 4 data kernel + 1.5 notify (0.5 ms
    # of other kernels stays); mlp 5; combine 8 = 6 + 2. Alone, a dispatch takes 2 ms and
    # a combine 4 ms a layer, 4 layers a chunk: 4 + 0.5 + 5 + 0 + 4 x (2 + 4) = 33.5 ms.
    # The backward has no phase in this profile: its 4 dispatches and 4 combines, 24 ms.
    prof = {"attn(F)": {"busy": 4e-3, "kernel": 0.0, "notify": 0.0},
            "dispatch(F)": {"busy": 6e-3, "kernel": 4e-3, "notify": 1.5e-3},
            "mlp(F)": {"busy": 5e-3, "kernel": 0.0, "notify": 0.0},
            "combine(F)": {"busy": 8e-3, "kernel": 6e-3, "notify": 2e-3}}
    ref = {"ep_dispatch": {"published": 2e-3}, "ep_combine": {"published": 4e-3}}
    f, bw = dl.lone_at_published(prof, ref)
    assert f == pytest.approx(33.5e-3) and bw == pytest.approx(24e-3)
