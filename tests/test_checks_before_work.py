"""Issue 20 item 14: every size, count and resource is checked against what it applies
to before any work, and a flag or field a command would ignore is refused (or, where a
shipped what-if keeps it, warned about). Each refusal: one line, exit 2, no traceback,
naming the command line (or the file) and the field."""

from __future__ import annotations

import pytest

from moesim.cli import main
from moesim.wiring import resolve_path


def _boom(*a, **k):
    raise AssertionError("worked before checking")


def _one_line(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


EP = ["collective", "--topology", "dgx-h800", "--nodes", "2", "--op", "ep_dispatch"]


@pytest.mark.parametrize("extra, needles", [
    # 10^8 tokens per rank asked numpy for 191 GiB and died with a traceback
    (["--tokens", "100000000"], ["--tokens/--experts/--top-k", "16 x 100000000 x (256 + 8)"]),
    (["--experts", "100000000"], ["--tokens/--experts/--top-k", "4096 x (100000000 + 8)"]),
    (["--top-k", "1000", "--experts", "2000"], ["--tokens/--experts/--top-k"]),
    # SMs against the device (H800: 132), and only where they apply
    (["--sms", "1000"], ["--sms", "fewer than the device's 132 SMs (H800)", "got 1000"]),
    (["--kernel", "nccl", "--sms", "24"], ["--sms", "no --sms with --kernel nccl"]),
    # node-limited routing against the nodes the EP ranks span
    (["--max-nodes", "4"], ["--max-nodes", "at most the 2 node(s) the 16 EP ranks span"]),
    (["--bytes", "1MB"], ["--bytes", "no --bytes with --op ep_dispatch"]),
    (["--model", "analytical"], ["--model", "no --model with --op ep_dispatch"]),
])
def test_ep_collective_checked_before_routing(monkeypatch, capsys, extra, needles):
    import moesim.ep.simulate as ep_sim

    monkeypatch.setattr(ep_sim, "simulate_ep", _boom)
    assert main([*EP, *extra]) == 2
    _one_line(capsys, "moesim collective: error: command line:", *needles)


@pytest.mark.parametrize("argv, needles", [
    (["--op", "all_reduce", "--bytes", "1MB", "--sms", "24"],
     ["--sms", "no --sms with --op all_reduce", "ep_dispatch | ep_combine"]),
    (["--op", "all_reduce", "--bytes", "1MB", "--root", "3"], ["--root", "broadcast"]),
    (["--op", "all_reduce", "--bytes", "1MB", "--tokens", "64"], ["--tokens"]),
    (["--op", "dist_topk", "--vocab", "1000", "--k", "5", "--batch", "4", "--tokens", "4"],
     ["--tokens", "no --tokens with --op dist_topk"]),
    (["--op", "all_reduce", "--bytes", "1MB", "--vocab", "1000"], ["--vocab", "dist_topk"]),
])
def test_collective_flags_that_would_be_ignored_are_refused(capsys, argv, needles):
    assert main(["collective", "--topology", "dgx-h800", "--nodes", "2", *argv]) == 2
    _one_line(capsys, *needles)


def test_ep_collective_within_limits_still_runs(capsys):
    assert main([*EP, "--max-nodes", "2", "--sms", "24", "--tokens", "64", "--json"]) == 0
    assert '"sms": 24' in capsys.readouterr().out


@pytest.mark.parametrize("argv, needles", [
    # 100000 stages x 8, 8 x 10^8: hung without a word
    (["1f1b", "--pp", "100000", "--microbatches", "8"], ["--pp/--microbatches", "524,288",
                                                         "100000 x 8"]),
    (["dualpipe", "--pp", "8", "--microbatches", "100000000"], ["8 x 100000000"]),
    (["1f1b", "--pp", "4", "--microbatches", "8", "--force"], ["--force", "only with --plot"]),
])
def test_schedule_checked_before_work(monkeypatch, capsys, argv, needles):
    import moesim.cli.schedule_cmd as sched

    monkeypatch.setattr(sched, "schedule_report", _boom)
    assert main(["schedule", *argv]) == 2
    _one_line(capsys, "moesim schedule: error: command line:", *needles)


@pytest.mark.parametrize("argv, needles", [
    (["memory", "toy-cpu", "--tp", "4"], ["--tp", "only with --matmul", "parallel.tp"]),
    (["memory", "toy-cpu", "--dtype", "fp8"], ["--dtype", "only with --matmul"]),
    (["memory", "--matmul", "8", "8", "8", "--set", "parallel.tp=2"],
     ["--set", "only with a scenario"]),
    (["memory", "--matmul", "8", "8", "8", "--megatron"], ["--megatron", "only with a scenario"]),
])
def test_memory_flags_that_would_be_ignored_are_refused(capsys, argv, needles):
    assert main(argv) == 2
    _one_line(capsys, "moesim memory: error: command line:", *needles)


@pytest.mark.parametrize("sets, needles", [
    (["parallel.ep_backend.kind=deepep", "parallel.ep_backend.sms=500"],
     ["--set parallel.ep_backend.sms", "fewer than the device's 132 SMs (H100)", "got 500"]),
    (["overlap.nccl_sms=1000"], ["--set overlap.nccl_sms", "132 SMs", "got 1000"]),
    (["parallel.ep_backend.kind=deepep", "parallel.ep_backend.sms=21"],
     ["--set parallel.ep_backend.sms", "an even number"]),
    # DeepEP's kernels static_assert kHidden % 128 == 0 (gpt-oss's 2880 is not)
    (["parallel.ep_backend.kind=deepep", "model.hidden=1000"],
     ["--set parallel.ep_backend.kind", "multiple of 128", "hidden is 1000"]),
])
def test_scenario_sms_checked_against_the_device_before_work(monkeypatch, capsys, sets,
                                                              needles):
    import moesim.engine.api as api

    monkeypatch.setattr(api, "simulate", _boom)
    argv = [x for s in sets for x in ("--set", s)]
    for cmd in (["memory", "hot-expert"], ["run", "hot-expert", "--no-files", "--quiet"]):
        assert main([*cmd, *argv]) == 2
        _one_line(capsys, "error: command line:", *needles)


def test_node_limit_above_the_ep_group_is_refused(capsys):
    """routing.max_nodes 4 on an EP group inside one node limits nothing: refused before
    any work, as `collective --max-nodes` is (issue 36); one node is allowed."""
    for cmd in (["run", "hot-expert", "--no-files", "--quiet"], ["memory", "hot-expert"]):
        assert main([*cmd, "--set", "routing.max_nodes=4"]) == 2
        _one_line(capsys, "error: command line: --set routing.max_nodes: expected at most "
                  "the 1 node(s) an EP group of 8 ranks spans", "got 4")
    assert not any("max_nodes" in w for w in
                   resolve_path("hot-expert", ["routing.max_nodes=1"]).warnings)


def test_routing_keys_the_kind_does_not_read_are_warned():
    """`--set routing.hot_fraction=0.3` on uniform routing (or a hot scenario under
    `--set routing.kind=uniform`) changes nothing: warned, not silently dropped."""
    res = resolve_path("toy-cpu", ["routing.hot_fraction=0.3"])
    assert res.warnings == ("routing.hot_fraction applies to routing.kind hot only: "
                            "ignored with kind uniform",)
    res = resolve_path("hot-expert", ["routing.kind=zipf"])
    assert sorted(w.split(" ")[0] for w in res.warnings) == ["routing.hot_experts",
                                                             "routing.hot_fraction"]
    assert resolve_path("hot-expert").warnings == ()
