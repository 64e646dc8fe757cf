"""Issue 36, item 10 (the cases outside ``load:`` / serving under load and ``rl:``): a
section of the wrong type, pipeline layout strings repeated 10^12 times, serving steps
too large to simulate, ``routing.max_nodes`` above the nodes an EP group spans,
``schedule.seq_len`` against 2·cp on ``layout``, ``layout`` of a serving scenario, a
``--set`` blamed on the file, ``kernels`` bad input. Every refusal is one line naming the
file (or "command line"), the field and what was expected, exit status 2, no traceback,
through the CLI entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moesim.cli import main
from moesim.schedule.layout_string import MAX_LAYOUT_CHARS, expand, layout_chunks
from tests._util import refused

REPO = Path(__file__).resolve().parents[1]
TOY = yaml.safe_load((REPO / "scenarios" / "toy-cpu.yaml").read_text())
SERVE = yaml.safe_load((REPO / "scenarios" / "mixtral-8x7b-serve.yaml").read_text())
GRPO = yaml.safe_load((REPO / "scenarios" / "grpo-qwen3-30b-a3b.yaml").read_text())

SECTIONS = ("cluster", "model", "routing", "parallel", "schedule", "compute", "overlap",
            "memory", "engine", "serve", "rl", "load")
WRONG = (3, [1, 2], "x", [])


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """Run in an empty folder, so "nothing written" can be checked."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(folder: Path, data: dict, name: str = "s.yaml") -> Path:
    p = folder / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def command(cmd: str, path) -> list:
    """The argv of ``cmd`` on scenario ``path``, writing nothing."""
    return {"run": ["run", path, "--no-files", "--quiet"],
            "serve": ["serve", path, "--no-files", "--quiet"],
            "rl": ["rl", path, "--no-files", "--quiet"],
            "kernels": ["kernels", path], "layout": ["layout", path],
            "memory": ["memory", path]}[cmd]


# ------------------------------------------------------- a section of the wrong type

@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("cmd, base", [("run", TOY), ("serve", SERVE), ("rl", GRPO),
                                       ("kernels", TOY), ("layout", TOY), ("memory", TOY)])
def test_a_section_given_as_a_scalar_or_a_list_is_one_line(capsys, cwd, section, cmd, base):
    for value in WRONG:
        p = write(cwd, {**base, section: value})
        refused(capsys, command(cmd, p), f"s.yaml: {section}: expected a mapping", f"got {value!r}")
    assert sorted(x.name for x in cwd.iterdir()) == ["s.yaml"]


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("cmd, name", [("run", "toy-cpu"), ("serve", "mixtral-8x7b-serve"),
                                       ("rl", "grpo-qwen3-30b-a3b"), ("kernels", "toy-cpu"),
                                       ("layout", "toy-cpu"), ("memory", "toy-cpu")])
def test_a_section_set_to_a_scalar_or_a_list_blames_the_command_line(capsys, cwd, section,
                                                                    cmd, name):
    # `moesim rl` refuses any --set parallel first (it reads rl.train / rl.rollout)
    names = ([] if (cmd, section) == ("rl", "parallel") else
             [f"expected a mapping of key: value (or --set {section}.KEY=VALUE)"])
    for value in ("3", "[1, 2]", "x", "[]"):
        refused(capsys, [*command(cmd, name), "--set", f"{section}={value}"],
                f"command line: --set {section}: ", *names)
    assert list(cwd.iterdir()) == []


