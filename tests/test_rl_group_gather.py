"""NeMo RL v0.3's ``gather_params`` as each GPU runs it through its own groups
(``rl.weight_sync.gather: groups``), worked by hand on the toy model."""

from __future__ import annotations

import pytest

from moesim.model import PRESETS, count_params
from moesim.rl.refit_calls import group_gather


class FourPerHost:
    """Eight GPUs, four per host."""

    @staticmethod
    def host_of(g: int) -> int:
        return g // 4


def rate(topo, a: int, b: int) -> float:
    """1 GB/s inside a host, 0.1 GB/s between hosts."""
    return 1e9 if topo.host_of(a) == topo.host_of(b) else 1e8


def test_toy_tp2_pp2_ep2_gather_by_hand():
    """The toy: 60,041,728 parameters, 25,165,824 in routed experts; in bf16 E =
    50,331,648 expert bytes and D = 69,751,808 others. TP2 PP2 EP2 on 8 GPUs, 4 a host:
    TP all-gather D/2 x 1/2 = 17,437,952 bytes from GPU 1 (same host, 0.017437952 s);
    PP broadcast (D + E/2) x 1/2 = 47,458,816 bytes from GPU 4 (stride 8/2, the other
    host: 0.47458816 s); EP all-gather E x 1/2 = 25,165,824 bytes from GPU 1 (stride
    etp = 1, 0.025165824 s). In series: 0.517191936 s, 90,062,592 bytes."""
    toy = PRESETS["toy"]
    c = count_params(toy)
    assert (c.total, c.routed_experts) == (60_041_728, 25_165_824)
    g = group_gather(FourPerHost(), toy, list(range(8)), tp=2, pp=2, ep=2, path_Bps=rate)
    assert (g.tp_bytes, g.pp_bytes, g.ep_bytes) == (17_437_952, 47_458_816, 25_165_824)
    assert (g.tp_s, g.pp_s, g.ep_s) == pytest.approx((0.017437952, 0.47458816, 0.025165824))
    assert g.time_s == pytest.approx(0.517191936)
    assert g.received_bytes == 90_062_592


def test_one_gpu_holding_the_model_gathers_nothing():
    """DP only (TP1 PP1 EP1): every GPU holds the model; no group has a peer."""
    g = group_gather(FourPerHost(), PRESETS["toy"], list(range(8)), tp=1, pp=1, ep=1,
                     path_Bps=rate)
    assert (g.time_s, g.received_bytes) == (0.0, 0.0)


def test_a_group_split_over_two_hosts_waits_for_its_remote_half():
    """PP4 on 8 GPUs (stride 2): GPU 0's peers 2 (same host), 4 and 6 (the other);
    the toy's (D + E) x 3/4 = 90,062,592 bytes, a third from each peer: 30,020,864 over
    NVLink (0.030020864 s) beside 60,041,728 from the other host, which enters it once
    through the network paths of the group's two GPUs there (0 and 2): 0.30020864 s."""
    g = group_gather(FourPerHost(), PRESETS["toy"], list(range(8)), tp=1, pp=4, ep=1,
                     path_Bps=rate)
    assert g.pp_bytes == 90_062_592
    assert g.pp_s == pytest.approx(0.30020864)


def test_the_knob_reaches_the_refit_and_is_refused_when_misspelt(tmp_path):
    """``rl.weight_sync.gather: groups`` on the toy colocated on 8 GPUs with the trainer
    at EP8: the refit's gather is the groups' (EP8 inside one host: E x 7/8 over NVLink)
    and the summary echoes the knob; the default leaves it out; another word is refused
    naming the field."""
    from moesim.errors import InputError
    from moesim.rl.run import resolve_rl
    from moesim.scenario.sections.rl import summary_dict
    from tests.test_rl_run import RL, scenario

    colo = {"colocated": True, "rollout": {"gpus": 8, "tp": 1, "ep": 1},
            "train": {**RL["train"], "offload": "nemo"},
            "weight_sync": {"method": "ipc", "per_gpu": True, "gather": "groups"}}
    s = resolve_rl(scenario(tmp_path, **colo))
    assert s.cfg.weight_sync.gather == "groups"
    assert summary_dict(s.cfg)["weight_sync"]["gather"] == "groups"
    plain = {**colo, "weight_sync": {"method": "ipc", "per_gpu": True}}
    assert "gather" not in summary_dict(resolve_rl(scenario(tmp_path, **plain)).cfg)[
        "weight_sync"]
    with pytest.raises(InputError, match=r"gather"):
        resolve_rl(scenario(tmp_path, **{**colo, "weight_sync": {
            "method": "ipc", "per_gpu": True, "gather": "ring"}}))
