"""Transformer Engine's TP communication overlap (``overlap.tp_comm``, issue 22 item 5),
worked out by hand on a TP2 pair with one dense layer.

Two H100s on a 50 GB/s PCIe switch without latency, the roofline without launch cost
(989 TFLOP/s bf16, 3.35 TB/s HBM at 0.8, small-GEMM efficiency 0.75·d/(d + 128), d the
smallest GEMM dimension). 4096 tokens of hidden 512 per micro-batch: every
sequence-parallel reduce-scatter or all-gather moves B = 4096·512·2 bytes, one ring step of
B/2 per rank: C = 2,097,152 / 50e9 s = 41.943 µs.
"""

from __future__ import annotations

import pytest
import yaml

from moesim.cli import main
from moesim.program import tp_overlap as tpo
from moesim.program.build import build_step
from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate

C = 4096 * 512 * 2 / 2 / 50e9
SLOW = 132 / (132 - 16)          # H100's 132 SMs, 16 taken by TE's pipeline/bulk kernels


def gemm_s(m, n, k, nbytes):
    """The roofline time of one GEMM (bf16), as docs/model.md gives it."""
    eff = 0.75 * min(m, n, k) / (min(m, n, k) + 128)
    return max(2 * m * n * k / (989e12 * eff), nbytes / (3.35e12 * 0.8))


# the layer's TP2 GEMMs beside an exchange (bytes: 2(mk + kn + mn), wgrad also reads dY)
PROJ = gemm_s(4096, 512, 256, 6_553_600)            # output projection (fwd, dgrad)
FC1 = gemm_s(4096, 2048, 512, 23_068_672)           # fc1 forward
FC2 = gemm_s(4096, 512, 1024, 13_631_488)           # fc2 forward and its dgrad
FC1_W = gemm_s(4096, 2048, 512, 29_360_128)         # fc1 wgrad


def test_closed_forms_by_hand():
    # pipeline: C/n + (n-1)·max(0, C/n - G/n); ring: (tp-1)·max(0, c - G/tp); bulk
    assert tpo.pipeline_s(8.0, 3.0, 4) == 3.0 + 3 * 1.0
    assert tpo.pipeline_s(20.0, 3.0, 4) == 3.0          # GEMM chunks longer: one chunk
    assert tpo.ring_s(4.0, 5.0, 2) == 3.0 and tpo.ring_s(12.0, 5.0, 2) == 0.0
    assert tpo.ring_s(8.0, 5.0, 4) == 3 * 3.0
    assert tpo.bulk_s(4.0, 5.0) == 1.0 and tpo.bulk_s(6.0, 5.0) == 0.0
    assert tpo.slowed(1.16, 132) == pytest.approx(1.32) and tpo.slowed(1.0, 0) == 1.0


def _scenario(tmp_path, **over):
    data = {"name": "tp2", "seed": 0,
            "cluster": {"topology": "pcie-8gpu", "device": "H100", "network": "flow",
                        "params": {"gpus_per_node": 2, "pcie_switches_per_cpu": 1,
                                   "cpus": 1, "pcie_GBps": 50.0, "pcie_latency_us": 0.0}},
            "model": {"preset": "toy", "layers": 1, "first_dense_layers": 1, "vocab": 8},
            "routing": {"kind": "uniform"},
            "parallel": {"tp": 2, "pp": 1, "ep": 1, "sequence_parallel": True},
            "schedule": {"kind": "gpipe", "microbatches": 1, "micro_batch_size": 1,
                         "seq_len": 4096},
            "compute": {"kind": "roofline", "launch_overhead_us": 0, "model": "roofline"},
            "overlap": {"dp_overlap": False}, **over}
    p = tmp_path / "tp2.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def _run(path, *sets):
    res = resolve(load_scenario(path, list(sets)))
    return res, simulate(res).summary


