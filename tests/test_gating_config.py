"""routing_from_dict validation, counts files, skew generators and balance stats."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.gating import (
    RoutingConfig,
    expert_shares,
    layer_stats,
    lb_loss,
    make_placement,
    route_microbatch,
    routing_from_dict,
)


def test_defaults():
    cfg = routing_from_dict({}, "s.yaml")
    assert cfg == RoutingConfig()
    assert cfg.kind == "uniform" and cfg.capacity_factor is None and cfg.top_k is None


def test_full_config():
    cfg = routing_from_dict({
        "kind": "hot", "hot_experts": [3, 5], "hot_fraction": 0.4, "drift": "layer",
        "top_k": 2, "capacity_factor": 1.25, "drop_policy": "position", "max_nodes": 4,
        "jitter": 0.1, "replicate": {"expert": 3, "ranks": [5]}, "replica_split": "nearest",
    }, "s.yaml")
    assert cfg.hot_experts == (3, 5) and cfg.capacity_factor == 1.25
    assert cfg.replicate[0].expert == 3 and cfg.replicate[0].ranks == (5,)


@pytest.mark.parametrize("d,field", [
    ({"kind": "pareto"}, "routing.kind"),
    ({"knd": "zipf"}, "routing.knd"),
    ({"zipf_s": "big"}, "routing.zipf_s"),
    ({"zipf_s": -1}, "routing.zipf_s"),
    ({"hot_fraction": 1.5}, "routing.hot_fraction"),
    ({"hot_experts": []}, "routing.hot_experts"),
    ({"hot_experts": [1, 1]}, "routing.hot_experts"),
    ({"hot_experts": 0}, "routing.hot_experts"),
    ({"alpha": 0}, "routing.alpha"),
    ({"top_k": 0}, "routing.top_k"),
    ({"top_k": 2.5}, "routing.top_k"),
    ({"capacity_factor": 0}, "routing.capacity_factor"),
    ({"capacity_factor": True}, "routing.capacity_factor"),
    ({"drop_policy": "random"}, "routing.drop_policy"),
    ({"max_nodes": 0}, "routing.max_nodes"),
    ({"drift": "sideways"}, "routing.drift"),
    ({"replicate": {"expert": 1}}, "routing.replicate"),
    ({"replicate": {"expert": 1, "ranks": []}}, "routing.replicate.ranks"),
    ({"kind": "file"}, "routing.file"),
    ({"file": "x.json"}, "routing.file"),
    ({"path": "fast"}, "routing.path"),
])
def test_bad_values_name_the_field(d, field):
    with pytest.raises(InputError) as ei:
        routing_from_dict(d, "scen.yaml")
    err = ei.value
    assert err.field == field and err.source == "scen.yaml"
    line = str(err)
    assert "\n" not in line and line.startswith(f"scen.yaml: {field}: expected ")


def test_not_a_mapping():
    with pytest.raises(InputError) as ei:
        routing_from_dict(["uniform"], "scen.yaml")
    assert ei.value.field == "routing"


@pytest.mark.parametrize("fmt", ["json", "csv", "npy"])
def test_counts_file_formats(tmp_path, fmt):
    counts = np.array([[10, 30, 40, 20], [1, 1, 1, 1]], dtype=float)
    f = tmp_path / f"counts.{fmt}"
    if fmt == "json":
        f.write_text(json.dumps({"counts": counts.tolist()}))
    elif fmt == "csv":
        f.write_text("\n".join(",".join(str(int(x)) for x in row) for row in counts))
    else:
        np.save(f, counts)
    scen = tmp_path / "scen.yaml"
    cfg = routing_from_dict({"kind": "file", "file": f.name}, str(scen))  # relative to scen
    q0 = expert_shares(cfg, 4, seed=0, step=0, layer=0)
    np.testing.assert_allclose(q0, [0.1, 0.3, 0.4, 0.2])
    np.testing.assert_allclose(expert_shares(cfg, 4, seed=0, step=0, layer=1), 0.25)
    with pytest.raises(InputError) as ei:  # no row for layer 2
        expert_shares(cfg, 4, seed=0, step=0, layer=2)
    assert ei.value.field == "routing.file"
    with pytest.raises(InputError):  # wrong number of experts
        expert_shares(cfg, 8, seed=0, step=0, layer=0)


@pytest.mark.parametrize("text", ["[[1, 2], [3]]", "not json", "[[1, -2]]", "[[0, 0]]"])
def test_corrupt_counts_file(tmp_path, text):
    f = tmp_path / "c.json"
    f.write_text(text)
    with pytest.raises(InputError) as ei:
        routing_from_dict({"kind": "file", "file": str(f)}, "scen.yaml")
    assert ei.value.field == "routing.file"


def test_missing_counts_file(tmp_path):
    with pytest.raises(InputError) as ei:
        routing_from_dict({"kind": "file", "file": "nope.csv"}, str(tmp_path / "s.yaml"))
    assert ei.value.field == "routing.file" and "existing" in ei.value.expected


def test_zipf_shares_by_hand():
    # s = 1, 4 experts: 1 : 1/2 : 1/3 : 1/4 = 12 : 6 : 4 : 3 (sum 25)
    cfg = routing_from_dict({"kind": "zipf", "zipf_s": 1.0}, "s")
    np.testing.assert_allclose(expert_shares(cfg, 4, seed=0, step=0, layer=0),
                               np.array([12, 6, 4, 3]) / 25)


def test_hot_shares_by_hand():
    # 2 hot of 10 with 40 %: 0.2 each; the other 8 share 60 %: 0.075 each
    cfg = routing_from_dict({"kind": "hot", "hot_experts": 2, "hot_fraction": 0.4}, "s")
    q = expert_shares(cfg, 10, seed=0, step=0, layer=0)
    np.testing.assert_allclose(q, [0.2, 0.2] + [0.075] * 8)


def test_drift_relabels_experts():
    base = routing_from_dict({"kind": "zipf"}, "s")
    layer = routing_from_dict({"kind": "zipf", "drift": "layer"}, "s")
    step = routing_from_dict({"kind": "zipf", "drift": "step"}, "s")
    walk = routing_from_dict({"kind": "zipf", "drift": "walk", "drift_rate": 0.2}, "s")
    q = {name: [expert_shares(c, 16, seed=1, step=s, layer=lyr) for s in (0, 5) for lyr in (0, 1)]
         for name, c in (("base", base), ("layer", layer), ("step", step), ("walk", walk))}
    assert all(np.array_equal(x, q["base"][0]) for x in q["base"])
    # relabelling keeps the multiset of shares
    for x in q["layer"] + q["step"]:
        np.testing.assert_allclose(np.sort(x), np.sort(q["base"][0]))
    assert np.array_equal(q["layer"][0], q["layer"][2])      # same layer, other step
    assert not np.array_equal(q["layer"][0], q["layer"][1])  # other layer
    assert not np.array_equal(q["step"][0], q["step"][2])    # other step
    assert np.array_equal(q["walk"][0], q["layer"][0])       # step 0: no walk yet
    assert not np.allclose(q["walk"][2], q["layer"][0])
    for x in q["walk"]:
        np.testing.assert_allclose(x.sum(), 1.0)


def test_dirichlet_deterministic_per_layer():
    cfg = routing_from_dict({"kind": "dirichlet", "alpha": 0.5}, "s")
    a = expert_shares(cfg, 32, seed=3, step=0, layer=4)
    b = expert_shares(cfg, 32, seed=3, step=9, layer=4)
    c = expert_shares(cfg, 32, seed=3, step=0, layer=5)
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()
    np.testing.assert_allclose(a.sum(), 1.0)


def test_lb_loss_by_hand():
    assert lb_loss(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == pytest.approx(1.0)
    assert lb_loss(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == pytest.approx(2.0)
    assert lb_loss(np.full(4, 0.25), np.array([0.7, 0.1, 0.1, 0.1])) == pytest.approx(1.0)


def test_layer_stats_adds_microbatches():
    cfg = routing_from_dict({"kind": "hot", "hot_experts": [0], "hot_fraction": 0.4,
                             "capacity_factor": 1.0}, "s")
    pl = make_placement(8, 4)
    rs = [route_microbatch(cfg, n_experts=8, top_k=2, tokens_per_rank=np.full(4, 100),
                           placement=pl, ranks_per_node=None, hidden=16, dispatch_dtype="bf16",
                           combine_dtype="bf16", seed=0, step=0, layer=0, microbatch=m)
          for m in range(3)]
    st = layer_stats(rs)
    assert np.array_equal(st.assigned, sum(r.assign.sum(axis=0) for r in rs))
    assert st.assigned.sum() == 3 * 4 * 100 * 2
    assert np.array_equal(st.dropped, st.assigned - st.kept)
    # expert 0: capacity ceil(100·2/8) = 25 per rank per micro-batch → 3·4·25 = 300 kept
    assert st.kept[0] == 300
    assert st.max_over_mean == pytest.approx(st.kept.max() / st.kept.mean())
    np.testing.assert_allclose(st.p, [0.4] + [0.6 / 7] * 7)
    assert st.lb_loss == pytest.approx(8 * float(np.dot(st.f, st.p)))
