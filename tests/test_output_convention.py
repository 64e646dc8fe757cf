"""One output convention for every command that simulates (issue 36, items 5 and 10):
``run``, ``serve`` one step, ``serve`` under load, ``rl`` and ``sweep`` each write their
folder (``-o``, else out/<name>[--<overrides>], out/sweeps/<name> for a sweep) with
summary.md and summary.json, mark its files as the command's own, rerun into it, refuse
another command's or scenario's folder without --force, and a run started while another
writes the folder fails in one line (exit 2) naming the other, losing nothing.

Small settings throughout: a toy RL scenario, one-layer serving step, 60 requests on a
tiny step-cost grid cached in a temporary folder, a one-point sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moesim.cli import main
from moesim.outputs import LOCK_NAME, MARKER, default_run_dir

ROOT = Path(__file__).resolve().parents[1]

RL = {"steps": 2, "prompts_per_step": 4, "samples_per_prompt": 4,
      "prompt_tokens": {"dist": "fixed", "mean": 64},
      "response_tokens": {"dist": "fixed", "mean": 128}, "colocated": False,
      "rollout": {"gpus": 8, "tp": 1, "ep": 1},
      "train": {"gpus": 8, "tp": 1, "ep": 8, "mini_batches": 2, "seq_len": 512},
      "reward": {"kind": "rule", "cpu_s_per_sample": 0.001, "workers": 32},
      "max_lag": 0, "weight_sync": {"method": "nccl"}}
RL_SCENARIO = {"name": "rl-toy", "seed": 5,
               "cluster": {"topology": "dgx-h100", "nodes": 2, "device": "H100"},
               "model": {"preset": "toy"}, "routing": {"kind": "uniform"},
               "compute": {"kind": "roofline"}, "engine": {"mode": "fast"},
               "schedule": {"seq_len": 512}, "rl": RL}
SWEEP = """\
name: one-point
scenario: hot-expert
set: [model.layers=1, schedule.microbatches=1]
axes:
  routing.hot_fraction: [0.25]
seeds: [1]
"""
SERVE_ONE = ["--set", "model.layers=1"]
SERVE_LOAD = ["--set", "load.arrival.rate_rps=20", "--set", "load.requests=60",
              "--set", "load.prompt_tokens={dist: uniform, min: 100, max: 900}",
              "--set", "load.output_tokens={dist: fixed, mean: 20}",
              "--set", "load.surface.batches=[1,8]", "--set", "load.surface.contexts=[128,2048]",
              "--set", "load.surface.prompts=[1,2]",
              "--set", "load.surface.prompt_lens=[128,1024]"]

# name -> (argv without output flags, the default folder relative to the working folder)
CASES = {
    "run": (["run", "toy-cpu"], Path("out/toy-cpu")),
    "serve": (["serve", "mixtral-8x7b-serve", *SERVE_ONE],
              default_run_dir("mixtral-8x7b-serve", SERVE_ONE[1::2])),
    "serve-load": (["serve", "mixtral-8x7b-serve", *SERVE_LOAD],
                   default_run_dir("mixtral-8x7b-serve", SERVE_LOAD[1::2])),
    "rl": (["rl", "rl.yaml"], Path("out/rl-toy")),
    "sweep": (["sweep", "one-point.yaml", "--threads", "--workers", "1"],
              Path("out/sweeps/one-point")),
}
# parts whose owner had not landed the convention when this test was written
PENDING: dict[str, str] = {}   # command -> why its part of the convention is pending

HOLD = """
import sys
from moesim.outputs import claim
with claim(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _case(name: str, key: str | None = None):
    key = key or name
    marks = [pytest.mark.xfail(strict=False, reason=PENDING[key])] if key in PENDING else []
    return pytest.param(name, id=name, marks=marks)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working folder holding the scenario and sweep files; the step-cost surface
    cache in it too."""
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(RL_SCENARIO))
    (tmp_path / "one-point.yaml").write_text(SWEEP)
    monkeypatch.setenv("MOESIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != LOCK_NAME}


def _one_error_line(capsys, command: str) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"moesim {command}: error: ") and "Traceback" not in err[0]
    return err[0]


class Holder:
    """Another process holding a folder's claim, as a concurrent run does."""

    def __init__(self, folder: Path) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=ROOT)
        assert self.p.stdout.readline().strip() == "held"

    def __enter__(self) -> int:
        return self.p.pid

    def __exit__(self, *exc: object) -> None:
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        self.p.wait(timeout=60)


