"""The step engine on tiny, hand-checkable cases."""

from __future__ import annotations

import json

import pytest
import yaml

from moesim.model import costs, model_from_dict
from moesim.scenario import load_scenario
from moesim.trace.report import jsonable
from moesim.wiring import resolve, simulate
from tests._util import two_gpu_scenario


def spans_of(result, rank, name):
    return [s for s in result.spans if s.rank == rank and s.name == name]


def test_cold_rank_waits_at_combine_for_the_hot_expert(tmp_path):
    path = two_gpu_scenario(tmp_path)
    r = simulate(path)
    spec = model_from_dict({"preset": "toy", "layers": 1}, "t")
    # the scenario's compute model (the H100 kernel catalog, the roofline for the rest)
    model = resolve(load_scenario(path)).compute

    def expert_time(span):
        toks = span.args["expert_tokens"]
        return sum(model.time_s(k) for n in toks.values() for k in costs.expert_kernels(spec, n))

    exp = {rk: spans_of(r, rk, "fwd.experts")[0] for rk in (0, 1)}
    disp = {rk: [s for s in spans_of(r, rk, "fwd.dispatch") if s.kind == "ep_dispatch"][0]
            for rk in (0, 1)}
    # expert 0 (on rank 0) is hot: rank 0 computes more tokens
    assert exp[0].tokens > exp[1].tokens
    for rk in (0, 1):  # expert compute time is the time of its kernels
        assert exp[rk].dur_s == pytest.approx(expert_time(exp[rk]), rel=1e-12)
        assert exp[rk].start_s == pytest.approx(disp[rk].end_s, abs=1e-15)
    stall = [s for s in spans_of(r, 1, "fwd.combine") if s.kind == "stall"]
    assert len(stall) == 1
    expected = (disp[0].end_s + expert_time(exp[0])) - (disp[1].end_s + expert_time(exp[1]))
    assert stall[0].dur_s == pytest.approx(expected, rel=1e-9)
    assert stall[0].waited_on == 0 and stall[0].expert == 0
    assert "expert 0" in stall[0].reason
    assert not [s for s in spans_of(r, 0, "fwd.combine") if s.kind == "stall"]


def test_tokens_and_bytes_conserved(tmp_path):
    r = simulate(two_gpu_scenario(tmp_path, routing={"capacity_factor": 1.0}))
    ex = r.summary["experts"]
    import numpy as np
    tok = np.array(ex["tokens_per_expert"])
    kept = np.array(ex["kept_per_expert"])
    dropped = np.array(ex["dropped"])
    assert (tok == kept + dropped).all()
    assert dropped.sum() > 0  # hot expert over capacity
    # every routed assignment: 512 tokens per rank x 2 ranks x top-2
    assert tok.sum() == 512 * 2 * 2
    computed = sum(s.tokens for s in r.spans if s.name == "fwd.experts")
    assert computed == kept.sum()
    # dispatch bytes out == combine bytes back (both bf16 here)
    sent = sum(s.bytes for s in r.spans if s.name == "fwd.dispatch" and s.kind == "ep_dispatch")
    back = sum(s.bytes for s in r.spans if s.name == "fwd.combine" and s.kind == "ep_combine")
    assert sent == pytest.approx(back)
    # breakdown of every rank sums to the step time
    for row in r.summary["per_rank"]:
        assert sum(row["breakdown_s"].values()) == pytest.approx(r.step_time_s)


def test_same_seed_same_bytes_and_uniform_seed_changes_little(tmp_path):
    path = two_gpu_scenario(tmp_path, routing={"kind": "uniform"})
    a = simulate(path)
    b = simulate(path)
    strip = lambda s: json.dumps(jsonable({k: v for k, v in s.items() if k != "sim_wall_s"}))  # noqa: E731
    assert strip(a.summary) == strip(b.summary)
    c = simulate(path, ["seed=11"])
    assert strip(c.summary) != strip(a.summary)
    assert c.step_time_s == pytest.approx(a.step_time_s, rel=0.05)


