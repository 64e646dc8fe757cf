"""A packed row's core attention priced per sequence (rl.train.packed_attention,
moesim.rl.packed_attention): the catalog's own rates by hand, the other kernels
untouched, rows of one sequence unchanged, NeMo RL's PP padding, a bad value refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moesim.cli import main
from moesim.model.costs import attention_kernels
from moesim.rl.engine_costs import EngineTrainerCosts
from moesim.rl.packed_attention import PerSequenceCompute, causal_tiles, row_sequences
from moesim.rl.packing import PackedRows, one_row, pack, pack_rows
from moesim.rl.run import resolve_rl
from moesim.wiring import resolve_path
from tests.test_rl_run import scenario

LAUNCH = 4e-6      # H100's launch overhead (moesim.compute.devices)


@pytest.fixture(scope="module")
def h100():
    """Llama-3.1-8B on H100 with the kernel catalog (FlashAttention-3's tables)."""
    return resolve_path("scenarios/grpo-llama31-8b-nemo-v03.yaml")


def _core(res, seq: int, phase: str):
    ks = attention_kernels(res.model, seq, seq, 1, phase)
    core = [k for k in ks if k.kind in ("attn_fwd", "attn_bwd")]
    assert len(core) == 1
    return core[0], [k for k in ks if k is not core[0]]


def test_two_sequences_of_512_against_one_of_1024_by_hand(h100):
    # 32 heads of 128 (q and v): causal FLOPs 0.5 x 2 x s x s x 32 x 256 = 8,192 s^2
    wrap = PerSequenceCompute(h100.compute, 1024, ((512, 512),))
    fwd, _ = _core(h100, 1024, "fwd")
    assert fwd.flops == 8192 * 1024 ** 2
    # the catalog: fa3-fwd-d128-causal 423 TFLOP/s at 1,024, 292 at 512
    row = LAUNCH + 8192 * 1024 ** 2 / 423e12
    per_seq = LAUNCH + 2 * 8192 * 512 ** 2 / 292e12          # one varlen launch
    assert h100.compute.time_s(fwd) == pytest.approx(row, rel=1e-12)
    assert wrap.time_s(fwd) == pytest.approx(per_seq, rel=1e-12)
    assert (wrap.time_s(fwd) - LAUNCH) / (row - LAUNCH) == pytest.approx(
        0.5 * 423 / 292, rel=1e-12)
    # backward (2.5x the FLOPs): fa3-bwd-d128 (non-causal) 424 and 316 TFLOP/s times the
    # forward's causal / non-causal ratio, 423/565 at 1,024 and 292/467 at 512
    bwd, _ = _core(h100, 1024, "bwd")
    r1024, r512 = 424 * 423 / 565, 316 * 292 / 467
    row_b = LAUNCH + 2.5 * 8192 * 1024 ** 2 / (r1024 * 1e12)
    seq_b = LAUNCH + 2 * 2.5 * 8192 * 512 ** 2 / (r512 * 1e12)
    assert h100.compute.time_s(bwd) == pytest.approx(row_b, rel=1e-12)
    assert wrap.time_s(bwd) == pytest.approx(seq_b, rel=1e-12)


def test_a_roofline_model_is_wrapped_too(h100):
    """A device without catalog tables (a RooflineModel, no ``price``): the wrapper's
    price is the roofline's, per sequence. A row of one full sequence costs the row's
    time; two sequences of 512 less: at least half the row's work (causal FLOPs go as
    s^2, so two halves hold half of them) and at most all of it."""
    from moesim.compute.roofline import RooflineModel

    roof = RooflineModel(h100.compute.device)
    assert not hasattr(roof, "price")
    fwd, _ = _core(h100, 1024, "fwd")
    full = PerSequenceCompute(roof, 1024, ((1024,),)).price(fwd)
    assert full.source == "roofline" and full.detail.endswith("per packed sequence")
    assert full.time_s == pytest.approx(roof.time_s(fwd), rel=1e-12)
    launch = roof.time_s(dataclasses.replace(fwd, flops=0.0, bytes=0.0))
    half = PerSequenceCompute(roof, 1024, ((512, 512),)).price(fwd).time_s - launch
    assert 0.5 * (full.time_s - launch) <= half < full.time_s - launch


def test_below_the_catalogs_shortest_row_the_tiles_scale_its_price(h100):
    # FlashAttention-3's tables start at 512: a 256-token sequence takes the price at 512
    # times its causal tiles over 512's: forward 128 x 128 tiles, 3 of 10; backward
    # 64 x 128 tiles, 6 of 20 (the catalog alone would hand it to the roofline)
    wrap = PerSequenceCompute(h100.compute, 1024, ((256, 256, 512),))
    fwd, _ = _core(h100, 1024, "fwd")
    w512 = 8192 * 512 ** 2 / 292e12
    assert wrap.time_s(fwd) == pytest.approx(LAUNCH + 2 * 3 / 10 * w512 + w512, rel=1e-12)
    bwd, _ = _core(h100, 1024, "bwd")
    b512 = 2.5 * 8192 * 512 ** 2 / (316 * 292 / 467 * 1e12)
    assert wrap.time_s(bwd) == pytest.approx(LAUNCH + 2 * 6 / 20 * b512 + b512, rel=1e-12)
    assert causal_tiles(512, 128, 128) == 10 and causal_tiles(200, 64, 128) == 6
    assert causal_tiles(256, 128, 128, causal=False) == 4


def test_rows_are_averaged_and_other_kernels_unchanged(h100):
    # rows (512, 512) and (1024,): the mean of the two rows' attention
    fwd, others = _core(h100, 1024, "fwd")
    _, others_b = _core(h100, 1024, "bwd")
    one = PerSequenceCompute(h100.compute, 1024, ((512, 512),)).time_s(fwd)
    two = PerSequenceCompute(h100.compute, 1024, ((512, 512), (1024,))).time_s(fwd)
    assert two == pytest.approx((one + h100.compute.time_s(fwd)) / 2, rel=1e-12)
    wrap = PerSequenceCompute(h100.compute, 1024, ((512, 512),))
    # conservation: projections, rotary, the backward's preprocess and dQ convert, and an
    # attention kernel over another length (a sliding window's) keep their prices
    short, _ = _core(h100, 512, "fwd")
    assert len(others) >= 3 and len(others_b) >= 5
    for k in [*others, *others_b, short]:
        assert wrap.time_s(k) == h100.compute.time_s(k)


def test_rows_of_one_full_sequence_are_priced_as_before(tmp_path):
    # per_sequence on rows that each hold one sequence of the row's length: the same
    # training step and log-prob pass as the row pricing (toy model, roofline)
    p = scenario(tmp_path)
    row = EngineTrainerCosts(resolve_rl(p).scenario, 8, 8, tp=1, pp=1, ep=8, seq_len=512)
    on = resolve_rl(p, ["rl.train.packed_attention=per_sequence"]).scenario
    per = EngineTrainerCosts(on, 8, 8, tp=1, pp=1, ep=8, seq_len=512)
    full = PackedRows([(512,)] * 20)
    assert per.train_step_s(full) == pytest.approx(row.train_step_s(20), rel=1e-12)
    assert per.forward_s(full) == pytest.approx(row.forward_s(20), rel=1e-12)
    # rows of two 256-token sequences: both passes cheaper, and only with the knob on
    half = PackedRows([(256, 256)] * 20)
    assert per.train_step_s(half) < row.train_step_s(20)
    assert per.forward_s(half) < row.forward_s(20)
    assert row.train_step_s(half) == row.train_step_s(20)


def test_packing_carries_each_rows_sequences():
    lengths = np.array([100, 300, 200, 400, 500])
    rows = pack_rows(lengths, 600)
    # first fit longest first: 500, 400, 300 open rows; 200 fits beside 400, 100 beside 500
    assert rows == 3 and rows.members == ((500, 100), (400, 200), (300,))
    assert [sum(m) for m in rows.members] == pack(lengths, 600).tolist()
    one = one_row(rows)
    assert one == 1 and one.members == rows.members and one_row(7) == 1
    # NeMo RL with PP pads each row's last sequence to the longest row (600)
    assert row_sequences(rows, pp=1) == rows.members
    assert row_sequences(rows, pp=2) == ((500, 100), (400, 200), (600,))
    assert row_sequences(PackedRows([(3, 2), (4,)]), pp=4) == ((3, 2), (5,))
    assert row_sequences(5, pp=2) is None


def test_bad_value_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--set", "rl.train.packed_attention=sequence",
                 "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.train.packed_attention" in err and "per_sequence" in err


def test_summary_echoes_the_knob_only_when_set(tmp_path):
    from moesim.scenario.sections.rl import summary_dict

    p = scenario(tmp_path)
    off = summary_dict(resolve_rl(p).cfg)["train"]
    on = summary_dict(resolve_rl(p, ["rl.train.packed_attention=per_sequence"]).cfg)["train"]
    assert "packed_attention" not in off and on["packed_attention"] == "per_sequence"
    assert dataclasses.asdict(resolve_rl(p).cfg.train)["packed_attention"] == "row"
