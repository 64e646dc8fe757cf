"""Issue 12, items 8, 10-14 and 16: bad input that used to get a traceback or pass
silently. Every refusal is one line naming the file (or "command line"), the field
and what was expected, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import simpy
import yaml

from moesim.cli import main
from moesim.errors import InputError
from moesim.scenario import load_scenario
from moesim.yamlio import load_text
from tests._util import refused

REPO = Path(__file__).resolve().parents[1]
EXPLICIT = str(REPO / "topologies" / "example-explicit.yaml")


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """Run in an empty folder, so "nothing written" can be checked."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def written(folder: Path, inputs=()) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in inputs)


def scenario(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


TOY = (REPO / "scenarios" / "toy-cpu.yaml").read_text()


# ---------------------------------------------------------------- item 8

def test_input_error_raised_in_a_simpy_process_keeps_its_message():
    """simpy re-raises a process's exception as ``type(e)(*e.args)``."""
    env = simpy.Environment()

    def proc():
        yield env.timeout(1.0)
        raise InputError("f.yaml", "x.y", "a number > 0", -1)

    env.process(proc())
    with pytest.raises(InputError) as err:
        env.run()
    assert str(err.value) == "f.yaml: x.y: expected a number > 0, got -1"
    again = InputError(*InputError("src", "field", "something").args)
    assert str(again) == "src: field: expected something"


def test_collective_root_out_of_range_is_one_line(capsys, cwd):
    refused(capsys, ["collective", "--topology", "dgx-h100", "--op", "broadcast",
                     "--bytes", "1MB", "--root", "99"], "command line", "--root", "0..7", "99")


# ---------------------------------------------------------------- item 10

EXPLICIT_BAD = [".nan", ".inf", "1e300", "-25"]


@pytest.mark.parametrize("bw", EXPLICIT_BAD)
def test_explicit_topology_bandwidth_must_be_finite_and_bounded(capsys, cwd, bw):
    text = Path(EXPLICIT).read_text().replace(
        "{src: h0.gpu0, dst: h0.pcie, kind: pcie, bandwidth_GBps: 31.5",
        f"{{src: h0.gpu0, dst: h0.pcie, kind: pcie, bandwidth_GBps: {bw}")
    p = scenario(cwd, text, "t.yaml")
    refused(capsys, ["topology", str(p)], str(p), "links[0].bandwidth_GBps", "expected")
    assert written(cwd, ["t.yaml"]) == []


@pytest.mark.parametrize("key, value", [("nic_GBps", -25), ("nic_GBps", ".nan"),
                                        ("pcie_latency_us", ".inf"), ("nvlink_GBps", "1e300"),
                                        ("oversubscription", ".nan")])
def test_every_given_preset_parameter_is_checked(capsys, cwd, key, value):
    """One node uses no NIC, yet a bad nic_GBps is refused (it was ignored)."""
    data = load_text((REPO / "topologies" / "dgx-h100.yaml").read_text())
    data["params"][key] = load_text(str(value))
    p = scenario(cwd, yaml.safe_dump(data), "t.yaml")
    refused(capsys, ["topology", str(p), "--nodes", "1"], str(p), f"params.{key}")


@pytest.mark.parametrize("argv, names", [
    (["run", "toy-cpu", "--set", "schedule.dp_bucket_MB=.nan"],
     ["command line", "--set schedule.dp_bucket_MB", "finite"]),
    (["run", "toy-cpu", "--set", "cluster.params.nic_GBps=.nan"],
     ["command line", "cluster.params.nic_GBps", "finite"]),
    (["run", "toy-cpu", "--set", "routing.zipf_s=.inf"], ["command line", "routing.zipf_s"]),
    (["topology", "dgx-h100", "--set", "nic_GBps=.nan"], ["command line", "--set nic_GBps"]),
    (["topology", "dgx-h100", "--set", "nic_GBps=-25"], ["command line", "--set nic_GBps"]),
    (["collective", "--topology", "dgx-h100", "--op", "all_reduce", "--bytes", "nan"],
     ["command line", "--bytes", "finite size"]),
    (["collective", "--topology", "dgx-h100", "--op", "all_reduce", "--bytes", "inf"],
     ["command line", "--bytes"]),
    (["record", "rec", "--zipf-s", "nan"], ["command line", "--zipf-s", "finite"]),
])
def test_non_finite_numbers_on_the_command_line(capsys, cwd, argv, names):
    refused(capsys, argv, *names)
    assert written(cwd) == []


def test_non_finite_in_scenario_file(capsys, cwd):
    p = scenario(cwd, TOY.replace("  seq_len: 128", "  seq_len: 128\n  dp_bucket_MB: .nan"))
    refused(capsys, ["run", str(p), "-o", "out"], str(p), "schedule.dp_bucket_MB", "finite")
    assert written(cwd, ["s.yaml"]) == []


def test_non_finite_in_matrix_file(capsys, cwd):
    (cwd / "m.json").write_text(json.dumps([[0, float("nan")], [1, 0]]))
    refused(capsys, ["collective", "--topology", "pcie-8gpu", "--op", "all_to_all", "--ranks",
                     "0-1", "--matrix", "m.json"], "m.json", "matrix[0][1]", "finite")


# ---------------------------------------------------------------- item 11

@pytest.mark.parametrize("argv, names", [
    (["run", "toy-cpu", "-o", "out", "--set", "schedule.microbatches=1000000000000"],
     ["--set schedule.microbatches", "at most 65,536"]),
    (["run", "toy-cpu", "-o", "out", "--set", "schedule.seq_len=1000000000000"],
     ["--set schedule.seq_len", "at most 1,048,576"]),
    (["run", "toy-cpu", "-o", "out", "--set", "schedule.seq_len=1048576",
      "--set", "schedule.micro_batch_size=8"], ["schedule.seq_len", "tokens per micro-batch"]),
    (["run", "toy-cpu", "-o", "out", "--set", "model.layers=100000"],
     ["--set model.layers", "at most 1,024"]),
    (["run", "deepseek-v3-2048", "-o", "out", "--set", "cluster.nodes=100000"],
     ["cluster.nodes", "at most"]),
    (["run", "deepseek-v3-2048", "-o", "out", "--set", "cluster.nodes=32768"],
     ["cluster.nodes", "at most 131072 GPUs", "262144"]),
    (["run", "deepseek-v3-2048", "-o", "out", "--set", "engine.mode=exact"],
     ["schedule.microbatches", "524,288 on the exact engine", "2048 x 61 x 120"]),
    (["topology", "dgx-h100", "--nodes", "100000"], ["command line", "--nodes", "131072 GPUs"]),
    (["collective", "--topology", "dgx-h100", "--op", "all_reduce", "--bytes", "1e30"],
     ["command line", "--bytes", "at most 1 TiB"]),
    (["memory", "toy-cpu", "--set", "schedule.microbatches=1000000000000"],
     ["--set schedule.microbatches", "at most"]),
])
def test_sizes_beyond_the_machine_are_refused_before_building(capsys, cwd, argv, names):
    refused(capsys, argv, *names)
    assert written(cwd) == []


# ---------------------------------------------------------------- item 12

def test_scientific_notation_reads_as_numbers():
    assert load_text("a: 2.5e1\nb: 1e3\nc: 1E-6\nd: -2e+2\ne: .5e1\nf: 1.5\ng: '1e3'") == {
        "a": 25.0, "b": 1000.0, "c": 1e-6, "d": -200.0, "e": 5.0, "f": 1.5, "g": "1e3"}


def test_scientific_notation_in_a_scenario_and_in_set(cwd):
    p = scenario(cwd, TOY.replace("  seq_len: 128", "  seq_len: 128\n  dp_bucket_MB: 2.5e1"))
    assert load_scenario(p).schedule.dp_bucket_MB == 25.0
    s = load_scenario(p, ["schedule.dp_bucket_MB=1e2"])
    assert s.schedule.dp_bucket_MB == 100.0


def test_duplicate_key_is_refused_with_its_lines(capsys, cwd):
    p = scenario(cwd, TOY.replace("seed: 0", "seed: 0\nseed: 3"))
    first = TOY.splitlines().index("seed: 0") + 1
    refused(capsys, ["run", str(p), "-o", "out"], str(p), f"line {first + 1}:",
            "duplicate key 'seed'", f"first at line {first})")
    assert written(cwd, ["s.yaml"]) == []


def test_duplicate_key_in_a_nested_topology_mapping(capsys, cwd):
    text = (REPO / "topologies" / "dgx-h100.yaml").read_text()
    p = scenario(cwd, text.replace("params:", "params:\n  nodes: 1\n  nodes: 2", 1), "t.yaml")
    refused(capsys, ["topology", str(p)], str(p), "duplicate key 'nodes'")


# ---------------------------------------------------------------- item 13

def _calib(**edits) -> dict:
    doc = json.loads((REPO / "traces" / "calib-uniform-cpu.json").read_text())
    for key, value in edits.items():
        sec, _, field = key.partition("__")
        if field:
            doc[sec][field] = value
        else:
            doc[sec] = value
    return doc


@pytest.mark.parametrize("edits, field", [({"device": "tpu"}, "device"),
                                          ({"comm__backend": "mpi"}, "comm.backend"),
                                          ({"memory__bytes_per_s_by_ops": {}},
                                           "memory.bytes_per_s_by_ops")])
def test_unknown_names_in_a_calibration_are_refused(capsys, cwd, edits, field):
    (cwd / "c.json").write_text(json.dumps(_calib(**edits)))
    refused(capsys, ["validate", str(REPO / "traces" / "uniform"), "--calibration", "c.json",
                     "-o", "v"], "c.json", field)
    assert written(cwd, ["c.json"]) == []


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("toyrun") / "run"
    assert main(["run", "toy-cpu", "-o", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("flag, value", [("--layers", "50"), ("--layers", "2-50"),
                                         ("--ranks", "2"), ("--ranks", "0-9")])
def test_plot_outside_the_run_is_refused(capsys, toy_run, flag, value):
    capsys.readouterr()
    before = sorted(os.listdir(toy_run))
    refused(capsys, ["plot", str(toy_run), flag, value], "command line", flag, "below 2")
    assert sorted(os.listdir(toy_run)) == before


# ---------------------------------------------------------------- item 14

def test_scenario_path_that_is_a_folder(capsys, cwd):
    (cwd / "d").mkdir()
    refused(capsys, ["run", "d", "-o", "out"], "d:", "a directory", absent=["no such file"])


def test_bad_tp_is_blamed_on_tp(capsys, cwd):
    p = scenario(cwd, TOY.replace("{tp: 1, pp: 1, ep: 2}", "{tp: 3, pp: 1, ep: 1}"))
    refused(capsys, ["memory", str(p)], str(p), "parallel.tp", absent=["parallel.pp"])


def test_set_errors_name_the_command_line(capsys, cwd):
    line = refused(capsys, ["run", "toy-cpu", "--set", "parallel.tp=0"],
                   "command line: --set parallel.tp", absent=["toy-cpu.yaml"])
    assert "integer >= 1" in line
    refused(capsys, ["memory", "hot-expert", "--set", "routing.hot_fraction=2"],
            "command line: --set routing.hot_fraction", absent=["hot-expert.yaml"])


@pytest.mark.parametrize("value", ["1XB", "-1GiB", "-5"])
def test_bytes_errors_say_got_once_and_take_negative_values(capsys, cwd, value):
    line = refused(capsys, ["collective", "--topology", "dgx-h100", "--op", "all_reduce",
                            "--bytes", value], "command line: --bytes", "size >= 0",
                   f"got '{value}'")
    assert line.count("got") == 1


def test_nodes_inherited_from_the_scenario_blame_the_scenario(capsys, cwd):
    line = refused(capsys, ["memory", "hot-expert", "--set", f"cluster.topology={EXPLICIT}",
                            "--set", "parallel.ep=4"],
                   "command line: --set cluster.topology (with ",
                   "hot-expert.yaml's cluster.nodes)", "--set cluster.nodes=null",
                   absent=["example-explicit.yaml: params"])
    assert line
    assert main(["memory", "hot-expert", "--set", f"cluster.topology={EXPLICIT}",
                 "--set", "parallel.ep=4", "--set", "cluster.nodes=null"]) == 0
    assert "4 ranks" in capsys.readouterr().out


def test_argparse_errors_are_one_line(capsys, cwd):
    refused(capsys, ["collective", "--topology", "dgx-h100", "--op", "all_reduce",
                     "--nodes", "1e3"], "command line", "--nodes")


# ---------------------------------------------------------------- item 16

def test_interleaved_needs_vpp_2(capsys, cwd):
    refused(capsys, ["memory", "mixtral-8x7b-64gpu", "--set", "parallel.vpp=1"],
            "command line: --set parallel.vpp", "vpp >= 2")
    p = scenario(cwd, (REPO / "scenarios" / "mixtral-8x7b-64gpu.yaml").read_text()
                 .replace("  vpp: 2", "  vpp: 1"))
    refused(capsys, ["run", str(p), "-o", "out"], str(p), "parallel.vpp", "vpp >= 2")
    assert written(cwd, ["s.yaml"]) == []
