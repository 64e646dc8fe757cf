"""Distillation (moesim.distill, docs/distillation.md): the bytes of full and top-k logits,
the distributed top-k's all-gather, who sends what to whom, the step's composition, and
one-line errors. Every figure is worked out by hand in the comments."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.distill import outputs as out
from moesim.distill.step import distill_setup, simulate_distill
from moesim.distill.transfer import pair_bytes_matrix, transfer
from moesim.layout.mesh import Layout
from moesim.model.costs import memory_op

# the toy model (vocab 32,000) on 2 H100 of one PCIe node, one sequence of 128 tokens
# per micro-batch, 2 micro-batches per replica: 2 replicas x 2 x 128 = 512 tokens a step
TOY = """\
name: toy-distill
cluster:
  topology: pcie-8gpu
  params: {gpus_per_node: 2, pcie_switches_per_cpu: 1, cpus: 1}
  device: H100
model: {preset: toy}
routing: {kind: uniform}
parallel: {tp: 1, pp: 1, ep: 2}
schedule: {kind: 1f1b, microbatches: 2, micro_batch_size: 1, seq_len: 128}
compute: {kind: roofline}
engine: {mode: fast}
distill:
  teacher: {preset: toy, layers: 4}
  placement: colocated
  outputs: topk
  k: 8
