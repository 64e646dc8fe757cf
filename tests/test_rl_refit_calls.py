"""NeMo RL v0.3's refit calls (rl.weight_sync.calls: nemo, moesim.rl.refit_calls): the
Megatron keys, the gather's collective calls and the buckets of a tiny model by hand."""

from __future__ import annotations

import pytest

from moesim.collectives.nccl.launch import CALL_HOST_S
from moesim.rl import refit_calls
from moesim.rl.sync import IPC_REBUILD_S
from tests._refit import SPEC, one_node_sync

# SPEC (tests/_refit.py) in bf16: 198,272 bytes (test_rl_refit.py)
B = 198_272


def test_megatron_keys_by_hand():
    # per layer: qkv, its fused norm, proj (3; 2 TP-sharded); pre_mlp_layernorm, router (2);
    # EP2: 2 local experts x (fc1, fc2) = 4 expert keys -> 9 per layer, 18 for 2 layers;
    # embedding, final norm, output layer: 21 keys; TP-sharded 2 x 2 + embedding + output = 6
    k = refit_calls.megatron_keys(SPEC, ep=2)
    assert (k.total, k.tp_sharded, k.expert) == (21, 6, 8)
    # EP1: 4 local experts -> 8 expert keys per layer
    assert refit_calls.megatron_keys(SPEC, ep=1).expert == 16
    # qk_layernorm: q_layernorm and k_layernorm per layer, not TP-sharded -> 21 + 4 keys
    import dataclasses
    k = refit_calls.megatron_keys(dataclasses.replace(SPEC, qk_norm=True), ep=2)
    assert (k.total, k.tp_sharded, k.expert) == (25, 6, 8)


def test_gather_calls_by_hand():
    # TP2 EP2: one PP broadcast per key (21, whatever the PP size) + 6 TP all-gathers
    # + 8 EP all-gathers
    assert refit_calls.gather_calls(SPEC, tp=2, pp=1, ep=2) == 35
    assert refit_calls.gather_calls(SPEC, tp=2, pp=2, ep=2) == 35
    # TP1 EP1: the broadcasts only, 3 + 2 + 8 = 13 keys per layer, 26 + 3 = 29
    assert refit_calls.gather_calls(SPEC, tp=1, pp=1, ep=1) == 29
    # expert TP2 as well: 8 more all-gathers
    assert refit_calls.gather_calls(SPEC, tp=2, pp=1, ep=2, etp=2) == 43
    assert refit_calls.gather_calls_s(SPEC, tp=2, pp=2, ep=2) == pytest.approx(35 * CALL_HOST_S)


def test_pack_by_hand():
    # 198,272 bytes read and written at 1e9 B/s + 41 tensors x 4 us
    assert refit_calls.pack_s(B, 41, 1e9, 4e-6) == pytest.approx(2 * B / 1e9 + 41 * 4e-6)


def test_buckets_by_hand():
    # 0.2 x 1,000 free bytes = 200 per bucket: 198,272 bytes -> 992 buckets
    assert refit_calls.buckets(B, 1000.0) == 992
    assert refit_calls.buckets(B, 1e12) == 1
    with pytest.raises(ValueError):
        refit_calls.buckets(B, 0.0)


def test_refit_with_calls_adds_the_calls_and_its_buckets():
    off, on = one_node_sync("none"), one_node_sync("nemo")
    assert on.phases["gather_calls"] == 35
    assert "gather_calls" not in off.phases
    assert on.phases["gather_s"] == pytest.approx(off.phases["gather_s"] + 35 * CALL_HOST_S)
    # free memory 1e9 - B/2 - B/8 leaves one bucket of 0.2 x that: one rebuild; the 41
    # HF tensors (test_rl_refit.py) packed: B read and written at 3.35e12 B/s, 41 launches
    assert on.phases["buckets"] == 1
    assert on.phases["transfer_s"] == pytest.approx(
        IPC_REBUILD_S + 2 * B / 3.35e12 + 41 * 4e-6)
    assert on.phases["load_s"] == off.phases["load_s"]
