"""Scenario loading: YAML -> frozen dataclasses, --set overrides, one-line errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from moesim.errors import InputError
from moesim.scenario import SCENARIO_DIR, apply_overrides, load_scenario, scenario_layout
from moesim.wiring import resolve


def read_and_resolve(path, overrides=()):
    """The scenario read (moesim.scenario) and checked against its cluster
    (moesim.wiring.resolve), as every command does before any work."""
    return resolve(load_scenario(path, list(overrides))).scenario


SHIPPED = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))

# 2 nodes x 8 GPUs = 16 ranks; explicit dp so the test does not need the topology module
BASE = """\
name: t
seed: 7
cluster: {topology: dgx-h100, nodes: 2, device: H100, network: flow}
model: {preset: mixtral-8x7b}
routing: {kind: zipf, zipf_s: 0.5, dispatch_dtype: fp8, combine_dtype: bf16}
parallel: {tp: 1, pp: 2, dp: 8, ep: 8, zero: 1}
schedule: {kind: 1f1b, microbatches: 4, micro_batch_size: 1, seq_len: 256}
compute: {kind: roofline}
overlap: {ep_comm_overlap: true}
memory: {recompute: selective}
"""


@pytest.fixture
def base(tmp_path: Path) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(BASE)
    return p


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


def test_shipped_scenarios_exist():
    assert {"toy-cpu", "hot-expert", "mixtral-8x7b-ep8", "mixtral-8x7b-64gpu",
            "deepseek-v3-2048"} <= set(SHIPPED)


def test_load_base(base):
    s = read_and_resolve(base)
    assert s.name == "t" and s.seed == 7
    assert s.parallel.dp == 8 and s.parallel.ep == 8 and s.parallel.order == ("tp", "ep", "dp", "pp")
    assert s.routing.dispatch_dtype == "fp8" and dict(s.routing.policy) == {"kind": "zipf",
                                                                             "zipf_s": 0.5}
    assert s.schedule.dp_bucket_bytes == 25e6 and s.schedule.tokens_per_microbatch == 256
    assert s.overlap.ep_comm_overlap is True and s.overlap.dp_overlap is True
    assert s.world == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.parallel.tp = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.model.preset = "toy"  # type: ignore[misc]
    layout, warns = scenario_layout(s)
    assert layout.edp == 1 and layout.pp_groups[0] == (0, 8) and warns == []


def test_to_dict_round_trips(base, tmp_path):
    s = read_and_resolve(base)
    d = s.to_dict()
    json.dumps(d)  # JSON-able
    assert d["routing"] == {"kind": "zipf", "zipf_s": 0.5, "dispatch_dtype": "fp8",
                            "combine_dtype": "bf16", "a2a_algo": "direct"}
    assert d["parallel"]["order"] == ["tp", "ep", "dp", "pp"]
    again = tmp_path / "again.yaml"
    d = {k: v for k, v in d.items() if k not in ("source", "world", "gpus_per_node")}
    again.write_text(yaml.safe_dump(d))
    s2 = read_and_resolve(again)
    assert dataclasses.replace(s2, source=s.source) == s


def test_set_changes_exactly_one_field(base):
    before = read_and_resolve(base).to_dict()
    after = read_and_resolve(base, ["schedule.microbatches=6"]).to_dict()
    assert after["schedule"]["microbatches"] == 6
    after["schedule"]["microbatches"] = before["schedule"]["microbatches"]
    assert after == before
    # values are YAML: bools, lists, strings; nested free-form sections accept new keys
    s = read_and_resolve(base, ["overlap.dp_overlap=false", "parallel.order=[tp, dp, ep, pp]",
                             "routing.zipf_s=1.5", "model.layers=8", "name=what-if"])
    assert s.overlap.dp_overlap is False and s.parallel.order == ("tp", "dp", "ep", "pp")
    assert s.routing.policy["zipf_s"] == 1.5 and dict(s.model.dims)["layers"] == 8 and s.name == "what-if"


@pytest.mark.parametrize("item, field, hint", [
    ("parallel.ep_size=4", "parallel.ep_size", "'tp', 'pp', 'dp', 'ep'"),
    ("schedul.kind=gpipe", "schedul.kind", "cluster"),
    ("schedule=3", "schedule", "a mapping of key: value"),
    ("microbatches", "microbatches", "key=value"),
])
def test_set_rejects_unknown_keys(base, item, field, hint):
    with pytest.raises(InputError) as err:
        read_and_resolve(base, [item])
    # issue 12: the command line is to blame, not the scenario file
    assert err.value.source == "command line" and err.value.field == f"--set {field}"
    assert hint in err.value.expected


def test_set_value_is_still_validated(base):
    with pytest.raises(InputError) as err:
        read_and_resolve(base, ["schedule.kind=zigzag"])
    assert err.value.source == "command line"
    assert err.value.field == "--set schedule.kind" and "interleaved" in err.value.expected


def test_apply_overrides_does_not_touch_input():
    data = {"parallel": {"tp": 1}}
    out = apply_overrides(data, ["parallel.tp=2", "cluster.params.nic_GBps=25"])
    assert data == {"parallel": {"tp": 1}}
    assert out == {"parallel": {"tp": 2}, "cluster": {"params": {"nic_GBps": 25}}}


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = _write(tmp_path, "name: x\nparallel:\n  tp: 1\n   pp: [2\n")
    with pytest.raises(InputError) as err:
        read_and_resolve(p)
    assert err.value.source == str(p) and err.value.field.startswith("line 4")


@pytest.mark.parametrize("edit, field", [
    ("parallel: {tp: 1, pp: 2, dp: 8, ep: 8, zero: 4}", "parallel.zero"),
    ("parallel: {tp: 1, pp: 2, dp: 8, ep: 8, expert: 2}", "parallel.expert"),
    ("parallel: {tp: one, pp: 2, dp: 8, ep: 8}", "parallel.tp"),
    ("parallel: {tp: 1, pp: 2, dp: 8, ep: 3}", "parallel.ep"),           # 3 does not divide dp
    ("parallel: {tp: 1, pp: 2, dp: 8, ep: 8, vpp: 2}", "parallel.vpp"),  # vpp needs interleaved
    ("overlap: {ep_comm_overlap: yes please}", "overlap.ep_comm_overlap"),
    ("schedule: {kind: interleaved, microbatches: 3}", "schedule.microbatches"),
    ("schedule: {kind: 1f1b, seq_len: 0}", "schedule.seq_len"),
    ("routing: {kind: uniform, dispatch_dtype: int4}", "routing.dispatch_dtype"),
    ("memory: {recompute: some}", "memory.recompute"),
    ("cluster: {topology: dgx-h100, nodes: 2, network: packet}", "cluster.network"),
    ("extras: {a: 1}", "extras"),
    ("seed: -1", "seed"),
    ("model: {preset: gpt-5}", "model.preset"),                         # delegated to moesim.model
])
def test_bad_fields_name_the_field(tmp_path, edit, field):
    key = edit.split(":", 1)[0]
    lines = [ln for ln in BASE.splitlines() if not ln.startswith(key + ":")]
    p = _write(tmp_path, "\n".join(lines + [edit]) + "\n")
    with pytest.raises(InputError) as err:
        read_and_resolve(p)
    assert err.value.source == str(p) and err.value.field == field


def test_experts_not_divisible_by_ep(tmp_path):
    # toy model: 8 experts; 16-way EP cannot hold them evenly
    text = BASE.replace("{preset: mixtral-8x7b}", "{preset: toy, n_experts: 12}")
    with pytest.raises(InputError) as err:
        read_and_resolve(_write(tmp_path, text))
    assert err.value.field == "parallel.ep" and "12 routed experts" in err.value.expected


def test_missing_file_lists_shipped():
    with pytest.raises(InputError) as err:
        read_and_resolve("no-such-scenario")
    assert "toy-cpu" in err.value.expected


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_scenario_loads(name):
    s = read_and_resolve(name)
    layout, warns = scenario_layout(s)
    par = s.parallel
    assert layout.world == s.world == par.tp * par.cp * par.pp * par.dp
    assert warns == []  # no shipped scenario puts TP across nodes
    json.dumps(s.to_dict())


def test_deepseek_v3_scenario_matches_the_report():
    s = read_and_resolve("deepseek-v3-2048")
    layout, _ = scenario_layout(s)
    assert (s.world, layout.pp, layout.dp, layout.ep, layout.edp) == (2048, 16, 128, 64, 2)
    assert s.parallel.zero == 1 and s.routing.policy["max_nodes"] == 4
    assert (s.routing.dispatch_dtype, s.routing.combine_dtype) == ("fp8", "bf16")
    # global batch 15360 sequences (DeepSeek-V3 report §4.2) = dp x microbatches x mbs
    assert layout.dp * s.schedule.microbatches * s.schedule.micro_batch_size == 15360
    assert s.schedule.seq_len == 4096
    # as trained: DualPipe with overlapped F&B pairs (§3.2.1), DeepEP on 20 SMs (§3.2.2)
    assert (s.schedule.kind, s.overlap.kind) == ("dualpipe", "static")
    assert (s.parallel.ep_backend.kind, s.parallel.ep_backend.held_sms(0)) == ("deepep", 20)
    assert len({r // 8 for r in layout.ep_groups[0]}) == 8  # EP64 across 8 nodes


def test_layout_must_divide_world(tmp_path):
    # 16 GPUs with tp1 pp3: dp cannot be derived
    p = _write(tmp_path, BASE.replace("{tp: 1, pp: 2, dp: 8, ep: 8, zero: 1}",
                                      "{tp: 1, pp: 3, ep: 1}"))
    with pytest.raises(InputError) as err:
        read_and_resolve(p)
    assert err.value.field == "parallel.pp" and "world size 16" in err.value.expected
    # explicit dp that does not multiply out to the world
    p = _write(tmp_path, BASE.replace("dp: 8", "dp: 4").replace("ep: 8", "ep: 4"))
    with pytest.raises(InputError) as err:
        read_and_resolve(p)
    assert err.value.field == "parallel.dp" and "world size 16" in err.value.expected


def test_unknown_topology_names_the_scenario_field(base):
    with pytest.raises(InputError) as err:
        read_and_resolve(base, ["cluster.topology=dgx-z900"])
    # given by --set: the command line is to blame (issue 12)
    assert err.value.source == "command line" and err.value.field == "--set cluster.topology"
    assert "dgx-h100" in err.value.expected
    p = base.parent / "z.yaml"
    p.write_text(base.read_text().replace("topology: dgx-h100", "topology: dgx-z900"))
    with pytest.raises(InputError) as err:
        read_and_resolve(p)
    assert err.value.source == str(p) and err.value.field == "cluster.topology"


def test_tp_across_nodes_warns(base):
    # pcie-8gpu shrunk to 2 GPUs per node, 2 nodes = 4 GPUs: a tp=4 group spans both nodes
    s = read_and_resolve(base, ["cluster.topology=pcie-8gpu", "cluster.params.gpus_per_node=2",
                             "cluster.params.cpus=1", "cluster.params.pcie_switches_per_cpu=1",
                             "parallel.tp=4", "parallel.pp=1", "parallel.dp=1",
                             "parallel.ep=1", "model.preset=toy", "overlap.ep_comm_overlap=false"])
    assert (s.world, s.gpus_per_node) == (4, 2)
    _, warns = scenario_layout(s)
    assert len(warns) == 1 and "1 of 1 tensor-parallel groups (tp=4)" in warns[0]


@pytest.mark.parametrize("drop, field", [("model:", "model"), ("cluster:", "cluster.topology")])
def test_missing_required_sections(tmp_path, drop, field):
    lines = [ln for ln in BASE.splitlines() if not ln.startswith(drop)]
    with pytest.raises(InputError) as err:
        read_and_resolve(_write(tmp_path, "\n".join(lines) + "\n"))
    assert err.value.field == field and err.value.source.endswith("bad.yaml")


# ---------------------------------------------------------------- issue 20 item 12

@pytest.mark.parametrize("sets, field", [
    (["overlap.ep_comm_overlap=true"], "overlap.ep_comm_overlap"),
    (["overlap.ep_comm_overlap=false", "overlap.kind=static"], "overlap.kind"),
])
def test_static_overlap_with_one_stage_1f1b_is_refused(base, capsys, sets, field):
    """1F1B on one pipeline stage runs F0 B0 F1 B1 ...: no two adjacent schedule items
    belong to different micro-batches, so the static pairing would change nothing.
    Refused in one line pointing at what does overlap there (Megatron-Core's combined
    1F1B, overlap.kind a2a-1f1b) instead of silently simulating no overlap."""
    from moesim.cli import main

    argv = ["memory", str(base), "--set", "parallel.pp=1", "--set", "parallel.dp=16", *[
        x for s in sets for x in ("--set", s)]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"command line: --set {field}" in err or f"{base}: {field}" in err, err
    assert "a2a-1f1b" in err and "one pipeline stage" in err
    # with pipeline stages, or with GPipe, the pairing has items to pair: accepted
    read_and_resolve(base)
    read_and_resolve(base, ["parallel.pp=1", "parallel.dp=16", "schedule.kind=gpipe"])
    # the same with the file's own value: the file is named
    text = BASE.replace("pp: 2, dp: 8", "pp: 1, dp: 16")
    with pytest.raises(InputError, match="overlap.ep_comm_overlap: expected .*a2a-1f1b"):
        read_and_resolve(_write(tmp_path_of(base), text))


def tmp_path_of(p: Path) -> Path:
    return p.parent


# ---------------------------------------------------------------- issue 20 item 13

@pytest.mark.parametrize("scenario, sets, where, words", [
    ("hot-expert", ["routing.hot_fraction=0.9"], "command line: --set routing.hot_fraction",
     ["<= 1/top_k = 0.5", "got 0.9"]),
    # kind=hot alone: the share is hot_fraction's default, which the user never wrote
    ("deepseek-v3-fb-pair", ["routing.kind=hot"], "command line: --set routing.kind",
     ["default routing.hot_fraction 0.5", "top_k=8", "got 'hot'"]),
    ("deepseek-v3-fb-pair", ["routing.kind=hot", "routing.hot_token_fraction=1.5",
                             "routing.hot_experts=1"],
     "command line: --set routing.hot_token_fraction", ["got 1.5"]),
    ("hot-expert", ["routing.hot_experts=[3, 9]"], "command line: --set routing.hot_experts",
     ["expert ids < 8"]),
    ("hot-expert", ["parallel.cp=3"], "command line: --set parallel.cp",
     ["divide the world size 8", "got 3"]),
    ("hot-expert", ["parallel.tp=2", "parallel.pp=3"], "command line: --set parallel.pp",
     ["divide the world size 8", "got 3"]),
])
def test_set_values_are_blamed_on_the_command_line(monkeypatch, capsys, scenario, sets,
                                                   where, words):
    """Every error about a value given with --set names the command line and that
    field, before any simulation (the memory table and the run alike)."""
    from moesim.cli import main

    argv = [x for s in sets for x in ("--set", s)]
    for cmd in (["memory", scenario], ["run", scenario, "--no-files", "--quiet"]):
        assert main([*cmd, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert f"error: {where}:" in err, err
        for w in words:
            assert w in err, (w, err)


def test_the_files_own_values_are_blamed_on_the_file(tmp_path):
    text = BASE.replace("routing: {kind: zipf, zipf_s: 0.5,",
                        "routing: {kind: hot, hot_fraction: 0.9,")
    with pytest.raises(InputError) as e:
        read_and_resolve(_write(tmp_path, text))
    assert (e.value.source, e.value.field) == (str(tmp_path / "bad.yaml"),
                                               "routing.hot_fraction")
    text = BASE.replace("pp: 2, dp: 8, ep: 8", "pp: 1, cp: 3, ep: 8").replace(
        "overlap: {ep_comm_overlap: true}", "")
    with pytest.raises(InputError) as e:
        read_and_resolve(_write(tmp_path, text))
    assert e.value.field == "parallel.cp" and e.value.got == 3
