"""moesim's restatement of Megatron-LM's theoretical memory, against figures printed by
Megatron's own file, and ``moesim memory --megatron``.

Reference figures: megatron/training/theoretical_memory_usage.py of NVIDIA/Megatron-LM at
commit d98e8a64ddf34856e74b24714e3bedb2f5a39553, copied outside this repository with its
two helpers (is_hybrid_model -> False, print_rank_0 -> no-op) stubbed, called with
SimpleNamespace(**megatron_args(spec, setup)) for each configuration below:
compute_weight_and_optimizer_memory(args) and, for sequence parallel with selective
recompute, compute_activation_memory(args, num_microbatches) else
compute_activation_memory_without_sp(args, num_microbatches). Bytes.
"""

from __future__ import annotations

import pytest

from moesim.cli import main
from moesim.memory.megatron import MegatronSetup, megatron_args, theoretical_memory
from moesim.model import PRESETS

S = dict(seq_len=4096)
CONFIGS = {
    "mixtral-ep8": ("mixtral-8x7b", MegatronSetup(tp=1, pp=2, dp=8, ep=8, microbatches=8,
                                                  recompute="selective", **S)),
    "mixtral-64gpu-vpp2": ("mixtral-8x7b", MegatronSetup(tp=1, pp=4, dp=16, ep=8, vpp=2,
                                                         microbatches=16,
                                                         recompute="selective", **S)),
    "mixtral-tp2-sp": ("mixtral-8x7b", MegatronSetup(tp=2, pp=2, dp=4, ep=8, microbatches=8,
                                                     sequence_parallel=True,
                                                     recompute="selective", **S)),
    "deepseek-v3-pp16": ("deepseek-v3", MegatronSetup(tp=1, pp=16, dp=128, ep=64,
                                                      microbatches=120, recompute="full", **S)),
    "deepseek-v3-pp16-mtp1": ("deepseek-v3", MegatronSetup(tp=1, pp=16, dp=128, ep=64,
                                                           microbatches=120, recompute="full",
                                                           mtp_layers=1, **S)),
    "qwen3-235b-vpp4": ("qwen3-235b-a22b", MegatronSetup(tp=2, pp=8, dp=16, ep=32, vpp=4,
                                                         microbatches=128,
                                                         sequence_parallel=True,
                                                         recompute="selective", **S)),
    "qwen3-30b-pp1": ("qwen3-30b-a3b", MegatronSetup(tp=1, pp=1, dp=8, ep=8, microbatches=4,
                                                     recompute=None, **S)),
    "qwen3-30b-tp2-sp-nodist": ("qwen3-30b-a3b", MegatronSetup(
        tp=2, pp=1, dp=4, ep=8, microbatches=4, sequence_parallel=True,
        recompute="selective", distributed_optimizer=False, **S)),
}
# (weight_and_optimizer, activation) as Megatron's file printed them (bytes)
MEGATRON = {
    "mixtral-ep8": (56755436544.0, 19201592524.8),
    "mixtral-64gpu-vpp2": (20063312640.0, 26450728550.4),
    "mixtral-tp2-sp": (54349940736.0, 8606744576.0),
    "deepseek-v3-pp16": (19123486218.0, 64431351398.4),
    "deepseek-v3-pp16-mtp1": (22657240074.0, 64431351398.4),
    "qwen3-235b-vpp4": (20937930624.0, 28912545792.0),
    "qwen3-30b-pp1": (76787923968.0, 15708069888.0),
    "qwen3-30b-tp2-sp-nodist": (79214579712.0, 7305445376.0),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_restatement_matches_megatrons_own_figures(name):
    preset, setup = CONFIGS[name]
    got = theoretical_memory(megatron_args(PRESETS[preset], setup), setup.microbatches)
    wo, act = MEGATRON[name]
    assert got["weights"] + got["gradients"] + got["optimizer"] == pytest.approx(wo, rel=1e-12)
    assert got["activations"] == pytest.approx(act, rel=1e-12)


def test_bytes_per_parameter_split_by_hand():
    # Megatron: 18 bytes/param without the distributed optimizer, 6 + 12/d with it
    spec = PRESETS["qwen3-30b-a3b"]
    plain = theoretical_memory(megatron_args(spec, MegatronSetup(dp=4, ep=1,
                                                                 distributed_optimizer=False)))
    n = plain["dense_params"] + plain["expert_params"]
    assert plain["weights"] == 2 * n and plain["gradients"] == 4 * n
    assert plain["optimizer"] == 12 * n
    dist = theoretical_memory(megatron_args(spec, MegatronSetup(dp=4, ep=1)))
    # ep 1: edp = world / pp = 4 = dp, so every parameter's optimizer state splits 4 ways
    assert dist["optimizer"] == pytest.approx(12 * n / 4, rel=1e-12)


def test_memory_megatron_prints_side_by_side(capsys):
    assert main(["memory", "toy-cpu", "--megatron"]) == 0
    out = capsys.readouterr().out
    assert "against Megatron's estimate" in out
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()
            if ln.split() and ln.split()[0] in ("weights", "gradients", "optimizer",
                                                "activations", "total")}
    assert set(rows) == {"weights", "gradients", "optimizer", "activations", "total"}
    for cat, (ours, theirs, diff) in rows.items():
        assert float(ours) - float(theirs) == pytest.approx(float(diff), abs=0.011), cat
    # moesim keeps bf16 gradients (2 bytes), Megatron fp32 main gradients (4): half
    assert float(rows["gradients"][0]) == pytest.approx(float(rows["gradients"][1]) / 2,
                                                        abs=0.011)
    assert main(["memory", "toy-cpu", "--megatron", "--set", "memory.grad_dtype=fp32"]) == 0
    out = capsys.readouterr().out
    grads = next(ln for ln in out.splitlines() if ln.startswith("gradients")).split()
    assert grads[1] == grads[2]
