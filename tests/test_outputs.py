"""Output safety (issue 12, items 2, 5, 6, 7, 9): each distinct run has its own default
folder; moesim's own outputs are recognised by the marker in summary.json, checked when
each file is put in place; files are written atomically with summary.json last;
scenario names cannot leave out/; operating-system errors are one line, exit 2, before
the long work."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from moesim.cli import main
from moesim.errors import InputError
from moesim.trace.report import OUTPUT_FILES, write_run_outputs
from tests.test_trace_fixtures import hot_expert_result

ROOT = Path(__file__).resolve().parent.parent
TOO_LONG = "n" * 300          # longer than any file system's 255-byte name limit
MARKER = "moesim_output"      # the key of summary.json listing moesim's files


def _is_temporary(name: str) -> bool:
    from moesim.outputs import is_temporary

    return is_temporary(name)


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for n in needles:
        assert n in err[0], err[0]
    assert "Traceback" not in err[0]
    return err[0]


def _no_simulation(monkeypatch):
    """Make simulating fail loudly: a check that must come first comes first."""
    import moesim.engine.api as run_mod

    def boom(*a, **k):
        raise AssertionError("simulated before checking the output path")

    monkeypatch.setattr(run_mod, "simulate", boom)


# ---------------------------------------------------------------- item 2: default folders

def test_default_run_dir_per_scenario_and_overrides():
    from moesim.outputs import default_run_dir

    assert default_run_dir("hot-expert") == Path("out/hot-expert")
    assert default_run_dir("hot-expert", ["routing.kind=uniform"]) == \
        Path("out/hot-expert--routing.kind=uniform")
    assert default_run_dir("hot-expert", ["a=1", "b=2"]) == Path("out/hot-expert--a=1+b=2")
    odd = default_run_dir("hot-expert", ["routing.replicate=[{expert: 3, ranks: [5]}]"])
    # not a plain name: a readable prefix and 8 hex digits of SHA-256 of the items
    import hashlib
    digest = hashlib.sha256(b"routing.replicate=[{expert: 3, ranks: [5]}]").hexdigest()[:8]
    assert odd == Path(f"out/hot-expert--routing.replicate=_expert_3,_ranks_5-{digest}")
    long = default_run_dir("x", ["k=" + "v" * 200])
    assert len(long.name) < 60 and long == default_run_dir("x", ["k=" + "v" * 200])
    assert default_run_dir("x", ["a=1", "b=2"]) != default_run_dir("x", ["b=2", "a=1"])


def test_what_ifs_of_one_scenario_get_their_own_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "toy-cpu", "--quiet"]) == 0
    assert "wrote out/toy-cpu/" in capsys.readouterr().out
    assert main(["run", "toy-cpu", "--quiet", "--set", "seed=1"]) == 0
    assert "wrote out/toy-cpu--seed=1/" in capsys.readouterr().out
    assert main(["run", "toy-cpu", "--quiet", "--set", "seed=1", "--json"]) == 0
    assert "moesim run: wrote out/toy-cpu--seed=1/" in capsys.readouterr().err
    a = json.loads((tmp_path / "out/toy-cpu/summary.json").read_text())
    b = json.loads((tmp_path / "out/toy-cpu--seed=1/summary.json").read_text())
    assert a["seed"] == 0 and b["seed"] == 1
    # the identical run again replaces moesim's own output
    assert main(["run", "toy-cpu", "--quiet"]) == 0
    capsys.readouterr()
    # a folder holding a file of the user's stays protected
    (tmp_path / "out/toy-cpu/notes.txt").write_text("mine")
    assert main(["run", "toy-cpu", "--quiet"]) == 2
    _one_line_error(capsys, "out/toy-cpu", "notes.txt", "--force")
    assert (tmp_path / "out/toy-cpu/notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- item 5: content, write time

def test_summary_json_lists_the_files_moesim_wrote(tmp_path):
    out = tmp_path / "run"
    write_run_outputs(hot_expert_result(), out, quiet=True)
    rec = json.loads((out / "summary.json").read_text())[MARKER]
    assert rec["files"] == sorted(OUTPUT_FILES) and rec["version"] == "0.1.0"
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)   # no temp files


@pytest.mark.parametrize("name", ["summary.md", "trace.json", "summary.json", "stalls.csv"])
def test_a_users_file_with_an_output_name_is_not_replaced(tmp_path, capsys, name):
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("my own notes")
    assert main(["run", "toy-cpu", "--quiet", "-o", str(out)]) == 2
    _one_line_error(capsys, name, "--force")
    assert (out / name).read_text() == "my own notes"
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_files_created_while_simulating_are_not_replaced(tmp_path, monkeypatch, capsys):
    """The folder is checked before simulating and again when each file is put in
    place: a file the user created meanwhile is kept, and nothing is half-written."""
    import moesim.engine.api as run_mod

    out = tmp_path / "run"
    real = run_mod.simulate

    def slow(*a, **k):
        res = real(*a, **k)
        out.mkdir(exist_ok=True)
        (out / "trace.json").write_text("written meanwhile")
        return res

    monkeypatch.setattr(run_mod, "simulate", slow)
    assert main(["run", "toy-cpu", "--quiet", "-o", str(out)]) == 2
    _one_line_error(capsys, "trace.json")
    assert (out / "trace.json").read_text() == "written meanwhile"
    assert sorted(p.name for p in out.iterdir()) == ["trace.json"]


def test_a_file_appearing_between_check_and_rename_is_kept(tmp_path, monkeypatch):
    import moesim.trace.plots as plots  # imported where the figures are drawn

    out = tmp_path / "run"           # new: the check before writing finds nothing
    real = plots.plot_links

    def meanwhile(result, ax):
        (out / "summary.md").write_text("the user's")
        return real(result, ax)

    monkeypatch.setattr(plots, "plot_links", meanwhile)
    with pytest.raises(InputError, match="summary.md"):
        write_run_outputs(hot_expert_result(), out, quiet=True)
    assert sorted(p.name for p in out.iterdir()) == ["summary.md"]   # no temporary files
    assert (out / "summary.md").read_text() == "the user's"


def test_plot_without_extension_checks_and_reports_the_png(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_run_outputs(hot_expert_result(), run_dir, quiet=True)
    (tmp_path / "zoom.png").write_bytes(b"my picture")
    assert main(["plot", str(run_dir), "-o", str(tmp_path / "zoom")]) == 2
    _one_line_error(capsys, "zoom.png", "--force")
    assert (tmp_path / "zoom.png").read_bytes() == b"my picture"
    assert main(["plot", str(run_dir), "-o", str(tmp_path / "z2")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'z2.png'}"
    assert (tmp_path / "z2.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "z2").exists()


def test_a_plot_inside_a_run_folder_is_part_of_that_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_run_outputs(hot_expert_result(), run_dir, quiet=True)
    assert main(["plot", str(run_dir), "--ranks", "1"]) == 0
    assert "zoom.png" in json.loads((run_dir / "summary.json").read_text())[MARKER]["files"]
    write_run_outputs(hot_expert_result(), run_dir, quiet=True)   # the rerun replaces it all
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(OUTPUT_FILES)


# ---------------------------------------------------------------- item 6: atomic

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_interrupted_while_drawing_leaves_the_previous_run(tmp_path, monkeypatch):
    import moesim.trace.plots as plots  # imported where the figures are drawn

    out = tmp_path / "run"
    write_run_outputs(hot_expert_result(), out, quiet=True)
    before = _snapshot(out)

    def ctrl_c(result, ax):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_experts", ctrl_c)
    other = hot_expert_result()
    other.scenario = {"seed": 8}
    for parallel in (True, False):
        with pytest.raises(KeyboardInterrupt):
            write_run_outputs(other, out, force=True, quiet=True, parallel=parallel)
        assert _snapshot(out) == before       # the previous run, whole; no temporary file
    fresh = tmp_path / "fresh"
    with pytest.raises(KeyboardInterrupt):
        write_run_outputs(other, fresh, quiet=True)
    assert not fresh.exists()      # no run at all: the folder it made is removed again


def test_interrupted_while_renaming_leaves_no_complete_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    write_run_outputs(hot_expert_result(), out, quiet=True)
    real = os.replace
    calls = []

    def replace(src, dst):
        calls.append(Path(dst).name)
        if len(calls) == 4:     # the incomplete marker, then three files, then Ctrl-C
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_run_outputs(hot_expert_result(), out, quiet=True)
    monkeypatch.setattr(os, "replace", real)
    assert calls[0] == "summary.json"
    doc = json.loads((out / "summary.json").read_text())
    assert doc[MARKER]["complete"] is False and "step_time_s" not in doc
    assert not [p for p in out.iterdir() if _is_temporary(p.name)]
    assert main(["plot", str(out), "-o", str(tmp_path / "z.png")]) == 2
    _one_line_error(capsys, "summary.json", "interrupted")
    assert main(["compare", str(out), str(out)]) == 2
    _one_line_error(capsys, "interrupted")
    write_run_outputs(hot_expert_result(), out, quiet=True)      # the rerun completes it
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    assert "step_time_s" in json.loads((out / "summary.json").read_text())


# ---------------------------------------------------------------- item 7: names

@pytest.mark.parametrize("name", ["../x", "/tmp/moesim-escape", "a/b", "..", "", "x\\y"])
def test_scenario_name_cannot_leave_out(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    scn = (ROOT / "scenarios/toy-cpu.yaml").read_text().replace("name: toy-cpu",
                                                                f"name: {json.dumps(name)}")
    assert f"name: {json.dumps(name)}" in scn
    (tmp_path / "s.yaml").write_text(scn)
    assert main(["run", "s.yaml", "--quiet"]) == 2
    _one_line_error(capsys, "s.yaml: name: expected a")
    assert main(["run", "toy-cpu", "--quiet", "--set", f"name={json.dumps(name)}"]) == 2
    _one_line_error(capsys, "command line: --set name: expected a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_sweep_names_follow_the_same_rule(tmp_path):
    from moesim.sweep.spec import load_sweep

    p = tmp_path / "sw.yaml"
    p.write_text("name: ok\nscenario: toy-cpu\naxes: {routing.kind: [uniform, hot]}\n")
    assert load_sweep(p).name == "ok"
    p.write_text("name: ..\nscenario: toy-cpu\naxes: {routing.kind: [uniform, hot]}\n")
    with pytest.raises(InputError, match="name: expected a name without path separators"):
        load_sweep(p)


# ---------------------------------------------------------------- item 9: OS errors

def test_run_output_under_a_file_is_refused_before_simulating(tmp_path, monkeypatch, capsys):
    _no_simulation(monkeypatch)
    (tmp_path / "f").write_text("")
    assert main(["run", "toy-cpu", "-o", str(tmp_path / "f" / "sub")]) == 2
    _one_line_error(capsys, "a file where a folder must be")
    assert main(["run", "toy-cpu", "-o", str(tmp_path / "f")]) == 2
    _one_line_error(capsys, "expected a folder")


def test_run_output_name_too_long_is_refused_before_simulating(tmp_path, monkeypatch, capsys):
    _no_simulation(monkeypatch)
    assert main(["run", "toy-cpu", "-o", str(tmp_path / TOO_LONG / "x")]) == 2
    _one_line_error(capsys, "name too long")


def test_run_output_without_permission_is_refused(tmp_path, monkeypatch, capsys):
    _no_simulation(monkeypatch)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    assert main(["run", "toy-cpu", "-o", str(tmp_path / "new")]) == 2
    _one_line_error(capsys, "permission denied")


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "run"
    write_run_outputs(hot_expert_result(), out, quiet=True)
    return out


@pytest.mark.parametrize("target,needle", [
    ("missing/zoom.png", "missing"),
    ("f/zoom.png", "a file"),
    (TOO_LONG + ".png", "name too long"),
])
def test_plot_output_errors(tmp_path, capsys, run_dir, target, needle):
    (tmp_path / "f").write_text("")
    assert main(["plot", str(run_dir), "-o", str(tmp_path / target)]) == 2
    _one_line_error(capsys, needle)


@pytest.mark.parametrize("target,needle", [
    ("missing/c.json", "missing"),
    ("f/c.json", "a file"),
    (TOO_LONG + ".json", "name too long"),
])
def test_calibrate_output_checked_before_the_fit(tmp_path, monkeypatch, capsys, target, needle):
    import moesim.validation.cpu.ingest as ingest_mod
    import moesim.validation.runs as runs_mod

    def boom(*a, **k):
        raise AssertionError("fitted before checking -o")

    # the calibrate command reads the traces through runs.py's own binding of ingest (a
    # `from ... import`), so that name is the one to replace; the module's too, for any
    # other path (patching only the module's would leave runs.py's, or, imported while
    # patched, bind boom for the rest of the session)
    monkeypatch.setattr(runs_mod, "ingest", boom)
    monkeypatch.setattr(ingest_mod, "ingest", boom)
    (tmp_path / "f").write_text("")
    assert main(["calibrate", str(ROOT / "traces/uniform"), "-o", str(tmp_path / target)]) == 2
    _one_line_error(capsys, needle)


def test_validate_and_topology_output_errors(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["validate", str(ROOT / "traces/hot"), "--calibration",
                 str(ROOT / "traces/calib-uniform-cpu.json"), "-o", str(tmp_path / "f/v")]) == 2
    _one_line_error(capsys, "a file where a folder must be")
    assert main(["topology", "dgx-h100", "--draw", str(tmp_path / (TOO_LONG + ".png"))]) == 2
    _one_line_error(capsys, "name too long")


def test_os_error_while_writing_is_one_line(tmp_path, monkeypatch, capsys, run_dir):
    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert main(["plot", str(run_dir), "-o", str(tmp_path / "z.png")]) == 2
    _one_line_error(capsys, "z.png", "No space left on device")
    assert not [p for p in tmp_path.iterdir() if _is_temporary(p.name)]


# ---------------------------------------------------------------- issue 20 item 7: one run per folder

def test_a_second_run_into_a_folder_being_written_fails_in_one_line(tmp_path, monkeypatch,
                                                                    capsys):
    """Run B starts while run A simulates into the same -o folder: B fails in one line
    (exit 2) naming the folder, A's result is the one there, and both never print
    "wrote". Deterministic: B runs from inside A's simulation."""
    import moesim.engine.api as run_mod

    out = tmp_path / "shared"
    real = run_mod.simulate
    inner: list[int] = []

    def a_simulating(*a, **k):
        if not inner:
            inner.append(main(["run", "toy-cpu", "--quiet", "-o", str(out), "--set", "seed=2"]))
        return real(*a, **k)

    monkeypatch.setattr(run_mod, "simulate", a_simulating)
    assert main(["run", "toy-cpu", "--quiet", "-o", str(out)]) == 0
    assert inner == [2]
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(err) == 1 and str(out) in err[0] and "another moesim run" in err[0], err
    assert f"pid {os.getpid()}" in err[0] and "Traceback" not in cap.err
    assert cap.out.count("wrote") == 1
    assert json.loads((out / "summary.json").read_text())["seed"] == 0      # A's
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)   # lock gone


