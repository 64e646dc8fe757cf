"""The campaign what-ifs by hand: hot spares, the replica failure domain, stragglers and
in-memory checkpoints change the costs the way their definitions say."""

from __future__ import annotations

import json

import pytest

from moesim.campaign.costs import scenario_costs
from moesim.campaign.spec import read_campaign
from moesim.campaign.summary import restart_and_losing
from moesim.cli import main
from tests.test_campaign import tiny


def _costs(p, **kw):
    camp = read_campaign(p).with_(**kw)
    return camp, scenario_costs(camp, None, None)[0]


def test_restart_by_hand(tmp_path):
    p = tiny(tmp_path, failures={"causes": {"gpu": {"rate_per_day": 1, "per": "gpu"}}},
             recovery={"detect_crash_s": 10, "relaunch_s": 20, "nccl_init_s": 5,
                       "replace_s": 600})
    camp, costs = _costs(p)
    # detect 10 + cold node 600 + relaunch 20 + NCCL 5 + load 50 GB at 1000 GB/s (0.05)
    assert restart_and_losing(camp, costs) == pytest.approx((635.05, 1.0))
    camp, costs = _costs(p, spare_nodes=1)         # a hot spare: 30 s instead of 600
    assert restart_and_losing(camp, costs) == pytest.approx((65.05, 1.0))
    camp, costs = _costs(p, domain="replica")      # DP 8: only the replica restarts
    # 10 + (625.05 - 0.05 + 6.25 GB / 50 GB/s = 0.125) / 8, nothing lost
    assert restart_and_losing(camp, costs) == pytest.approx((10 + 625.125 / 8, 0.0))


def test_replica_domain_loses_no_work_and_spares_run_out(tmp_path, capsys):
    p = tiny(tmp_path, failures={"causes": {"gpu": {"rate_per_day": 2, "per": "gpu"}}})
    assert main(["train", "--campaign", str(p), "--days", "20", "--json", "--no-files",
                 "--no-sweep", "--domain", "replica"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["interruptions"] > 200 and s["lost_work_s"] == 0.0
    # 16 failures a day, each spare away 3 days: one spare is nearly always away
    assert main(["train", "--campaign", str(p), "--days", "20", "--json", "--no-files",
                 "--no-sweep", "--spares", "1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert 0 < s["spare_waits"] < s["interruptions"]


def test_stragglers_cost_their_slowdown(tmp_path, capsys):
    p = tiny(tmp_path, stragglers={"rate_per_day": 1, "slowdown": 1.5, "duration_s": 3600})
    assert main(["train", "--campaign", str(p), "--days", "10", "--json", "--no-files",
                 "--no-sweep"]) == 0
    s = json.loads(capsys.readouterr().out)
    # 3600 s at 1/1.5 of the rate: 1200 s of training lost each, no restart
    assert s["stragglers"] > 0
    assert s["straggler_s"] == pytest.approx(1200.0 * s["stragglers"])
    assert s["interruptions_expected"] == pytest.approx(8.64 * 10)    # stragglers apart
    bad = tiny(tmp_path, stragglers={"rate_per_day": 1, "slowdown": 1, "duration_s": 60})
    assert main(["train", "--campaign", str(bad), "--days", "1", "--no-files"]) == 2
    assert "stragglers.slowdown: expected a factor > 1" in capsys.readouterr().err


def test_in_memory_checkpoints_go_at_the_network_rate(tmp_path):
    p = tiny(tmp_path, checkpoint={"target": "memory", "host_copy_GBps": 10,
                                   "peer_GBps": 25})
    _, costs = _costs(p)
    # 6.25 GB per GPU: copied to host (0.625 s) then to a peer (0.25 s), synchronous
    assert costs.pause_s == pytest.approx(0.875) and costs.lag_s == 0.0
    assert costs.load_s == pytest.approx(0.25)
    _, costs = _costs(p, mode="async")
    assert (costs.pause_s, costs.lag_s) == pytest.approx((0.625, 0.25))
