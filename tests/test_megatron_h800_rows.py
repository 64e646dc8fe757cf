"""The inputs of benchmarks/megatron_moe_h800.py, worked out by hand: each pipeline split
as the sources describe it, and each row's batch and GPU written as its source gives it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import megatron_moe_h800 as bench  # noqa: E402

from moesim.scenario import load_scenario  # noqa: E402
from moesim.schedule.layout_string import layout_chunks  # noqa: E402
from moesim.wiring import resolve  # noqa: E402


@pytest.mark.parametrize("pp,vpp", sorted(bench.LAYOUTS))
def test_splits_put_one_fewer_layer_on_the_end_stages(pp, vpp):
    chunks = layout_chunks(bench.LAYOUTS[(pp, vpp)], layers=94, mtp=0, n_stages=pp * vpp)
    per_rank = [sum(len(chunks[c * pp + r]) for c in range(vpp)) for r in range(pp)]
    assert sum(per_rank) == 94
    full = max(per_rank)
    # the embedding and the loss count as one layer each: one fewer on the first and last
    assert per_rank[0] == per_rank[-1] == full - 1
    assert all(n == full for n in per_rank[1:-1])


def test_rows_resolve_to_the_pages_batches(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(bench.BASE)
    for row in bench.ROWS:
        # each source's two figures agree: tokens/GPU/s = GBS x 4096 / 256 / s per iteration
        assert row.gbs * bench.SEQ / bench.GPUS / row.step_s == pytest.approx(row.tokens,
                                                                               rel=2e-3)
        res = resolve(load_scenario(path, bench.row_sets(row)))
        lay, sch = res.layout, res.scenario.schedule
        assert (lay.tp, lay.pp, lay.ep) == (row.tp, row.pp, row.ep)
        assert lay.dp * sch.microbatches * sch.micro_batch_size == row.gbs
        assert res.scenario.parallel.ep_backend.kind == ("deepep" if row.dispatcher == "deepep"
                                                         else "nccl")
        assert res.device.name == row.system