def test_another_process_is_refused_while_a_folder_is_held(tmp_path):
    import subprocess
    import sys

    from moesim.outputs import LOCK_NAME, claim

    out = tmp_path / "held"
    cmd = [sys.executable, "-m", "moesim", "run", "toy-cpu", "--quiet", "-o", str(out)]
    with claim(out):
        assert (out / LOCK_NAME).exists()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert p.returncode == 2 and p.stdout == ""
        assert len(p.stderr.strip().splitlines()) == 1 and "another moesim run" in p.stderr
        assert not (out / "summary.json").exists()
    assert not out.exists()            # claimed a new folder, nothing written: removed
    # a lock file left by a killed run holds nothing: the next run takes the folder over
    out.mkdir()
    (out / LOCK_NAME).write_text("pid 1 on a killed host")
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in out.iterdir()) == sorted(OUTPUT_FILES)


def test_write_run_outputs_holds_the_folder_itself(tmp_path):
    """Callers other than `run` (the library, `serve`) get the same protection."""
    from moesim.outputs import claim

    out = tmp_path / "lib"
    with claim(out), pytest.raises(InputError, match="another moesim run"):
        write_run_outputs(hot_expert_result(), out, quiet=True)
    write_run_outputs(hot_expert_result(), out, quiet=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)


