"""A run's folder (moesim.outputs.folder): held by one run at a time, a loser told who
holds it, its files marked as the run's own (files, command, identity), a rerun of the
same run replacing them, another command's or scenario's folder refused without force."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import moesim.outputs.folder as folder_mod
from moesim.errors import InputError
from moesim.outputs import (
    LOCK_NAME,
    MARKER,
    Outputs,
    busy_holder,
    check_run_folder,
    claim,
    identity_key,
    run_manifest,
    set_command,
)

ROOT = Path(__file__).resolve().parents[1]

HOLD = """
import sys
from moesim.outputs import claim
with claim(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


@pytest.fixture(autouse=True)
def _no_command():
    set_command(None)
    yield
    set_command(None)


@pytest.fixture
def held(tmp_path):
    """A folder claimed by another process (its pid); released when the test ends."""
    out = tmp_path / "held"
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().strip() == "held"
    yield out, p.pid
    p.stdin.write("\n")
    p.stdin.flush()
    p.wait(timeout=60)


def _write(out: Path, summary: dict, *, force: bool = False, identity=None) -> dict:
    with claim(out, force=force, identity=identity):
        o = Outputs(out, force=force)
        o.add("data.csv", lambda t: t.write_text("a,b\n1,2\n"))
        o.commit(summary, lambda s: f"# run {s['x']}\n")
    return json.loads((out / "summary.json").read_text())


def test_a_loser_is_told_the_folder_is_being_written_and_by_whom(held):
    out, pid = held
    assert busy_holder(out).startswith(f"pid {pid} on ")
    for attempt in (lambda: check_run_folder(out, False), lambda: check_run_folder(out, True),
                    lambda: claim(out).__enter__()):
        with pytest.raises(InputError) as exc:
            attempt()
        msg = str(exc.value)
        assert f"being written by another moesim run (pid {pid} on " in msg, msg
        assert "did not write" not in msg and "\n" not in msg


def test_the_holder_itself_is_not_busy(tmp_path):
    out = tmp_path / "mine"
    with claim(out):
        assert busy_holder(out) is None
        assert check_run_folder(out, False) == out
    assert busy_holder(out) is None and not out.exists()   # made, left empty: removed


def test_marker_names_files_command_and_identity(tmp_path):
    out = tmp_path / "r"
    set_command("rl")
    doc = _write(out, {"x": 1}, identity={"scenario": "a"})
    rec = doc[MARKER]
    assert rec["files"] == ["data.csv", "summary.json", "summary.md"]
    assert rec["command"] == "rl" and rec["identity"] == identity_key({"scenario": "a"})
    assert "complete" not in rec
    assert sorted(p.name for p in out.iterdir()) == rec["files"]      # no lock left
    # the same run again: replaced in place
    assert _write(out, {"x": 2}, identity={"scenario": "a"})["x"] == 2
    assert (out / "summary.md").read_text() == "# run 2\n"


def test_another_scenario_or_command_is_refused_without_force(tmp_path):
    out = tmp_path / "r"
    set_command("rl")
    _write(out, {"x": 1}, identity={"scenario": "a"})
    with pytest.raises(InputError, match="outputs of another scenario or settings"):
        check_run_folder(out, False, identity={"scenario": "b"})
    with pytest.raises(InputError, match="another scenario"):        # under the claim too
        _write(out, {"x": 9}, identity={"scenario": "b"})
    assert json.loads((out / "summary.json").read_text())["x"] == 1   # nothing lost
    set_command("serve")
    with pytest.raises(InputError, match="the outputs of `moesim rl`"):
        check_run_folder(out, False, identity={"scenario": "a"})
    assert _write(out, {"x": 3}, force=True, identity={"scenario": "b"})["x"] == 3
    assert run_manifest(out)["command"] == "serve"


def test_a_users_file_is_refused_and_kept(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="files moesim did not write: notes.txt"):
        check_run_folder(out, False)
    check_run_folder(out, True)
    _write(out, {"x": 1}, force=True)
    assert (out / "notes.txt").read_text() == "mine"


def test_adopted_files_are_the_runs_own(tmp_path):
    out = tmp_path / "s"
    with claim(out, force=False):
        (out / "points.jsonl").write_text('{"a": 1}\n')     # appended as the run goes
        o = Outputs(out, force=False)
        o.adopt("points.jsonl")
        o.commit({"x": 1})
    assert run_manifest(out)["files"] == ["points.jsonl", "summary.json"]
    check_run_folder(out, False)                              # a rerun may write here


def test_a_first_commit_marks_the_folder_incomplete_before_any_file(tmp_path, monkeypatch):
    """Into a new folder, the commit's first act is an incomplete marker listing the
    files to come, so a crash (or a concurrent reader) mid-commit never sees files
    that look like a user's; a rerun replaces them."""
    out = tmp_path / "n"
    real = folder_mod._put
    seen: list[dict] = []

    def put(tmp, path, may):
        if path.name == "data.csv":
            seen.append(run_manifest(out))
            raise KeyboardInterrupt
        return real(tmp, path, may)

    monkeypatch.setattr(folder_mod, "_put", put)
    with pytest.raises(KeyboardInterrupt):
        _write(out, {"x": 1})
    assert seen[0]["complete"] is False
    assert seen[0]["files"] == ["data.csv", "summary.json", "summary.md"]
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    monkeypatch.setattr(folder_mod, "_put", real)
    check_run_folder(out, False)
    assert _write(out, {"x": 2})["x"] == 2


def test_lock_file_of_a_killed_run_is_taken_over(tmp_path):
    out = tmp_path / "k"
    out.mkdir()
    (out / LOCK_NAME).write_text("pid 1 on a killed host")
    assert busy_holder(out) is None
    assert _write(out, {"x": 1})["x"] == 1


def test_an_interrupted_folder_still_says_whose_it_was(tmp_path, monkeypatch):
    out = tmp_path / "i"
    set_command("rl")
    real = folder_mod._put

    def put(tmp, path, may):
        if path.name == "data.csv":
            raise KeyboardInterrupt
        return real(tmp, path, may)

    monkeypatch.setattr(folder_mod, "_put", put)
    with pytest.raises(KeyboardInterrupt):
        _write(out, {"x": 1}, identity={"scenario": "a"})
    monkeypatch.setattr(folder_mod, "_put", real)
    assert run_manifest(out)["complete"] is False
    set_command("serve")
    with pytest.raises(InputError, match="the outputs of `moesim rl`"):
        check_run_folder(out, False)
    set_command("rl")
    check_run_folder(out, False, identity={"scenario": "a"})
    assert _write(out, {"x": 2}, identity={"scenario": "a"})["x"] == 2
