"""``moesim serve`` with a load: section, end to end on the 8-GPU Mixtral deployment with a
small step-cost grid (cached in a temporary folder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

GRID = ["--set", "load.surface.batches=[1,8]", "--set", "load.surface.contexts=[128,2048]",
        "--set", "load.surface.prompts=[1,2]", "--set", "load.surface.prompt_lens=[128,1024]"]
LOAD = ["--set", "load.arrival.rate_rps=20", "--set", "load.requests=60",
        "--set", "load.prompt_tokens={dist: uniform, min: 100, max: 900}",
        "--set", "load.output_tokens={dist: fixed, mean: 20}"]


def _serve(args, cache, cwd):
    env = {"MOESIM_CACHE": str(cache), "PATH": "", "HOME": str(cwd)}
    import os
    env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "moesim", "serve", "mixtral-8x7b-serve",
                           *LOAD, *GRID, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=900)


@pytest.mark.slow
def test_load_json_keys_files_and_the_cached_surface(tmp_path):
    cache = tmp_path / "cache"
    p = _serve(["--json", "--slo", "ttft_p99=2s,tpot_p99=50ms", "-o", "out"], cache, tmp_path)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    ld = s["load"]
    for k in ("requests", "ttft_s", "tpot_s", "e2e_s", "throughput_rps",
              "output_tokens_per_s", "mean_in_system", "goodput_rps", "kv_peak_fraction"):
        assert k in ld
    assert set(ld["requests"]) >= {"arrived", "finished", "in_flight"}
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(ld[k]) == {"mean", "p50", "p90", "p99"}
    assert ld["requests"]["finished"] == 60 and ld["surface"]["points"] == 8
    assert not ld["surface"]["from_cache"]
    for f in ("summary.json", "requests.csv", "load.png", "trace.json"):
        assert (tmp_path / "out" / f).is_file()
    tr = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert any(e["ph"] == "C" for e in tr["traceEvents"])
    # the second run reads the surface from the cache and gives the same load figures
    q = _serve(["--json", "--slo", "ttft_p99=2s,tpot_p99=50ms", "--find-capacity"], cache,
               tmp_path)
    assert q.returncode == 0, q.stderr
    t = json.loads(q.stdout)["load"]
    assert t["surface"]["from_cache"] and t["surface"]["points"] == 0
    assert t["ttft_s"] == ld["ttft_s"] and t["tpot_s"] == ld["tpot_s"]
    assert t["capacity_rps"] > 0


@pytest.mark.parametrize("args,msg", [
    (["--find-capacity"], "--find-capacity"),
    (["--slo", "ttft_p98=1s"], "--slo"),
    (["--no-files", "-o", "x"], "--no-files"),
])
def test_load_flag_errors_are_one_line(tmp_path, args, msg):
    p = _serve(args, tmp_path / "c", tmp_path)
    assert p.returncode == 2 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_slo_without_a_load_section_is_refused(tmp_path):
    import os
    p = subprocess.run([sys.executable, "-m", "moesim", "serve", "mixtral-8x7b-serve",
                        "--slo", "ttft_p99=2s"], capture_output=True, text=True,
                       env={**os.environ, "MOESIM_CACHE": str(tmp_path)}, timeout=300)
    assert p.returncode == 2 and "load: section" in p.stderr


def test_serve_on_a_training_scenario_says_so_in_one_line(tmp_path):
    import os
    p = subprocess.run([sys.executable, "-m", "moesim", "serve", "mixtral-8x7b-ep8"],
                       capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert p.returncode == 2 and "no serve section" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_serve_refuses_a_training_layout_it_would_ignore(tmp_path):
    """A serving step's layout is serve.tp / serve.ep with one pipeline stage: a
    scenario's own parallel.pp (or tp, ep, ...) would be ignored, so it is refused in one
    line naming the field and who wrote it (issue 20, item 14)."""
    from moesim.errors import InputError
    from moesim.serve.run import resolve_serve

    with pytest.raises(InputError) as ei:
        resolve_serve("mixtral-8x7b-serve", ["parallel.pp=2"])
    assert ei.value.field == "--set parallel.pp" or ei.value.field.endswith("parallel.pp")
    assert ei.value.source == "command line" and ei.value.got == 2
    text = (Path("scenarios") / "mixtral-8x7b-serve.yaml").read_text()
    f = tmp_path / "serve-pp.yaml"
    f.write_text(text.replace("\nserve:", "\nparallel: {ep: 4}\nserve:", 1))
    with pytest.raises(InputError) as ei:
        resolve_serve(f)
    assert (ei.value.source, ei.value.field, ei.value.got) == (str(f), "parallel.ep", 4)
    resolve_serve("mixtral-8x7b-serve")          # the shipped file leaves them unset