def measured_bubble(tmp_path, kind: str, p: int, m: int, v: int = 1):
    """Run a dense model of uniform stages on p GPUs with negligible communication and
    return (bubble fraction of the pipeline part of the step, result). The pipeline part
    ends with the last backward (the optimizer after it is not in the formulas)."""
    topo = {
        "name": "four",
        "nodes": [{"id": f"g{i}", "kind": "gpu", "host": 0, "local": i} for i in range(p)]
        + [{"id": "sw", "kind": "nvswitch"}],
        "links": [{"src": f"g{i}", "dst": "sw", "kind": "nvlink", "bandwidth_GBps": 1e6,
                   "latency_us": 1e-6} for i in range(p)],
    }
    (tmp_path / "pipe-topo.yaml").write_text(yaml.safe_dump(topo))
    data = {
        "name": "pipe", "cluster": {"topology": str(tmp_path / "pipe-topo.yaml"),
                                    "device": "H100"},
        # dense model, embedding/LM head negligible (vocab 8), layers big enough that
        # kernel launch overheads are negligible
        "model": {"preset": "toy", "layers": 2 * p * v, "n_experts": 0, "vocab": 8,
                  "hidden": 4096, "dense_ffn": 16384, "heads": 32, "kv_heads": 32,
                  "head_dim": 128},
        "parallel": {"pp": p, "vpp": v},
        "schedule": {"kind": kind, "microbatches": m, "seq_len": 4096},
        # the last stage also runs the final norm; at the streaming rate it adds 0.6 % to
        # that stage, at Megatron's fused-norm rate (the default) 1 %, which is as much as
        # the uniform-stage formula's tolerance below
        "compute": {"memory_kernels": "stream"},
    }
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(data))
    r = simulate(path)
    work = [s for s in r.spans if s.kind == "compute" and s.phase in ("fwd", "bwd")]
    t_pipe = max(s.end_s for s in work)
    busy = [sum(s.dur_s for s in work if s.rank == rk) for rk in range(p)]
    return 1 - sum(busy) / p / t_pipe, r


def test_pipeline_bubble_matches_gpipe_and_1f1b_formula(tmp_path):
    """Dense uniform stages, negligible communication: bubble = (p-1)/(m+p-1) of the step."""
    p, m = 4, 8
    for kind in ("gpipe", "1f1b"):
        bubble, r = measured_bubble(tmp_path, kind, p, m)
        assert bubble == pytest.approx((p - 1) / (m + p - 1), rel=0.01)
        waits = sum(s.dur_s for s in r.spans if s.kind == "bubble")
        assert waits > 0 and all(s.kind != "stall" for s in r.spans)


def test_shipped_small_scenarios_run():
    for name in ("toy-cpu", "hot-expert"):
        res = resolve(load_scenario(f"scenarios/{name}.yaml"))
        r = simulate(res)
        assert r.step_time_s > 0
        assert r.summary["tokens_per_s"] > 0


def test_ep_overlap_hides_all_to_all_behind_other_microbatch(tmp_path):
    common = {"routing": {"kind": "uniform"},
              "schedule": {"kind": "gpipe", "microbatches": 2, "seq_len": 2048}}
    plain = simulate(two_gpu_scenario(tmp_path, **common))
    over = simulate(two_gpu_scenario(tmp_path, **common), ["overlap.ep_comm_overlap=true"])
    bp, bo = plain.summary["breakdown_s"], over.summary["breakdown_s"]
    # same work, same bytes
    assert bo["compute"] == pytest.approx(bp["compute"], rel=1e-12)
    sent = lambda r: sum(s.bytes for s in r.spans if s.kind.startswith("ep_"))  # noqa: E731
    assert sent(over) == pytest.approx(sent(plain))
    # all-to-alls run on their own stream and are (mostly) hidden under compute
    assert all(s.stream == "ep" for s in over.spans if s.kind.startswith("ep_"))
    exposed = lambda b: b["ep_dispatch"] + b["ep_combine"]  # noqa: E731
    assert exposed(bp) > 0
    assert exposed(bo) < 0.5 * exposed(bp)
    assert over.step_time_s < plain.step_time_s


def test_interleaved_bubble_shrinks_by_v(tmp_path):
    """Interleaved 1F1B with v chunks: bubble (p-1)/v of a micro-batch's work, i.e.
    a fraction (p-1)/(v*m + p-1) of the pipeline part of the step."""
    p, m, v = 4, 8, 2
    bubble, _ = measured_bubble(tmp_path, "interleaved", p, m, v)
    assert bubble == pytest.approx((p - 1) / (v * m + p - 1), rel=0.02)
