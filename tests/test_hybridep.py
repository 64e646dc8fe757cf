"""HybridEP priced from its published H100 rates (moesim.ep.hybridep,
``parallel.ep_backend.kind: hybridep``): the table's points exactly, interpolation worked by
hand, the per-rank bound of an exchange, both engines on one step, and the refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from moesim.engine.fast.engine import simulate_fast
from moesim.ep import hybridep
from moesim.errors import InputError
from moesim.program.build import Builder
from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate


def test_published_points_are_returned_exactly():
    assert hybridep.rate_Bps(16, 16, "ep_dispatch", "bf16") == pytest.approx(54.47e9, rel=1e-12)
    assert hybridep.rate_Bps(32, 8, "ep_combine", "bf16") == pytest.approx(50.68e9, rel=1e-12)
    assert hybridep.rate_Bps(64, 4, "ep_dispatch", "fp8") == pytest.approx(30.42e9, rel=1e-12)


def test_interpolation_by_hand():
    # 6 SMs at 16 ranks: halfway between the 4- and 8-SM rows
    assert hybridep.rate_Bps(16, 6, "ep_dispatch", "bf16") == pytest.approx(
        (37.08 + 57.74) / 2 * 1e9, rel=1e-12)
    # more SMs than the table: the 16-SM row
    assert hybridep.rate_Bps(32, 32, "ep_combine", "bf16") == pytest.approx(52.53e9, rel=1e-12)
    # 24 ranks: log2(24) - 4 = 0.585 of the way from 16 to 32 ranks
    f = math.log2(24) - 4
    assert hybridep.rate_Bps(24, 16, "ep_dispatch", "bf16") == pytest.approx(
        (54.47 + f * (47.36 - 54.47)) * 1e9, rel=1e-12)


def test_bound_is_the_counted_bytes_at_the_rate():
    # 16 ranks on 2 nodes; rank 0's 4096 tokens all reach both nodes, rank 1's only one
    node_tokens = np.zeros((16, 2))
    node_tokens[0] = (4096, 4096)
    node_tokens[1] = (4096, 0)
    t = hybridep.bound_s(node_tokens, 2048, "ep_dispatch", "bf16", 16)
    assert t[0] == pytest.approx(8192 * 2 * 2048 / 54.47e9, rel=1e-12)
    assert t[1] == pytest.approx(t[0] / 2, rel=1e-12) and t[2] == 0.0
    fp8 = hybridep.bound_s(node_tokens, 2048, "ep_dispatch", "fp8", 16)
    assert fp8[0] == pytest.approx(8192 * 2 * 2048 * (1 + 4 / 128) / 2 / 48.26e9, rel=1e-12)


@pytest.mark.parametrize("call, field", [
    (lambda: hybridep.rate_Bps(8, 16, "ep_dispatch", "bf16"), "parallel.ep_backend.kind"),
    (lambda: hybridep.rate_Bps(128, 16, "ep_dispatch", "bf16"), "parallel.ep_backend.kind"),
    (lambda: hybridep.rate_Bps(16, 2, "ep_dispatch", "bf16"), "parallel.ep_backend.sms"),
    (lambda: hybridep.rate_Bps(16, 16, "ep_combine", "fp8"), "routing.combine_dtype"),
    (lambda: hybridep.check_layout("H800", 8, "s.yaml"), "parallel.ep_backend.kind"),
    (lambda: hybridep.check_layout("H100", 4, "s.yaml"), "parallel.ep_backend.kind"),
])
def test_outside_the_published_rates_is_refused(call, field):
    with pytest.raises(InputError) as e:
        call()
    assert e.value.field == field


SETS = ["parallel.ep_backend.kind=hybridep", "parallel.ep_backend.sms=16",
        "model.layers=2", "schedule.microbatches=2", "compute.precision=bf16"]


def _res(extra=()):
    return resolve(load_scenario("qwen3-30b-a3b-16-h100", [*SETS, *extra]))


def test_spec_bounds_each_rank_by_its_copies_at_the_published_rate():
    res = _res()
    b = Builder(res, 0)
    be = b.ep_backend
    assert be.kind == "hybridep" and be.deepep and be.needs_dedup and be.sms == 16
    g = tuple(int(x) for x in res.layout.ep_groups[0])
    per = be.ranks_per_node(g, b.gpn)
    assert per == 8
    layer = sorted(b.moe_layers)[0]
    r = b.routes.route(g[0], g, layer, 0)
    node_tokens = np.asarray(r.node_tokens, dtype=float)
    for name, op in (("fwd.dispatch", "ep_dispatch"), ("fwd.combine", "ep_combine")):
        spec = be.spec(r, g, name, per)
        want = node_tokens.sum(axis=1) * 2 * 2048 / hybridep.rate_Bps(16, 16, op, "bf16")
        np.testing.assert_allclose(spec.sm_s, want, rtol=1e-12)
        assert spec.fill_s == 0.0 and spec.sms == 16
        # the copies on the links are DeepEP's plan: every token reaches its nodes
        assert spec.matrix.sum() > 0


def test_both_engines_give_the_same_step_and_the_bound_holds():
    res = _res()
    exact = simulate(res, engine="exact")
    fast = simulate_fast(_res())
    assert fast.step_time_s == pytest.approx(exact.step_time_s, rel=1e-9)
    deepep = simulate(_res(["parallel.ep_backend.kind=deepep"]), engine="exact")
    # HybridEP's published rate is slower than DeepEP's model on this shape: longer step
    assert exact.step_time_s > deepep.step_time_s


def test_another_device_is_refused_in_one_line():
    with pytest.raises(InputError) as e:
        simulate(_res(["cluster.topology=dgx-h800", "cluster.device=H800"]))
    assert e.value.field == "parallel.ep_backend.kind"
    assert "H100" in e.value.expected


def _cli(*extra):
    return ["collective", "--topology", "dgx-h100", "--nodes", "2", "--kernel", "hybridep",
            "--tokens", "4096", "--hidden", "7168", "--experts", "128", "--top-k", "8", *extra]


def test_cli_prices_the_benchmark_shape_at_the_published_rate(capsys):
    """On HybridEP's own benchmark shape the links are faster than the published rate, so
    the slowest rank's (token, node) payload over its time is that rate exactly."""
    from moesim.cli import main

    for op, dtype, sms, want in (("ep_dispatch", "bf16", 16, 54.47),
                                 ("ep_combine", "bf16", 8, 56.96),
                                 ("ep_dispatch", "fp8", 4, 28.09)):
        assert main([*_cli("--op", op, "--dtype", dtype, "--sms", str(sms), "--json")]) == 0
        res = json.loads(capsys.readouterr().out)
        assert res["kernel"] == "hybridep" and res["sms"] == sms and res["ranks"] == 16
        assert res["rdma_GBps"] == pytest.approx(want, rel=1e-9)
        # the payload as the benchmark counts it: (token, node) copies x 2H (x fp8 factor)
        per = 2 * 7168 * (hybridep.FP8_FACTOR if dtype == "fp8" else 1.0)
        assert res["rdma_bytes_mean"] == pytest.approx(
            res["token_node_copies"] / 16 * per, rel=1e-12)
    assert main([*_cli("--op", "ep_dispatch", "--json")]) == 0
    assert json.loads(capsys.readouterr().out)["sms"] == 16      # Megatron's default


@pytest.mark.parametrize("extra, field", [
    (["--op", "ep_dispatch", "--topology", "dgx-h800"], "--kernel"),
    (["--op", "ep_dispatch", "--nodes", "1", "--experts", "64"], "--kernel"),
    (["--op", "ep_combine", "--dtype", "fp8"], "--dtype"),
    (["--op", "ep_combine", "--sms", "2"], "--sms"),
])
def test_cli_refuses_outside_the_table_in_one_line(capsys, extra, field):
    from moesim.cli import main

    assert main([*_cli(), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err
