"""benchmarks/deepseek_campaign.py: DeepSeek-V3's published cost as wall clock."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import deepseek_campaign as dc  # noqa: E402

from moesim.cli import main  # noqa: E402


def test_published_figures_by_hand():
    # 2664K GPU hours / 2048 GPUs / 24 h = 54.199 days; 2664K / 14.8T = 180K GPU hours per
    # trillion tokens; 15360 * 4096 tokens per step -> 11.32 GPU hours = 19.907 s on 2048
    assert dc.PUBLISHED_DAYS == pytest.approx(54.19921875)
    assert dc.PUBLISHED_STEP_S == pytest.approx(15360 * 4096 * 180e3 / 1e12 * 3600 / 2048)
    assert dc.PUBLISHED_STEP_S == pytest.approx(19.90656)


def test_campaign_wall_is_the_cli_campaign(capsys):
    c = dc.campaign_wall(17.5, seeds=1)
    assert main(["train", "deepseek-v3-2048", "--step-s", "17.5", "--tokens", "14.8e12",
                 "--seed", "0", "--no-files", "--no-sweep", "--json", "--quiet"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert c["wall_days"] == cli["wall_days"]
    # 14.8e12 tokens / (15360 * 4096) tokens per step
    assert c["steps"] == pytest.approx(14.8e12 / 62914560)
    assert c["wall_step_s"] == pytest.approx(c["wall_days"] * 86400 / c["steps"])
    # failures, restarts and checkpoints only add wall time
    assert c["wall_step_s"] > 17.5 and c["ettr"] < 1
    assert c["wall_step_s"] == pytest.approx(17.5 / c["ettr"], rel=1e-9)
