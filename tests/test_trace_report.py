"""summary.json / summary.md and the run directory writer; `moesim plot` on it."""

from __future__ import annotations

import csv
import json

import pytest

from moesim.cli import main
from moesim.errors import InputError
from moesim.trace.report import OUTPUT_FILES, full_summary, render_markdown, write_run_outputs
from tests.test_trace_fixtures import MS, hot_expert_result

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One written run directory shared by the read-only CLI tests."""
    out = tmp_path_factory.mktemp("shared") / "run"
    write_run_outputs(hot_expert_result(), out, quiet=True)
    return out


def test_full_summary_adds_stalls_path_and_scenario():
    s = full_summary(hot_expert_result())
    assert s["stalls"]["total_s"] == pytest.approx(1.2 * MS)
    assert s["stalls"]["by_blocking_rank"] == {"1": pytest.approx(1.2 * MS)}
    assert s["stalls"]["top"][0]["expert"] == 3 and s["stalls"]["top"][0]["tokens"] == 600
    assert s["critical_path"]["total_s"] == pytest.approx(4.5 * MS)
    assert s["scenario"] == {"seed": 7, "model": {"preset": "tiny"}, "layout": {"ep": 2}}
    assert s["seed"] == 7 and s["moesim_version"] == "0.1.0"
    assert s["hot_ranks"] == [1]
    json.dumps(s, allow_nan=False)


def test_markdown_has_units_and_causes():
    md = render_markdown(full_summary(hot_expert_result()))
    assert "| step time | 4.500 ms |" in md
    assert "| throughput | 111,111 tokens/s |" in md
    assert "| stall | 0.600 | 13.3 |" in md  # mean over 2 ranks: 1.2 ms / 2
    assert "expert 3 on rank 1 has 600 tokens" in md
    assert "experts 2+3: 2.000 ms" in md
    assert "peak per rank: 28.87 GiB" in md and "out of memory: no" in md   # 31e9 bytes
    assert "seed 7" in md


def test_write_run_outputs(tmp_path):
    res = hot_expert_result()
    out = tmp_path / "run"
    paths = write_run_outputs(res, out, quiet=True)
    assert sorted(p.name for p in paths) == sorted(OUTPUT_FILES)
    for p in paths:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG_MAGIC
    s = json.loads((out / "summary.json").read_text())
    with (out / "stalls.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sum(float(r["seconds"]) for r in rows) == pytest.approx(s["stalls"]["total_s"])
    assert sum(float(r["seconds"]) for r in rows) == pytest.approx(
        sum(p["breakdown_s"]["stall"] for p in s["per_rank"]))
    # same run again into the same directory: allowed, same bytes for the data files
    before = {n: (out / n).read_bytes()
              for n in ("summary.json", "summary.md", "trace.json", "stalls.csv")}
    again = hot_expert_result()
    again.wall_s = 12.5  # a slower machine: outputs must not change
    write_run_outputs(again, out, quiet=True)
    assert before == {n: (out / n).read_bytes() for n in before}


def test_refuses_foreign_files(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InputError) as ei:
        write_run_outputs(hot_expert_result(), out, quiet=True)
    assert "notes.txt" in str(ei.value) and "--force" in str(ei.value)
    assert not (out / "summary.json").exists()
    write_run_outputs(hot_expert_result(), out, force=True, quiet=True)
    assert (out / "notes.txt").read_text() == "mine"  # force writes ours, never deletes theirs
    assert (out / "trace.json").exists()


def test_refuses_outputs_of_another_scenario(tmp_path):
    out = tmp_path / "run"
    write_run_outputs(hot_expert_result(), out, quiet=True)
    other = hot_expert_result()
    other.scenario = {"seed": 8}
    with pytest.raises(InputError):
        write_run_outputs(other, out, quiet=True)
    write_run_outputs(other, out, force=True, quiet=True)
    assert json.loads((out / "summary.json").read_text())["seed"] == 8


def test_refuses_file_as_outdir(tmp_path):
    f = tmp_path / "x"
    f.write_text("")
    with pytest.raises(InputError):
        write_run_outputs(hot_expert_result(), f, quiet=True)


def test_plot_cli_zoom(tmp_path, capsys, run_dir):
    out = run_dir
    zoom = tmp_path / "zoom.png"
    assert main(["plot", str(out), "--ranks", "1", "--layers", "3-4", "-o", str(zoom)]) == 0
    assert zoom.read_bytes()[:8] == PNG_MAGIC
    # never overwrite without asking
    assert main(["plot", str(out), "-o", str(zoom)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "zoom.png" in err[0] and "--force" in err[0]
    assert main(["plot", str(out), "-o", str(zoom), "--force", "--what", "experts"]) == 0


@pytest.mark.parametrize("argv,needle", [
    (["--ranks", "7-3"], "--ranks"),
    (["--ranks", "a"], "--ranks"),
    (["--ranks", "0-9"], "ranks below 2"),
    (["--layers", "x-"], "--layers"),
])
def test_plot_cli_bad_ranges(tmp_path, capsys, argv, needle, run_dir):
    out = run_dir
    assert main(["plot", str(out), "-o", str(tmp_path / "z.png"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_plot_cli_missing_run_dir(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_parallel_writer_same_files_as_sequential(tmp_path):
    res = hot_expert_result()
    a = write_run_outputs(res, tmp_path / "a", quiet=True, parallel=True)
    b = write_run_outputs(res, tmp_path / "b", quiet=True, parallel=False)
    assert [p.name for p in a] == [p.name for p in b]
    for name in ("summary.json", "summary.md", "trace.json", "stalls.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_writer_error_in_the_child_is_raised_here(tmp_path, monkeypatch):
    import moesim.trace.report as report

    def broken(result, path):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(report, "write_chrome_trace", broken)
    for parallel in (True, False):
        with pytest.raises(RuntimeError, match="disk on fire"):
            write_run_outputs(hot_expert_result(), tmp_path / str(parallel), quiet=True,
                              parallel=parallel)
