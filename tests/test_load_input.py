"""Bad input for ``moesim serve`` with a ``load:`` section (issue 36, items 3 and 10): every
refusal is one line naming the file or "command line", the field and what was expected,
exit status 2; counts bounded by what one machine simulates (the limit in the message);
the output folder held by one run and recognised as this command's own on a rerun. In
process (moesim.cli.main) on the 8-GPU Mixtral deployment with a 2 x 2 step-cost grid,
built once into a temporary cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.cli import main
from moesim.errors import InputError
from moesim.scenario.sections.load_limits import MAX_REQUESTS, MAX_TOKENS
from moesim.traffic import lengths
from moesim.traffic.config import load_from_dict

SCN = "mixtral-8x7b-serve-load"
GRID = ["--set", "load.surface.batches=[1,8]", "--set", "load.surface.contexts=[128,2048]",
        "--set", "load.surface.prompts=[1,2]", "--set", "load.surface.prompt_lens=[128,1024]"]
SMALL = ["--set", "load.requests=40", "--set", "load.arrival.rate_rps=20",
         "--set", "load.output_tokens={dist: fixed, mean: 8}"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("surface-cache")


@pytest.fixture
def serve(cache, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MOESIM_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)

    def run(*args, grid=True):
        rc = main(["serve", SCN, *(GRID if grid else []), *SMALL, *args])
        out, err = capsys.readouterr()
        return rc, out, err
    return run


def _one_line(rc, err, *words):
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("cv", ["1.0e-200", "1.0e+200", "0", "-1"])
def test_gamma_cv_out_of_range(serve, cv):
    rc, _, err = serve("--set", "load.arrival.kind=gamma", "--set", f"load.arrival.cv={cv}",
                       "--no-files")
    _one_line(rc, err, "load.arrival.cv", "0.001", "100")


@pytest.mark.parametrize("field,limit", [
    ("load.requests", f"{MAX_REQUESTS:,}"),
    ("load.prompt_tokens.max", f"{MAX_TOKENS:,}"),
    ("load.output_tokens.mean", f"{MAX_TOKENS:,}"),
    ("load.max_seqs", "1,000,000"),
    ("load.token_budget", f"{MAX_TOKENS:,}"),
])
def test_absurd_counts_are_refused_with_the_limit(serve, field, limit):
    rc, _, err = serve("--set", f"{field}=1000000000000", "--no-files")
    _one_line(rc, err, field, limit)


@pytest.mark.parametrize("content,what", [
    ("arrival_s,prompt_tokens,output_tokens\n0,100,10\ninf,100,10\n", "finite time"),
    ("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,1e20,10\n", "token"),
    ("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,100,nan\n", "token"),
    ("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1e12,100,10\n", "spanning"),
])
def test_trace_files_with_inf_huge_or_nan_values(serve, tmp_path, content, what):
    f = tmp_path / "trace.csv"
    f.write_text(content)
    rc, _, err = serve("--set", "load.arrival={kind: trace, file: " + str(f) + "}",
                       "--no-files")
    _one_line(rc, err, "load.arrival.file", what)


def test_binary_trace_and_length_files(serve, tmp_path):
    f = tmp_path / "trace.csv"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 20)
    rc, _, err = serve("--set", "load.arrival={kind: trace, file: " + str(f) + "}",
                       "--no-files")
    _one_line(rc, err, "load.arrival.file", "binary")
    rc, _, err = serve("--set", "load.prompt_tokens={dist: empirical, file: " + str(f) + "}",
                       "--no-files")
    _one_line(rc, err, "load.prompt_tokens", "binary")
    g = tmp_path / "lens.csv"
    g.write_text("100\n1e20\n")
    rc, _, err = serve("--set", "load.output_tokens={dist: empirical, file: " + str(g) + "}",
                       "--no-files")
    _one_line(rc, err, "load.output_tokens", f"{MAX_TOKENS:,}")


@pytest.mark.parametrize("n", ["-1", "1000000", "1000000000000"])
def test_check_surface_is_bounded(serve, n):
    rc, _, err = serve("--check-surface", n, "--no-files")
    _one_line(rc, err, "command line", "--check-surface", "0 to 100")


@pytest.mark.parametrize("d", ["1000000", "1000000000000"])
def test_a_long_duration_is_refused_not_run(serve, d):
    # 20 requests/s for 10^6 s is 2 x 10^7 requests; 10^12 s is beyond 10^7 s of arrivals
    rc, _, err = serve("--set", "load.requests=null", "--set", f"load.duration_s={d}",
                       "--no-files")
    _one_line(rc, err, "load.duration_s")


def test_a_denormal_rate_is_refused(serve):
    rc, _, err = serve("--set", "load.arrival.rate_rps=1.0e-320", "--no-files")
    _one_line(rc, err, "load.arrival.rate_rps", "1e-06")


@pytest.mark.parametrize("slo,what", [("", "at least one"),
                                      ("ttft_p99=1s,ttft_p99=2s", "twice")])
def test_an_empty_or_repeated_slo(serve, slo, what):
    rc, _, err = serve("--slo", slo, "--no-files")
    _one_line(rc, err, "--slo", what)


def test_no_cache_without_a_load_section(capsys):
    rc = main(["serve", "mixtral-8x7b-serve", "--no-cache", "--no-files"])
    _one_line(rc, capsys.readouterr().err, "--no-cache", "load: section")


def test_lengths_never_overflow_to_negative():
    rng = np.random.default_rng(0)
    x = lengths.draw(lengths.LengthDist(dist="lognormal", mean=MAX_TOKENS, sigma=10.0,
                                        max=MAX_TOKENS), rng, 10_000)
    assert x.min() >= 1 and x.max() <= MAX_TOKENS
    with pytest.raises(InputError) as e:
        load_from_dict({"arrival": {"rate_rps": 1}, "requests": 3,
                        "prompt_tokens": {"dist": "lognormal", "mean": 100, "sigma": 1e6}},
                       "s.yaml")
    assert e.value.field == "load.prompt_tokens.sigma"


@pytest.mark.parametrize("section,field", [("not a mapping", "load"), ([1, 2], "load"),
                                           ({"arrival": "poisson"}, "load.arrival")])
def test_a_section_given_as_a_string_or_list(section, field):
    with pytest.raises(InputError) as e:
        load_from_dict(section, "s.yaml")
    assert e.value.field == field


def test_the_folder_is_this_commands_own_on_a_rerun(serve, tmp_path):
    rc, out, err = serve("-o", "run1", "--json")
    assert rc == 0, err
    files = sorted(p.name for p in (tmp_path / "run1").iterdir())
    assert files == ["load.png", "requests.csv", "summary.json", "summary.md", "trace.json"]
    first = json.loads((tmp_path / "run1" / "summary.json").read_text())
    assert first["load"] == json.loads(out)["load"] and first["oom"] is False
    assert first["fit"]["checks"][0]["what"] == "serving deployment under load"
    rc, out, err = serve("-o", "run1", "--json")        # the same command: no --force
    assert rc == 0, err
    second = (tmp_path / "run1" / "summary.json").read_text()
    assert json.loads(second)["load"] == json.loads(out)["load"]
    # another scenario's settings into it: refused in one line, nothing replaced
    rc, _, err = serve("-o", "run1", "--set", "load.requests=41", "--json")
    _one_line(rc, err, "run1", "--force")
    assert (tmp_path / "run1" / "summary.json").read_text() == second
    # a file moesim did not write: refused
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "notes.txt").write_text("mine")
    rc, _, err = serve("-o", "run2", "--json")
    _one_line(rc, err, "notes.txt")
    assert (tmp_path / "run2" / "notes.txt").read_text() == "mine"


def test_a_folder_another_run_holds_is_refused_in_one_line(serve, tmp_path):
    from moesim.outputs import claim
    with claim(tmp_path / "busy"):
        rc, _, err = serve("-o", "busy", "--json")
    _one_line(rc, err, "busy", "being written by another moesim run")
    assert not (tmp_path / "busy" / "summary.json").exists()


def test_summary_md_says_the_window(serve, tmp_path):
    rc, _, err = serve("-o", "w", "--slo", "ttft_p90=2s", "--quiet")
    assert rc == 0 and err == ""
    md = (tmp_path / "w" / "summary.md").read_text()
    s = json.loads((tmp_path / "w" / "summary.json").read_text())["load"]["window"]
    assert f"| measurement window | {s['start_s']:.3f} to {s['end_s']:.3f} s |" in md
    assert f"| requests arriving in the window | {s['requests']:,} |" in md


FIELDS = ["arrival.rate_rps", "arrival.cv", "requests", "duration_s", "prompt_tokens.mean",
          "prompt_tokens.sigma", "prompt_tokens.max", "output_tokens.mean",
          "output_tokens.max", "token_budget", "max_seqs", "block_size", "kv_fraction",
          "kv_tokens", "prefill_groups", "seed", "surface.batches", "surface.contexts"]
VALUES = [".nan", ".inf", "0", "-1", "1.0e-320", "1000000000000"]


@pytest.mark.slow
@pytest.mark.parametrize("field", FIELDS)
def test_fuzz_every_numeric_field_of_load(serve, field):
    """Each value: one line and exit 2 naming the field, or a bounded run whose JSON
    summary is finite."""
    extra = ["--set", "load.arrival.kind=gamma"] if field == "arrival.cv" else []
    if field.startswith("prompt_tokens") or field.startswith("output_tokens"):
        key = field.split(".")[0]
        extra += ["--set", f"load.{key}={{dist: lognormal, mean: 64, sigma: 0.5, max: 512}}"]
    for v in VALUES:
        val = f"[{v}]" if field.startswith("surface") else v
        rc, out, err = serve(*extra, "--set", f"load.{field}={val}", "--no-files", "--json")
        if rc == 0:
            s = json.loads(out)             # (allow_nan=False when written: all finite)
            assert s["load"]["requests"]["arrived"] <= 40
        else:
            _one_line(rc, err, f"load.{field.split('.')[0]}")


def test_a_deployment_that_does_not_fit_is_flagged_and_strict_stops_it(serve, tmp_path):
    # 2 x 10^6 KV tokens per GPU at Mixtral's 128 KiB per token (GQA 8 x 128 x 2 x 32
    # layers x 2 bytes) is 244 GiB: more than an H100's 79.6 GiB
    rc, out, err = serve("--set", "load.kv_tokens=2000000", "--no-files", "--json")
    assert rc == 0
    s = json.loads(out)
    assert s["oom"] is True and s["fit"]["oom"] is True
    need = s["fit"]["checks"][0]["need_bytes"]
    assert need > 2_000_000 * 32 * 2 * 8 * 128 * 2
    warn = [x for x in err.splitlines() if "warning" in x]
    assert len(warn) == 1 and "does not fit" in warn[0]
    rc, out, err = serve("--set", "load.kv_tokens=2000000", "--no-files", "--json",
                         "--strict")
    _one_line(rc, err, "--strict", "does not fit")
    assert out == ""


def test_stderr_holds_a_few_lines_and_none_twice(serve, monkeypatch, tmp_path):
    # a fresh cache: the 8 surface points are simulated; in a log (not a terminal) the
    # status line is printed at most once per 30 s, so one line for the points here
    monkeypatch.setenv("MOESIM_CACHE", str(tmp_path / "fresh"))
    rc, out, err = serve("-o", "few", "--slo", "ttft_p90=2s", "--find-capacity")
    assert rc == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == len(set(lines)) and len(lines) <= 4, lines
    assert not any("surface point" in x for x in lines)
    assert lines[-1] == ("moesim serve: wrote few/ (summary.md, summary.json, requests.csv, "
                         "load.png, trace.json)")
    assert "measurement window" in out and "capacity" in out