@pytest.mark.parametrize("name", [_case(n) for n in CASES])
def test_every_command_follows_the_output_convention(name, work, capsys):
    argv, default = CASES[name]
    command = argv[0]
    # 1. no -o: the default folder, with summary.md and summary.json; every file in it
    #    listed as the command's own
    assert main([*argv, "--quiet"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    folder = work / default
    assert (folder / "summary.md").is_file() and (folder / "summary.json").is_file()
    rec = json.loads((folder / "summary.json").read_text())[MARKER]
    assert rec["command"] == command and "complete" not in rec
    assert sorted(rec["files"]) == sorted(_files(folder)), "every file is the run's own"
    assert (folder / "summary.md").read_text().strip()
    before = _files(folder)

    # 2. a second run while another process writes there: one line, exit 2, nothing lost
    with Holder(folder) as pid:
        assert main([*argv, "--quiet"]) == 2
        line = _one_error_line(capsys, command)
        assert f"being written by another moesim run (pid {pid} on " in line, line
        assert str(default) in line
    assert _files(folder) == before

    # 3. another command's run into this folder: refused without --force, nothing lost
    other = ["run", "toy-cpu", "--set", "seed=7"]
    assert main([*other, "--quiet", "-o", str(default)]) == 2
    assert str(default) in _one_error_line(capsys, "run")
    assert _files(folder) == before

    # 4. the same run again into its own folder: accepted, the files replaced; --json
    #    puts the summary, and nothing else, on stdout
    assert main([*argv, "--json", "-o", str(default)]) == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    assert isinstance(printed, dict) and printed
    again = _files(folder)
    assert sorted(again) == sorted(before)
    assert json.loads(again["summary.json"])[MARKER]["command"] == command


@pytest.mark.parametrize("name", [_case(n, f"{n} -o another's") for n in CASES if n != "run"])
def test_no_command_writes_over_another_commands_folder(name, work, capsys):
    """A `run` folder given as -o to every other command: one line, exit 2, before the
    long work, the run's files as they were."""
    assert main(["run", "toy-cpu", "--quiet", "-o", "shared"]) == 0
    capsys.readouterr()
    before = _files(work / "shared")
    argv, _ = CASES[name]
    assert main([*argv, "--quiet", "-o", "shared"]) == 2
    assert "shared" in _one_error_line(capsys, argv[0])
    assert _files(work / "shared") == before


@pytest.mark.parametrize("name", [_case(n, f"{n} --no-files") for n in ("run", "sweep")])
def test_no_files_writes_nothing(name, work, capsys):
    argv, _ = CASES[name]
    assert main([*argv, "--quiet", "--no-files"]) == 0
    assert not (work / "out").exists()
    assert main([*argv, "--quiet", "--no-files", "-o", "x"]) == 2
    assert "--no-files" in _one_error_line(capsys, argv[0])


def test_two_runs_started_together_into_one_folder(tmp_path):
    """Two processes at once into one folder: each ends with exit 0, or with exit 2 and
    one line saying the other is writing there; the folder ends complete, its files
    all listed, none lost."""
    cmd = [sys.executable, "-m", "moesim", "run", "toy-cpu", "--quiet", "-o", "both"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert 0 in [rc for rc, _, _ in results]
    for rc, out, err in results:
        if rc != 0:
            assert rc == 2 and out == ""
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "being written by another moesim run (pid " in lines[0]
    folder = tmp_path / "both"
    rec = json.loads((folder / "summary.json").read_text())[MARKER]
    assert sorted(rec["files"]) == sorted(p.name for p in folder.iterdir())
