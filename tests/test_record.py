"""Record a real world-2 torch run (tiny dims) and check it through ingest."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from moesim.cli import main

TORCH_REASON = "needs torch (the torch extra): pip install -e '.[torch]'"
torch = pytest.importorskip("torch", reason=TORCH_REASON)
pytestmark = pytest.mark.torch

ARGS = ["--world", "2", "--hidden", "32", "--ffn", "64", "--experts", "4", "--top-k", "2",
        "--tokens", "64", "--steps", "3", "--warmup", "1", "--seed", "3"]
ROLES = ["count_exchange", "dispatch", "combine", "combine_grad", "dispatch_grad"]


@pytest.fixture(scope="module")
def hot_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "hot"
    assert main(["record", str(out), "--skew", "hot", "--hot-fraction", "0.6", *ARGS]) == 0
    return out


@pytest.mark.slow
def test_record_writes_traces_and_routing(hot_run):
    assert sorted(p.name for p in hot_run.iterdir()) == ["rank0.json.gz", "rank1.json.gz",
                                                        "routing.json"]
    routing = json.loads((hot_run / "routing.json").read_text())
    assert routing["args"]["skew"] == "hot" and routing["torch_version"] == torch.__version__
    assert [s["traced"] for s in routing["steps"]] == [False, True, True]
    # every rank started with glibc keeping freed memory (as a caching allocator)
    from moesim.validation.recorder.record import KEEP_MEMORY_ENV
    assert routing["host"]["malloc_env"] == KEEP_MEMORY_ENV
    assert [p["malloc_env"] for p in routing["host"]["rank_processes"]] == [KEEP_MEMORY_ENV] * 2
    for s in routing["steps"]:
        for counts in s["tokens_per_expert_by_rank"]:
            assert sum(counts) == 64 * 2          # tokens × top-k per rank


@pytest.mark.slow
def test_ingest_of_recording_conserves_tokens(hot_run):
    from moesim.validation.cpu.ingest import ingest

    routing = json.loads((hot_run / "routing.json").read_text())
    ts = ingest([str(hot_run)])
    assert ts.step_ids() == [1, 2] and ts.hidden == 32 and ts.n_experts == 4
    for sid in ts.step_ids():
        counts = np.array(routing["steps"][sid]["tokens_per_expert_by_rank"])   # [src, e]
        want = counts.reshape(2, 2, 2).sum(2)                                   # [src, dst]
        sent = ts.token_matrix(sid)
        np.testing.assert_array_equal(sent, want)
        recv = np.array([ts.step(r, sid).role("dispatch").recv_rows for r in (0, 1)])
        np.testing.assert_array_equal(recv, sent.T)      # received = sent, per pair
        assert sent.sum() == 2 * 64 * 2
        # bytes = rows × hidden 32 × 4 (float32)
        np.testing.assert_array_equal(ts.byte_matrix(sid), want * 32 * 4)
        for r in (0, 1):
            s = ts.step(r, sid)
            assert [o.role for o in s.ops if o.kind != "gemm" and o.kind != "memory"] == ROLES
            assert s.tokens_per_local_expert == tuple(counts[:, 2 * r:2 * r + 2].sum(0))
            assert s.phases["forward_s"] > s.phases["experts_s"] > 0
        # hot expert 0 lives on rank 0: rank 0 receives more tokens
        assert sent[:, 0].sum() > sent[:, 1].sum()


@pytest.mark.slow
def test_inferred_roles_match_our_labels(hot_run):
    """Ingest ignores the moe/* labels when inferring roles; they must agree."""
    from moesim.validation.cpu.ingest import ingest

    doc = json.loads(gzip.decompress((hot_run / "rank1.json.gz").read_bytes()))
    names = {"moe/count_exchange": "count_exchange", "moe/dispatch": "dispatch",
             "moe/combine": "combine", "moe/combine_grad": "combine_grad",
             "moe/dispatch_grad": "dispatch_grad"}
    labels = sorted((e["ts"], names[e["name"]]) for e in doc["traceEvents"]
                    if e.get("name") in names)
    ts = ingest([str(hot_run)])
    inferred = [o.role for sid in ts.step_ids() for o in ts.step(1, sid).ops
                if o.kind in ("all_to_all", "count_exchange")]
    assert inferred == [role for _, role in labels]


def test_record_refuses_non_empty_outdir(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["record", str(tmp_path), *ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err and str(tmp_path) in err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_record_rejects_layout_that_does_not_divide(tmp_path, capsys):
    assert main(["record", str(tmp_path / "x"), "--world", "3", "--experts", "8"]) == 2
    assert "--experts" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_same_seed_same_routing(hot_run, tmp_path):
    again = tmp_path / "again"
    assert main(["record", str(again), "--skew", "hot", "--hot-fraction", "0.6", *ARGS]) == 0
    steps = [json.loads((d / "routing.json").read_text())["steps"] for d in (hot_run, again)]
    assert steps[0] == steps[1]


def test_record_rejects_out_of_range_nice(tmp_path, capsys):
    assert main(["record", str(tmp_path / "x"), "--nice", "-40", *ARGS]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--nice" in err and "-20..19" in err
    assert not (tmp_path / "x").exists()


def test_pin_binds_rank_r_to_the_rth_allowed_core(monkeypatch):
    """Allowed cores {3, 5}: rank 0 → 3, rank 1 → 5, rank 2 → 3 (modulo); no niceness
    change when nice is 0."""
    import os

    from moesim.validation.recorder.record import RecordConfig, _quiet_the_rank

    calls = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: calls.append(cores))
    monkeypatch.setattr(os, "nice", lambda inc: pytest.fail("nice called"))
    cfg = RecordConfig(outdir="", pin=True)
    assert [_quiet_the_rank(r, cfg) for r in (0, 1, 2)] == [{"core": 3}, {"core": 5},
                                                            {"core": 3}]
    assert calls == [{3}, {5}, {3}]
    assert _quiet_the_rank(0, RecordConfig(outdir="")) == {}


def test_release_memory_leaves_the_environment_alone(monkeypatch):
    """--release-memory: the ranks get no malloc tunables; the parent's environment is
    restored after the block either way."""
    import argparse
    import os

    from moesim.cli.record_cmd import add_arguments
    from moesim.validation.recorder.record import KEEP_MEMORY_ENV, _environment
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    assert ap.parse_args(["x"]).release_memory is False
    assert ap.parse_args(["x", "--release-memory"]).release_memory is True
    monkeypatch.setenv("MALLOC_TOP_PAD_", "7")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with _environment(KEEP_MEMORY_ENV):
        assert all(os.environ[k] == v for k, v in KEEP_MEMORY_ENV.items())
    assert os.environ["MALLOC_TOP_PAD_"] == "7" and "MALLOC_TRIM_THRESHOLD_" not in os.environ
