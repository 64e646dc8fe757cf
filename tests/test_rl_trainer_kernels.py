"""rl.train.sort_chunks (moesim.rl.trainer_kernels): Megatron's sort_chunks_by_idxs in the
RL trainer's passes, its bytes worked by hand on the toy, off by default."""

from __future__ import annotations

import dataclasses

from moesim.program.inventory import layer_ops
from moesim.rl.engine_costs import EngineTrainerCosts
from moesim.rl.run import resolve_rl
from moesim.rl.trainer_kernels import with_sort_chunks
from moesim.wiring import resolve
from tests.test_rl_run import scenario


def _costs(tmp_path, on: bool, ep: int = 2):
    scn = resolve_rl(scenario(tmp_path)).scenario
    tr = dataclasses.replace(scn.rl.train, sort_chunks=on)
    scn = dataclasses.replace(scn, rl=dataclasses.replace(scn.rl, train=tr))
    return EngineTrainerCosts(scn, 8, 8, tp=1, pp=1, ep=ep, seq_len=512)


def _sorts(res) -> list[tuple[str, str, float]]:
    return [(p, o.op, k.bytes) for p in ("fwd", "dgrad") for o in layer_ops(res, 0, p)
            for k in o.kernels if k.name == "sort_chunks_by_idxs"]


def test_sort_chunks_bytes_by_hand(tmp_path):
    # the toy: hidden 512, 8 experts, top-2; a row of 512 tokens at TP1 EP2: each of the
    # 4 local experts receives 512 x 2 x 2 / 8 = 256 rows, 1,024 in all. After the
    # dispatch each BF16 row and its FP32 prob are read and written: 2 x (2 x 512 + 4) x
    # 1,024 = 2,105,344 bytes; before the combine the rows alone: 2 x 2 x 512 x 1,024 =
    # 2,097,152; the backward moves the gradients the same way
    res = with_sort_chunks(resolve(_costs(tmp_path, True).scn))
    assert _sorts(res) == [("fwd", "fwd.router", 2_105_344), ("fwd", "fwd.unpermute", 2_097_152),
                           ("dgrad", "bwd.unpermute", 2_097_152),
                           ("dgrad", "bwd.router", 2_105_344)]


def test_off_by_default_and_not_with_one_local_expert(tmp_path):
    assert resolve_rl(scenario(tmp_path)).scenario.rl.train.sort_chunks is False
    off = resolve(_costs(tmp_path, False).scn)
    assert with_sort_chunks(off) is off and _sorts(off) == []
    # EP8 over 8 experts: one local expert, nothing to sort
    one = resolve(_costs(tmp_path, True, ep=8).scn)
    assert with_sort_chunks(one) is one


def test_the_trainer_passes_take_the_sorts(tmp_path):
    off, on = _costs(tmp_path, False), _costs(tmp_path, True)
    assert on.train_step_s(8) > off.train_step_s(8)
    assert on.forward_s(8) > off.forward_s(8)


def test_the_rl_summary_echoes_the_knob_only_when_on(tmp_path):
    from moesim.scenario.sections.rl import summary_dict
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert "sort_chunks" not in summary_dict(cfg)["train"]
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, sort_chunks=True))
    assert summary_dict(on)["train"]["sort_chunks"] is True
