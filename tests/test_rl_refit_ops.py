"""NeMo RL v0.3's refit host ops and offload collections (rl.weight_sync.calls:
nemo-v03-ops, moesim.rl.refit_ops): ops and views of a tiny refit counted by hand."""

from __future__ import annotations

import pytest

from moesim.model.spec import ModelSpec
from moesim.program.host_dispatch import EAGER_OP_S, VIEW_OP_S
from moesim.rl import refit_ops
from moesim.rl.refit_ops import EMPTY_CACHE_S, GC_COLLECT_S, convert_ops, gather_ops, host_ops
from tests._refit import SPEC, one_node_sync

# the tiny MoE of test_rl_refit_calls.py: MHA, 2 MoE layers of 4 experts, untied head;
# 21 Megatron keys at EP2 (6 TP-sharded, 8 expert), 41 HF tensors
# one dense GQA layer (2 query groups), untied head
DENSE = ModelSpec(layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, vocab=128,
                  attention="gqa", dense_ffn=128, n_experts=0, top_k=0)


def test_published_prices():
    assert GC_COLLECT_S == 66e-3          # 179k live objects, torch + CUDA only
    assert EMPTY_CACHE_S == 4e-3
    assert refit_ops.OFFLOAD_GC_CALLS == 3


def test_gather_ops_by_hand():
    """TP2 EP2 PP1: every key on the rank's own stage. 6 TP-sharded keys x (2 empty_like
    + cat) = 18; 8 expert keys on a one-rank expert-TP group x (empty_like + cat + the
    one-rank all-gather) = 24; 8 expert keys x (stack + 2 empty) = 24: 66 ops; each expert
    key's 2 gathered tensors unbound: 16 views."""
    assert gather_ops(SPEC, tp=2, pp=1, ep=2) == (66, 16)
    # PP2: half the 21 keys are another stage's (one empty each), half of the sharded
    # work stays: 10.5 + 9 + 12 + 24
    assert gather_ops(SPEC, tp=2, pp=2, ep=2) == (55.5, 16)
    # EP1: 16 expert keys; 16 x (2 + 1) own + 16 x (stack + empty + one-rank all-gather)
    # and 6 x 3 TP-sharded: 48 + 48 + 18
    assert gather_ops(SPEC, tp=2, pp=1, ep=1) == (114, 16)


def test_convert_ops_by_hand():
    """MHA layer: 3 gathers by index; views: reshape, 4 aranges, cat, 2 aranges, 3 reshapes
    = 11; each of 4 experts' fc1 at expert TP1: 5 views; 2 layers + 2 prune slices."""
    assert convert_ops(SPEC, tp=2, etp=1) == (6, 2 * (11 + 20) + 2)
    # expert TP2: each fc1's last reshape copies: 1 op + 4 views per expert
    assert convert_ops(SPEC, tp=2, etp=2) == (2 * (3 + 4), 2 * (11 + 16) + 2)
    # GQA, 2 groups: views 1 + 2 + 3 + 3 = 9; dense fc1 at TP4 (1, 4), at TP1 (0, 5)
    assert convert_ops(DENSE, tp=4) == (4, 9 + 4 + 2)
    assert convert_ops(DENSE, tp=1) == (3, 9 + 5 + 2)


def test_host_ops_seconds_by_hand():
    """41 HF tensors in one bucket: pack 1 empty + 41 copy_ ops, 123 views; unpack 82."""
    h = host_ops(SPEC, tp=2, pp=1, ep=2, etp=1, hf_tensors=41, buckets=1)
    assert (h.pack_ops, h.pack_views, h.unpack_views, h.gc_calls) == (42, 123, 82, 3)
    assert h.gather_s == pytest.approx(72 * EAGER_OP_S + 80 * VIEW_OP_S)
    assert h.gather_s == pytest.approx(72 * 16.1e-6 + 80 * 3.3e-6)
    assert h.transfer_s == pytest.approx(42 * 16.1e-6 + 205 * 3.3e-6)
    assert h.offload_s == pytest.approx(0.21)


def test_refit_adds_the_ops_and_collections():
    """One DGX node, TP2 EP2, one engine of 8: nemo-v03-ops is nemo-v03 with the gather's
    and conversion's ops in the gather, the pack and unpack in the transfer (the pack's
    41 copy launches, 4 us each, now inside their ops), the 0.21 s of collections added."""
    v03, ops = one_node_sync("nemo-v03"), one_node_sync("nemo-v03-ops")
    h = host_ops(SPEC, tp=2, pp=1, ep=2, etp=1, hf_tensors=41, buckets=1)
    assert ops.phases["gather_s"] == pytest.approx(v03.phases["gather_s"] + h.gather_s)
    assert ops.phases["transfer_s"] == pytest.approx(
        v03.phases["transfer_s"] + h.transfer_s - 41 * 4e-6)
    assert ops.phases["load_s"] == v03.phases["load_s"]
    assert ops.phases["offload_gc_s"] == pytest.approx(0.21)
    assert ops.time_s == pytest.approx(v03.time_s + h.gather_s + h.transfer_s - 41 * 4e-6
                                       + 0.21)
    assert ops.phases["handle_transfer"] == v03.phases["handle_transfer"]
    assert "host_ops" not in v03.phases and "offload_gc_s" not in v03.phases
