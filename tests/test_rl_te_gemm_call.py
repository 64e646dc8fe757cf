"""``rl.train.te_gemm_call``: Transformer Engine's per-expert GEMM call priced on the
host at its NVTX-measured time instead of a bare launch, on the two-clock timeline
(moesim.rl.host_timeline, moesim.program.nvtx_ranges)."""

from __future__ import annotations

import pytest

from moesim.cli import main
from moesim.program import host_dispatch as hd
from moesim.program.nvtx_ranges import TE_GEMM_CALL_S
from moesim.rl import host_timeline
from tests.test_rl_run import scenario


def test_nvte_adds_the_gemm_calls_host_time_by_hand(monkeypatch):
    # no GPU work: the pass is the host's own time, so nvte adds, per layer, each
    # per-expert GEMM call's (13.709 - 2.43) us: the experts part issues 2 per local expert
    monkeypatch.setattr(host_timeline, "part_gpu_s", lambda scn, row, g, ep: ({}, 16, 1))
    launch = host_timeline.timeline_row_s(None, 4096, 3, 0.0, 8)
    nvte = host_timeline.timeline_row_s(None, 4096, 3, 0.0, 8, "nvte")
    per_expert = sum(p.per_expert for p in hd.FORWARD_OPS if not p.tp_only)
    assert per_expert == 2
    assert nvte - launch == pytest.approx(3 * 2 * 16 * (TE_GEMM_CALL_S - hd.CPP_LAUNCH_S))
    assert launch == pytest.approx(hd.timeline_extra_s({}, 16, 1, 3, te=True))


def test_nvte_without_the_timeline_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--quiet", "--set", "rl.train.te_gemm_call=nvte"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.train.te_gemm_call" in err and "timeline" in err