def test_a_section_set_to_a_mapping_replaces_it(capsys, cwd):
    """``--set parallel={...}`` is a mapping: the section's fields are checked as such."""
    refused(capsys, ["layout", "toy-cpu", "--set", "parallel={bogus: 1}"],
            "command line: --set parallel.bogus: expected one of the parallel keys")
    assert main(["layout", "toy-cpu", "--set", "parallel={dp: 2}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sizes"]["dp"] == 2


# ------------------------------------------------------- pipeline layout strings

@pytest.mark.parametrize("text, size", [
    ("(t|)*1000000000000", "2,000,000,000,000"),           # 2 characters x 10^12
    ("Et*1000000000000|L", "1,000,000,000,003"),           # E | L and 10^12 t
    ("E(t*100000|)*100000L", "10,000,100,002"),            # 10^5 groups of 10^5 t and a |
    ("(t|)*" + "9" * 40, "over 10^18"),                    # a count no int64 holds
])
def test_layout_strings_are_measured_before_they_are_unrolled(capsys, cwd, text, size):
    refused(capsys, ["layout", "toy-cpu", "--set", "parallel.ep=1", "--set",
                     "parallel.pp=2", "--set", f"parallel.pipeline_layout={text}"],
            "command line: --set parallel.pipeline_layout: expected a layout that unrolls to "
            f"at most {MAX_LAYOUT_CHARS:,} characters", f"this one: {size})")


def test_layout_string_lengths_by_hand():
    """The bound is the unrolled length: (tt|)*3 is 9 characters, t*4 is 4."""
    assert expand("E(tt|)*3t*4L", limit=15) == "Ett|tt|tt|ttttL"
    with pytest.raises(OverflowError) as big:
        expand("E(tt|)*3t*4L", limit=14)
    assert big.value.args == (15,)
    # the groups unrolled first (13 characters with the t*4 still folded): within 13
    with pytest.raises(OverflowError) as big:
        expand("E(tt|)*3t*4L", limit=12)
    assert big.value.args == (14,)
    assert layout_chunks("E(tt|)*3t*4L", layers=10, mtp=0, n_stages=4) == [
        range(0, 2), range(2, 4), range(4, 6), range(6, 10)]


# ------------------------------------------------------- serving steps too large

@pytest.mark.parametrize("field, value, limit", [
    ("batch_per_gpu", 10**12, "at most 65,536 requests per GPU"),
    ("context", 10**12, "at most 1,048,576 tokens in a request's KV cache"),
    ("prompt", 10**12, "at most 1,048,576 prompt tokens per request"),
    ("output", 10**12, "at most 1,048,576 tokens generated per request"),
    ("sample_top_k", 10**12, "at most 1,048,576 tokens kept by the sampler"),
    ("step", 10**12, "at most 2,147,483,648 the routing step index"),
    ("tp", 10**12, "at most 65,536 GPUs per tensor-parallel group"),
    ("ep", 10**12, "at most 65,536 GPUs per expert-parallel group"),
    ("attn_dp", 10**12, "at most 65,536 attention data-parallel ranks"),
])
def test_serving_sizes_are_bounded_with_the_limit_named(capsys, cwd, field, value, limit):
    refused(capsys, ["serve", "mixtral-8x7b-serve", "--no-files", "--set",
                     f"serve.{field}={value}"], f"command line: --set serve.{field}", limit,
            "docs/scenarios.md, Size limits", f"got {value}")
    p = write(cwd, {**SERVE, "serve": {**SERVE["serve"], field: value}})
    refused(capsys, ["serve", p, "--no-files"], f"s.yaml: serve.{field}: expected {limit}")


def test_a_serving_micro_batch_is_bounded_in_requests_and_tokens(capsys, cwd):
    """tp 8 x 8,192 requests per GPU = 65,536 requests per TP group: the limit; twice that
    in two micro-batches too; 16,384 x tp 8 in one micro-batch is over it. Prefill: 256
    requests x 16,384 prompt tokens = 2^22 tokens per micro-batch is the limit."""
    base = ["serve", "mixtral-8x7b-serve", "--no-files", "--set", "serve.tp=8",
            "--set", "serve.ep=1"]
    refused(capsys, [*base, "--set", "serve.batch_per_gpu=16384"],
            "command line: --set serve.batch_per_gpu: expected batch_per_gpu·tp / "
            "micro-batches <= 65,536 requests per micro-batch of a TP group (tp=8, 1 "
            "micro-batch(es)", "got 16384")
    pre = ["serve", "mixtral-8x7b-serve", "--no-files", "--set", "serve.phase=prefill",
           "--set", "serve.batch_per_gpu=256"]
    refused(capsys, [*pre, "--set", "serve.prompt=16385"],
            "command line: --set serve.prompt: expected requests per micro-batch x prompt "
            "<= 4,194,304 tokens per micro-batch", "(256 requests", "got 16385")
    from moesim.scenario.sections.serve import serve_from_dict
    cfg = serve_from_dict({"phase": "prefill", "batch_per_gpu": 256, "prompt": 16384}, "t")
    assert cfg.tokens_per_group() == 2**22
    cfg = serve_from_dict({"batch_per_gpu": 8192, "tp": 8, "two_microbatch": True}, "t")
    assert cfg.requests_per_group() == 65536


@pytest.mark.parametrize("field", ["batch_per_gpu", "prompt", "context", "output", "tp",
                                   "attn_dp", "ep", "sample_top_k", "step"])
def test_every_numeric_serve_field_refuses_nan_inf_denormals_and_overflow(capsys, cwd, field):
    for raw, shown in ((".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf"),
                       ("1e400", "inf"), ("1.0e-320", "1e-320"), ("2.5", "2.5"),
                       ("-1", "-1"), ("true", "True")):
        refused(capsys, ["serve", "mixtral-8x7b-serve", "--no-files", "--set",
                         f"serve.{field}={raw}"], f"command line: --set serve.{field}",
                f"got {shown}")
    big = 10**400   # an integer YAML reads exactly: over every limit
    p = cwd / "s.yaml"
    p.write_text(yaml.safe_dump({**SERVE, "serve": {**SERVE["serve"], field: 0}}).replace(
        f"{field}: 0", f"{field}: {big}"))
    refused(capsys, ["serve", p, "--no-files"], f"s.yaml: serve.{field}: expected")


# ------------------------------------------------------- routing.max_nodes

@pytest.mark.parametrize("argv", [
    ["run", "hot-expert", "--no-files", "--quiet"],
    ["serve", "mixtral-8x7b-serve", "--no-files", "--quiet"],
    ["memory", "hot-expert"], ["layout", "hot-expert"], ["kernels", "hot-expert"],
])
def test_max_nodes_above_the_nodes_an_ep_group_spans_is_refused(capsys, cwd, argv):
    """EP8 on one 8-GPU node spans 1 node: max_nodes 2 limits nothing (collective
    --max-nodes refuses it the same way)."""
    refused(capsys, [*argv, "--set", "routing.max_nodes=2"],
            "command line: --set routing.max_nodes: expected at most the 1 node(s) an EP "
            "group of 8 ranks spans (8 GPUs per node", "got 2")
    refused(capsys, ["collective", "--topology", "dgx-h100", "--op", "ep_dispatch",
                     "--max-nodes", "2"], "command line: --max-nodes: expected at most the 1 "
            "node(s) the 8 EP ranks span")


def test_max_nodes_from_the_file_names_the_file(capsys, cwd):
    """The shipped DeepSeek-V3 decode (EP128, 16 nodes) with EP8 in a node: its
    max_nodes 4 is the file's; one node spanned."""
    data = yaml.safe_load((REPO / "scenarios" / "deepseek-v3-decode.yaml").read_text())
    data["serve"] = {**data["serve"], "ep": 8}
    data["cluster"] = {**data["cluster"], "nodes": 1}
    data["serve"].pop("attn_dp", None)
    p = write(cwd, data)
    refused(capsys, ["serve", p, "--no-files"], "s.yaml: routing.max_nodes: expected at most "
            "the 1 node(s) an EP group of 8 ranks spans", "got 4")


# ------------------------------------------------------- seq_len and 2·cp on layout

def test_layout_refuses_seq_len_not_a_multiple_of_2cp(capsys, cwd):
    # cp 2: the sequence is cut in 2·cp = 4 chunks; 6 tokens do not split
    for cmd in ("layout", "kernels", "memory"):
        refused(capsys, [*command(cmd, "toy-cpu"), "--set", "parallel.cp=2", "--set",
                         "schedule.seq_len=6"], "command line: --set schedule.seq_len: "
                "expected a multiple of 2*cp = 4", "got 6")
    # cp 3 against the file's 128 tokens: the --set is to blame, the file's field named
    refused(capsys, ["layout", "toy-cpu", "--set", "parallel.cp=3", "--set", "cluster.nodes=3"],
            "command line: --set parallel.cp (with ", "toy-cpu.yaml's schedule.seq_len): "
            "expected a multiple of 2*cp = 6", "got 128")
    assert main(["layout", "toy-cpu", "--set", "parallel.cp=2", "--set", "schedule.seq_len=8",
                 "--set", "parallel.dp=1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sizes"]["cp"] == 2


# ------------------------------------------------------- layout of a serving scenario

def test_layout_of_a_serving_scenario_shows_the_serving_groups(capsys, cwd):
    """mixtral-8x7b-serve with serve.tp 2, serve.ep 4 on 8 GPUs: attention DP 4; rank 5
    is tp 1 of TP group [4, 5], attention dp 2; EP groups of 4 ranks in tp-ep-dp order,
    experts replicated over 2 (edp)."""
    assert main(["layout", "mixtral-8x7b-serve", "--rank", "5", "--set", "serve.tp=2",
                 "--set", "serve.ep=4", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["serve"] == {"phase": "decode", "tp": 2, "attn_dp": 4, "ep": 4}
    assert (t["sizes"]["tp"], t["sizes"]["dp"], t["sizes"]["pp"], t["sizes"]["ep"],
            t["sizes"]["edp"]) == (2, 4, 1, 4, 2)
    g = t["groups"]
    assert set(g) == {"tp", "dp", "ep", "edp"}
    assert g["tp"]["ranks"] == [4, 5] and g["dp"]["ranks"] == [1, 3, 5, 7]
    assert g["ep"]["ranks"] == [4, 5, 6, 7] and g["edp"]["ranks"] == [1, 5]
    assert t["coords"] == {"tp": 1, "dp": 2, "ep": 1, "edp": 1}
    assert main(["layout", "mixtral-8x7b-serve"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("scenario mixtral-8x7b-serve: serving step (decode) on 8 GPUs: "
                          "attention tp=1 x attention dp=8, MoE ep=8 edp=1")
    # the training layout a serving step would ignore is refused as `serve` refuses it
    refused(capsys, ["layout", "mixtral-8x7b-serve", "--set", "parallel.tp=2"],
            "command line: --set parallel.tp: expected left unset")


def test_layout_of_a_scenario_under_load_names_its_scheduler(capsys, cwd):
    """qwen3-30b-a3b-serve-load: 16 GPUs, TP1, EP8: two EP groups of 8 are the two
    lockstep groups; disaggregated, one prefills and one decodes."""
    assert main(["layout", "qwen3-30b-a3b-serve-load", "--set", "load.scheduler=disaggregated",
                 "--set", "load.prefill_groups=1", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["serve"]["load"] == {"scheduler": "disaggregated", "prefill_groups": 1,
                                  "lockstep_groups": 2}
    assert t["groups"]["ep"]["ranks"] == list(range(8))
    refused(capsys, ["layout", "qwen3-30b-a3b-serve-load", "--set",
                     "load.scheduler=disaggregated", "--set", "load.prefill_groups=2"],
            "command line: --set load.prefill_groups: expected fewer than the 2 lockstep "
            "groups", "got 2")
    refused(capsys, ["layout", "mixtral-8x7b-serve-load", "--set",
                     "load.scheduler=disaggregated"], "command line: --set load.scheduler: "
            "expected disaggregated serving on at least two lockstep groups", "has 1")


def test_layout_of_an_rl_scenario_is_refused(capsys, cwd):
    refused(capsys, ["layout", "grpo-qwen3-30b-a3b"], "grpo-qwen3-30b-a3b.yaml: rl: expected "
            "a training or serving scenario", "rl.train and rl.rollout")
    refused(capsys, ["layout", "grpo-qwen3-30b-a3b", "--set", "rl.steps=3"],
            "grpo-qwen3-30b-a3b.yaml: rl:")
    refused(capsys, ["layout", "toy-cpu", "--set", "rl.steps=3"],
            "command line: --set rl.steps: expected a training or serving scenario")


# ------------------------------------------------------- --set blamed on the file

@pytest.mark.parametrize("argv, where", [
    (["layout", "toy-cpu", "--set", "model.heads=3"],
     "command line: --set model.heads (with "),
    (["kernels", "toy-cpu", "--set", "model.n_experts=3"],
     "command line: --set model.n_experts (with "),
    (["memory", "toy-cpu", "--set", "model.heads=3", "--set", "schedule.microbatches=2"],
     "command line: --set model.heads (with "),
    (["serve", "mixtral-8x7b-serve", "--no-files", "--set", "model.heads=3"],
     "command line: --set model.heads (with "),
    (["serve", "mixtral-8x7b-serve", "--no-files", "--set", "model.n_experts=3"],
     "command line: --set model.n_experts (with "),
    (["run", "toy-cpu", "--no-files", "--set", "model.heads=3"],
     "command line: --set model.heads (with "),
])
def test_a_set_that_breaks_a_files_value_blames_the_command_line(capsys, cwd, argv, where):
    line = refused(capsys, argv, where)
    assert "'s model.kv_heads): expected a divisor of heads (3), got 8" in line or (
        "'s parallel.ep): expected a divisor of the model's 3" in line
        or "'s serve.ep): expected a divisor of the model's 3" in line), line


def test_a_set_that_needs_a_field_the_file_leaves_out_names_it(capsys, cwd):
    refused(capsys, ["layout", "toy-cpu", "--set", "routing.kind=file"],
            "command line: --set routing.kind (then routing.file): expected a counts file")


def test_the_files_own_error_still_names_the_file(capsys, cwd):
    """A file that is wrong by itself stays blamed on the file, --set or not."""
    p = write(cwd, {**TOY, "model": {**TOY["model"], "heads": 3}})
    for extra in ([], ["--set", "schedule.microbatches=2"]):
        refused(capsys, ["layout", p, *extra], "s.yaml: model.kv_heads: expected a divisor "
                "of heads (3)")


# ------------------------------------------------------- kernels

@pytest.mark.parametrize("argv, names", [
    (["--layer", "-1"], ["command line: --layer: expected a layer index from 0 to 1"]),
    (["--layer", "2"], ["command line: --layer: expected a layer index from 0 to 1"]),
    (["--layer", str(10**20)], ["command line: --layer: expected a layer index from 0 to 1"]),
    (["--layer", "x"], ["command line: argument --layer: invalid int value: 'x'"]),
    (["--pass", "bwd"], ["command line: argument --pass: invalid choice: 'bwd'", "'fwd', "
                         "'dgrad', 'wgrad'"]),
    (["--set", "schedule.seq_len=1000000000000"], ["--set schedule.seq_len: expected at most "
                                                   "1,048,576 tokens per sequence"]),
    (["--set", "schedule.micro_batch_size=1000000000000"],
     ["--set schedule.micro_batch_size: expected at most 65,536 sequences"]),
    (["--set", "schedule.seq_len=1048576", "--set", "schedule.micro_batch_size=8"],
     ["micro_batch_size x seq_len <= 4,194,304 tokens per micro-batch"]),
    (["--set", "compute=[1]"], ["command line: --set compute: expected a mapping"]),
])
def test_kernels_bad_input_is_one_line(capsys, cwd, argv, names):
    refused(capsys, ["kernels", "toy-cpu", *argv], *names)


@pytest.mark.parametrize("argv", [["kernels", "toy-cpu"], ["layout", "toy-cpu"],
                                  ["run", "toy-cpu", "--no-files"]])
def test_routed_experts_per_rank_are_bounded(capsys, cwd, argv):
    """toy-cpu is EP2: 131,074 experts put 65,537 on a rank, one over the limit."""
    refused(capsys, [*argv, "--set", "model.n_experts=131074"],
            "command line: --set model.n_experts: expected at most 65,536 routed experts per "
            "EP rank (n_experts / ep = 131074 / 2", "got 131074")


def test_kernels_on_a_serving_scenario_points_at_serve(capsys, cwd):
    refused(capsys, ["kernels", "mixtral-8x7b-serve"], "serve: expected a training scenario",
            "moesim serve")
    refused(capsys, ["kernels", "grpo-qwen3-30b-a3b"], "grpo-qwen3-30b-a3b.yaml: rl: expected "
            "a training or serving scenario", "`moesim kernels` would ignore them")