"""


def _toy(tmp_path, text: str = TOY):
    p = tmp_path / "toy-distill.yaml"
    p.write_text(text)
    return p


def test_full_logits_against_top_k_bytes():
    # 4,096 tokens x 32,000 vocabulary x 2 B (bf16) = 262,144,000 B
    assert out.full_logits_bytes(4096, 32000, 2) == 262_144_000
    # top 8: 4,096 x 8 pairs x (2 B value + 4 B int32 index) = 196,608 B, 1,333x fewer
    assert out.topk_bytes(4096, 8, 2) == 196_608
    assert out.output_bytes("logits", 4096, 32000, 8, 4) == 524_288_000   # fp32 values
    assert out.output_bytes("topk", 4096, 32000, 8, 4) == 4096 * 8 * 8


def test_distributed_topk_all_gather_bytes():
    # TP 4: every rank gathers its 8 pairs per token from all 4: S = 4 x 196,608 =
    # 786,432 B (nccl-tests' all-gather size); a ring sends 3/4 of S per rank: 589,824 B;
    # the merge looks at 4 x 8 = 32 candidates per token
    g = out.allgather_bytes(4096, 8, 4, 2)
    assert g == {"size_bytes": 786_432, "sent_per_rank_bytes": 589_824,
                 "candidates_per_token": 32}
    assert out.allgather_bytes(4096, 8, 1, 2)["sent_per_rank_bytes"] == 0


def test_teacher_output_and_loss_kernels():
    # a rank of TP 4 holds 32,000 / 4 = 8,000 logits per token: the local top-8 reads
    # 4,096 x 8,000 x 2 B = 65,536,000 B and writes 196,608 B; the merge reads 32 pairs
    # and writes 8 per token: 4,096 x 40 x 6 B = 983,040 B
    local, merge = out.teacher_output_kernels("topk", 4096, 32000, 4, 8, 2)
    assert (local.name, local.bytes) == ("topk_local", 65_732_608)
    assert (merge.name, merge.bytes) == ("topk_merge", 983_040)
    assert out.teacher_output_kernels("topk", 4096, 32000, 1, 8, 2)[0].bytes == \
        4096 * 32000 * 2 + 196_608          # one rank: no merge
    assert out.teacher_output_kernels("logits", 4096, 32000, 4, 8, 2) == []
    # full logits in fp32: a cast reads 2 B and writes 4 B per logit of the slice
    assert out.teacher_output_kernels("logits", 4096, 32000, 4, 8, 4)[0].bytes == \
        4096 * 8000 * 6
    # the loss over the whole vocabulary on one rank: teacher 2 B + student fp32 4 B
    # read, fp32 loss 4 B and gradient 4 B written = 14 B per logit: 1,835,008,000 B
    assert out.loss_kernel("logits", 4096, 32000, 1, 8, 2).bytes == 1_835_008_000
    # over the top 8 on TP 2: half the pairs per rank, 2,048 x 8 x (6 + 12) B = 294,912 B
    assert out.loss_kernel("topk", 4096, 32000, 2, 8, 2).bytes == 294_912


def test_who_sends_what_to_whom():
    # student: 2 replicas of 1 GPU each, 2 sequences each (4 in all), 100 B per sequence
    lay = Layout(world=2, dp=2)
    # a separate teacher of 2 GPUs (2, 3), TP 1: group 0 computes sequences 0-1 (replica
    # 0's), group 1 sequences 2-3 (replica 1's)
    assert pair_bytes_matrix(lay, [2, 3], 1, 100.0, 2) == {(2, 0): 200.0, (3, 1): 200.0}
    # colocated, TP 1: each GPU computes its own replica's sequences: all read from HBM
    assert pair_bytes_matrix(lay, [0, 1], 1, 100.0, 2) == {(0, 0): 200.0, (1, 1): 200.0}
    # colocated, teacher TP 2: one group computes all 4 sequences, GPU j holds half the
    # vocabulary; each student GPU (the whole vocabulary) gets half of its 200 B from each
    pairs = pair_bytes_matrix(lay, [0, 1], 2, 100.0, 2)
    assert pairs == {(0, 0): 100.0, (1, 0): 100.0, (0, 1): 100.0, (1, 1): 100.0}
    # two pipeline stages (ranks 0, 1 then 2, 3): the loss is on ranks 2 (replica 0) and
    # 3 (replica 1); a colocated TP1 teacher on all 4 GPUs computes one sequence each:
    # GPUs 0, 1 send replica 0's to rank 2, GPU 2 sends replica 1's to rank 3, GPU 3
    # keeps its own
    pp = Layout(world=4, pp=2, dp=2)
    assert pair_bytes_matrix(pp, [0, 1, 2, 3], 1, 100.0, 2) == \
        {(0, 2): 100.0, (1, 2): 100.0, (2, 3): 100.0, (3, 3): 100.0}


def test_transfer_local_pairs_cross_no_link(tmp_path):
    res = distill_setup(_toy(tmp_path)).res
    t = transfer(res.topology, {(0, 0): 200.0, (1, 1): 200.0})
    assert (t["time_s"], t["network_bytes"], t["hbm_bytes"], t["flows"]) == \
        (0.0, 0.0, 400.0, 0)
    t = transfer(res.topology, {(0, 1): 1e6, (1, 1): 5.0})
    assert (t["network_bytes"], t["hbm_bytes"], t["flows"]) == (1e6, 5.0, 1)
    assert t["time_s"] > 1e6 / 1e12 and t["max_received_bytes"] == 1e6 + 5.0


def test_colocated_step_is_student_plus_teacher_plus_loss(tmp_path):
    s = distill_setup(_toy(tmp_path))
    r = simulate_distill(s, student_step_s=1.0)
    t = r["time_s"]
    # 2 replicas x 2 sequences x 128 tokens; top-8 pairs of 6 B: 512 x 48 = 24,576 B,
    # all read from HBM (teacher TP 1 on the replica's own GPU)
    assert (r["tokens"], r["bytes"]["outputs_per_step"]) == (512, 24_576)
    assert (r["bytes"]["read_from_hbm"], r["bytes"]["over_network"], t["transfer"]) == \
        (24_576, 0, 0.0)
    # 2 teacher groups (TP 1 on 2 GPUs), 2 sequences each
    assert r["sequences_per_teacher_group"] == 2
    assert t["teacher_forward"] == pytest.approx(2 * sum(t["teacher_per_sequence"]
                                                         .values()), rel=1e-12)
    # the loss: 2 micro-batches of 128 tokens x 8 pairs x (6 + 12) B = 18,432 B each
    loss = memory_op("distill_loss", 128 * 8 * 18, 5 * 128 * 8)
    assert t["loss"] == pytest.approx(2 * s.res.compute.time_s(loss), rel=1e-12)
    assert t["step"] == pytest.approx(1.0 + t["teacher_forward"] + t["loss"], rel=1e-12)
    assert t["added"] == pytest.approx(t["teacher_forward"] + t["loss"], rel=1e-12)
    # memory: the toy teacher's weights (bf16) sit beside the student's peak
    m = r["memory"]
    assert m["checks"][0]["need_bytes"] == pytest.approx(
        m["student_peak_bytes"] + m["teacher_weights_bytes"] + 24_576 / 2)


def test_the_step_counts_the_distributed_topk(tmp_path):
    # teacher TP 2 on the 2 GPUs: each of the 4 sequences' all-gather is S = 2 ranks x
    # 128 tokens x 8 pairs x 6 B = 12,288 B, 49,152 B a step; one group computes all 4
    text = TOY.replace("k: 8", "k: 8\n  teacher_tp: 2")
    r = simulate_distill(distill_setup(_toy(tmp_path, text)), student_step_s=1.0)
    assert r["bytes"]["all_gather_per_step"] == 49_152
    assert r["sequences_per_teacher_group"] == 4
    assert r["time_s"]["teacher_per_sequence"]["topk_all_gather_s"] > 0
    # GPU j holds vocabulary half j: it keeps the pairs of its half for its own replica
    # and sends the other replica's: half the 24,576 B cross the PCIe switch
    assert r["bytes"]["over_network"] == r["bytes"]["read_from_hbm"] == 12_288


def test_separate_step_overlaps_the_teacher(tmp_path):
    text = TOY.replace("placement: colocated", "placement: separate\n  teacher_gpus: 2")
    s = distill_setup(_toy(tmp_path, text))
    slow = simulate_distill(s, student_step_s=10.0)["time_s"]
    # a student step longer than the teacher's pass hides it: only the loss is added
    assert slow["step"] == pytest.approx(10.0 + slow["loss"], rel=1e-12)
    fast = simulate_distill(s, student_step_s=0.0)["time_s"]
    # one that is shorter waits for the teacher's pass and the transfer
    assert fast["step"] == pytest.approx(fast["teacher_forward"] + fast["transfer"])
    assert fast["transfer"] > 0


@pytest.mark.parametrize("override, field", [
    ("distill.k=0", "distill.k"),
    ("distill.k=32001", "distill.k"),
    ("distill.teacher=no-such-model", "distill.teacher"),
    ("distill.teacher=qwen3-235b-a22b", "distill.teacher"),       # another vocabulary
    ("distill.outputs=probs", "distill.outputs"),
    ("distill.teacher_tp=3", "distill.teacher_tp"),
])
def test_bad_input_is_one_line(tmp_path, capsys, override, field):
    code = main(["distill", str(_toy(tmp_path)), "--no-files", "--set", override])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("moesim distill: error:") and field in err


def test_a_teacher_that_does_not_fit_is_refused(tmp_path, capsys):
    # Llama 3.1 405B's dims with the toy's vocabulary: 405 billion bf16 parameters over 2
    # GPUs are ~400 GB each, beyond an H100's 80 GB
    text = TOY.replace("{preset: toy, layers: 4}", "{preset: llama-3.1-405b, vocab: 32000}")
    assert main(["distill", str(_toy(tmp_path, text)), "--no-files"]) == 2
    err = capsys.readouterr().err
    assert "distill.placement" in err and "does not fit" in err
    assert len(err.strip().splitlines()) == 1


def test_the_command_prints_and_writes(tmp_path, capsys):
    assert main(["distill", str(_toy(tmp_path)), "-o", str(tmp_path / "o"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["outputs"], s["k"], s["bytes"]["outputs_per_step"]) == ("topk", 8, 24_576)
    assert s["step_time_s"] == pytest.approx(s["student_step_s"] + s["added_s"])
    assert (tmp_path / "o" / "summary.md").is_file()