def test_each_exchange_beside_its_gemm_by_hand_on_both_engines(tmp_path):
    path = _scenario(tmp_path)
    r, n = C / 4, tpo.PIPELINE_SPLITS
    # forward: after attention a reduce-scatter pipelined under the output projection,
    # an all-gather ring-exchanged under fc1; after the FFN a reduce-scatter under fc2;
    # the all-gather before the LM head has no partner GEMM (exposed)
    fwd = [(tpo.pipeline_s(PROJ * SLOW, r, n), PROJ * (SLOW - 1)),
           (tpo.ring_s(FC1, C, 2), 0.0),
           (tpo.pipeline_s(FC2 * SLOW, r, n), FC2 * (SLOW - 1)),
           (C, 0.0)]
    # backward: after the LM head's backward exposed; an all-gather under fc2's dgrad;
    # fc1's dgrad reduce-scatter beside fc1's wgrad (bulk); an all-gather under the
    # output projection's dgrad
    bwd = [(C, 0.0), (tpo.ring_s(FC2, C, 2), 0.0),
           (tpo.bulk_s(FC1_W * SLOW, C), FC1_W * (SLOW - 1)), (tpo.ring_s(PROJ, C, 2), 0.0)]
    assert fwd[0][0] == pytest.approx(r + 3 * (r - PROJ * SLOW / 4))
    assert bwd[2][0] == pytest.approx(C - FC1_W * SLOW)
    exposed = sum(e for e, _ in fwd + bwd)
    margin = sum(x for _, x in fwd + bwd)
    steps = {}
    for mode in ("exact", "fast"):
        _, off = _run(path, f"engine.mode={mode}")
        _, on = _run(path, f"engine.mode={mode}", "overlap.tp_comm=true")
        assert off["breakdown_s"]["tp"] == pytest.approx(8 * C, rel=1e-9)
        assert on["breakdown_s"]["tp"] == pytest.approx(exposed, rel=1e-9)
        assert on["step_time_s"] - off["step_time_s"] == pytest.approx(
            exposed + margin - 8 * C, rel=1e-9)
        steps[mode] = on["step_time_s"]
    assert steps["exact"] == pytest.approx(steps["fast"], rel=1e-12)


def test_the_pieces_of_a_pipelined_reduce_scatter(tmp_path):
    res = resolve(load_scenario(_scenario(tmp_path), ["overlap.tp_comm=true"]))
    prog = build_step(res).programs[0]
    rs = [(i, o) for i, o in enumerate(prog) if o.name == "fwd.sp_attn_reduce_scatter"]
    assert len(rs) == 4 and all(o.stream == "tp_ub" for _, o in rs)
    assert all(o.coll.nbytes == 4096 * 512 * 2 / 4 for _, o in rs)
    for _, o in rs:                 # chunk k waits for the GEMM's chunk k only
        (d,) = o.deps
        assert prog[d].name == "fwd.attn" and prog[d].duration_s == pytest.approx(
            PROJ * SLOW / 4)
    # the ring's one step (tp 2) waits for the norm before fc1 (none: at once) and the
    # second half of fc1 waits for it
    ag = [(i, o) for i, o in enumerate(prog) if o.name == "fwd.sp_attn_all_gather"]
    assert len(ag) == 1 and ag[0][1].coll.nbytes == 4096 * 512 * 2
    waits = [o for o in prog if ag[0][0] in o.deps]
    assert len(waits) == 1 and waits[0].name == "fwd.ffn"
    assert waits[0].duration_s == pytest.approx(FC1 / 2)


def test_off_by_default_and_refused_without_sequence_parallelism(tmp_path, capsys):
    path = _scenario(tmp_path)
    res = resolve(load_scenario(path))
    assert res.scenario.overlap.tp_comm is False
    assert not any(o.stream == "tp_ub" for o in build_step(res).programs[0])
    for bad, field in ((["parallel.sequence_parallel=false"], "parallel.sequence_parallel"),
                       (["parallel.tp=1"], "parallel.tp"),
                       (["parallel.zero=3"], "parallel.zero")):
        args = ["run", path, "--no-files", "--set", "overlap.tp_comm=true"]
        for s in bad:
            args += ["--set", s]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and field in err[0], err


@pytest.mark.parametrize("sets", [
    ["model.layers=3", "schedule.kind=1f1b", "schedule.microbatches=2"],
    ["model.layers=3", "memory.recompute=selective",
     "memory.recompute_modules=[layernorm]"],
])
def test_both_engines_agree_with_moe_layers(tmp_path, sets):
    """A dense layer then MoE layers (their exchanges: the reduce-scatter after attention,
    the all-gather before the next attention; in the backward the gradients' kinds)."""
    path = _scenario(tmp_path)
    steps = {}
    for mode in ("exact", "fast"):
        _, on = _run(path, f"engine.mode={mode}", "overlap.tp_comm=true", *sets)
        _, off = _run(path, f"engine.mode={mode}", *sets)
        assert on["step_time_s"] < off["step_time_s"]
        b = on["breakdown_s"]
        # a peer's lateness in a chunked exchange: a stall on the fast engine, waiting on
        # the tp_ub stream (exposed tp) on the exact one
        steps[mode] = (on["step_time_s"], b["tp"] + b.get("stall", 0.0))
    assert steps["exact"] == pytest.approx(steps["fast"], rel=1e-9)