# ---------------------------------------------------------------- issue 20 item 8 (run side)

def test_run_refuses_a_serving_scenario_in_one_line(tmp_path, monkeypatch, capsys):
    """`moesim run` on a scenario with a serve: section (or one given by --set) fails
    in one line, exit 2, before simulating, instead of simulating a training step."""
    _no_simulation(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "mixtral-8x7b-serve", "--quiet"]) == 2
    line = _one_line_error(capsys, "mixtral-8x7b-serve.yaml: serve:", "moesim serve")
    assert line.startswith("moesim run: error:")
    assert main(["run", "hot-expert", "--quiet", "--set", "serve.phase=decode"]) == 2
    _one_line_error(capsys, "command line: --set serve.phase", "moesim serve")
    assert not (tmp_path / "out").exists()
    # nor does `memory` give a training step's gradients and optimizer states for it
    assert main(["memory", "mixtral-8x7b-serve"]) == 2
    _one_line_error(capsys, "mixtral-8x7b-serve.yaml: serve:", "moesim serve")


def test_a_sweep_into_a_folder_being_written_fails_in_one_line(tmp_path, capsys):
    """Item 7 for sweeps: a sweep folder another run holds is refused before any point
    runs; free again, the same folder is accepted as a new sweep's (the lock file does
    not count as a file of the user's)."""
    from moesim.outputs import LOCK_NAME, claim
    from moesim.sweep.runner import prepare_outdir
    from moesim.sweep.spec import load_sweep

    sweep = ROOT / "scenarios" / "sweeps" / "zipf-capacity.yaml"
    out = tmp_path / "sw"
    with claim(out):
        assert main(["sweep", str(sweep), "-o", str(out), "--quiet"]) == 2
        _one_line_error(capsys, str(out), "another moesim run")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
        prepare_outdir(load_sweep(sweep), out)      # the holder itself may write there
    assert (out / "sweep.json").exists() and not (out / LOCK_NAME).exists()
