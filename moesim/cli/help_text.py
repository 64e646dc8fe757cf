"""What ``moesim COMMAND --help`` says above the flags: plain text (no markup), naming
every mode of the command. A command not listed here gets its one-line help."""

from __future__ import annotations

import textwrap

_RULE = ("Output folder: -o DIR, or out/<scenario name> (out/<scenario name>--<overrides> "
         "with --set); --no-files only prints. It always gets summary.md and summary.json "
         "(which lists the folder's files as this run's own); a rerun of the same run "
         "replaces them, another folder's files need --force. A layout that does not fit "
         "in device memory is a warning on stderr and oom: true in summary.json; --strict "
         "makes it exit 2.")


def _files_rule(extra: str = "") -> str:
    return textwrap.fill(f"{_RULE} {extra}".strip(), 86)


#: what ``moesim --help`` says above the list of commands
TOP = ("Simulate GPU clusters training and serving mixture-of-experts models. "
       "'moesim COMMAND --help' names the command's modes and flags.")

DESCRIPTIONS: dict[str, str] = {
    "topology": """\
Describe a cluster topology, a YAML file or a preset: nodes, GPUs, links with their
bandwidth per direction and latency.

modes:
  moesim topology NAME              print the description (--json: as JSON)
  moesim topology NAME --draw F     also draw it into the picture F""",
    "flows": """\
Run point-to-point flows (a JSON list of id, src, dst, bytes, start_s) through the
network model of a topology; print each flow's finish time and mean rate.

modes:
  --model flow          max-min fair sharing of every link (default)
  --model analytical    each flow alone on its path, no contention""",
    "collective": """\
Simulate one collective on a topology; print its time and bandwidths (algbw, busbw).

modes (--op):
  all_reduce, all_gather, reduce_scatter, broadcast, send_recv, all_to_all,
  all_to_all_v      NCCL-style collectives of --bytes per rank (or a --matrix),
                    with the algorithm of --algo
  ep_dispatch, ep_combine
                    one MoE token exchange over the EP group with the DeepEP normal,
                    DeepEP low-latency or NCCL kernels (--kernel), routed by --routing
  dist_topk         the LM head's distributed top-k sampling (--vocab, --k, --batch)""",
    "run": f"""\
Simulate one training step of a scenario and write what users look at: summary.md,
summary.json, trace.json (Perfetto), timeline.png, experts.png, links.png and
stalls.csv. Prints the step time, tokens/s, MFU, the breakdown, expert load and
memory per GPU.

{_files_rule()}""",
    "serve": f"""\
Simulate a serving deployment: a scenario with a serve: section.

modes:
  one step          (no load: section) one prefill or decode step: step time, TTFT or
                    time per output token, tokens/s, the memory per GPU
  under load        (a load: section, or --set load....) requests arriving over time:
                    TTFT, TPOT and latency percentiles, throughput, goodput under --slo
  --find-capacity   under load: the largest arrival rate (requests/s) meeting --slo
  --check-surface N under load: the step-cost surface against N direct simulations

{_files_rule("One step also writes the files moesim run writes; under load, "
             "requests.csv, load.png and trace.json.")}""",
    "rl": f"""\
Simulate GRPO post-training steps: rollouts, scoring, training and weight sync, with
the trainer and the rollout engines colocated or disaggregated, synchronous or with
bounded staleness (rl.max_lag). Prints the step (steady state when the run has one,
else the fill-and-drain mean), the phases, the pools' utilization, and whether the
trainer and the rollout engines fit in device memory.

{_files_rule("It also gets details.json, trace.json (Perfetto) and gantt.png.")}""",
    "distill": """\
Simulate a student's training step with a teacher's forward pass (the scenario's
distill: section): the teacher colocated on the student's GPUs (in series with its
step) or on GPUs of its own (one step ahead), its outputs as full logits or the top k
through a distributed top-k over its TP group. Prints the step, the time distillation
adds (teacher forward, transfer, loss), the bytes moved and the memory per GPU. A
teacher or outputs that do not fit beside the student is one line, exit 2. Output
folder: -o DIR, or out/<scenario name>; --no-files only prints; it gets summary.md and
summary.json (docs/distillation.md).""",
    "train": """\
Simulate pre-training as a campaign over days: failures drawn per component from the
rates of a campaign file (default: the Llama 3 405B table, 466 interruptions in 54 days
on 16,384 H100s, scaled to the cluster), detection and restart, checkpoints (sync or
async, to storage or to peers' memory), hot spares, the failure domain, and the work
lost since the last checkpoint. The step time comes from one simulated step of the
scenario (or --step-s), the checkpoint size from its memory model. Prints the ETTR,
interruptions by cause against their expectation and the best checkpoint interval of a
sweep beside Young's and Daly's. The folder gets summary.md, summary.json and
timeline.png (docs/campaign.md).""",
    "memory": """\
Per-rank memory of a training scenario against device capacity, by pipeline stage:
weights, gradients, optimizer states, activations, token buffers, recompute workspace.

modes:
  moesim memory SCENARIO              one row per stage (and its most loaded rank),
                                      OOM flagged
  moesim memory SCENARIO --megatron   also stage 0 beside Megatron-LM's own estimate
  moesim memory --matmul M K N        every tensor of one matmul Y = X W, whole and
                                      per GPU (--dtype, --tp, --pp)""",
    "kernels": """\
One layer's kernels on one rank, as a profiler would show them: for each pass (fwd,
dgrad, wgrad) every kernel's shape, dtype, FLOPs, bytes, what priced it (a kernel
catalog row or the roofline) and its time. --pass picks one pass, --layer a layer.""",
    "layout": """\
The process groups of one rank as Megatron-Core builds them: attention TP, CP, DP and
PP, and the MoE layers' EP, ETP and EDP, each with its ranks and the nodes they sit on,
so you see which collectives cross the network. --rank picks the rank.""",
    "schedule": """\
A pipeline schedule in stage time: the step, the bubble and the activations alive per
rank, for gpipe, 1f1b, dualpipe or dualpipev with --pp ranks and --microbatches.
--order lists every rank's items; --plot draws them.""",
    "plot": """\
Redraw a picture from a run folder (written by moesim run or moesim serve).

modes:
  --what timeline   the timeline, zoomed to --ranks and --layers (default)
  --what experts    the expert loads""",
    "compare": """\
Compare the summaries of two runs (their folders or summary.json files), metric by
metric: step time, throughput, MFU, the breakdown, stalls, expert load, memory, OOM.""",
    "record": """\
Record a real torch MoE layer with torch.profiler (needs torch).

modes:
  moesim record OUTDIR                  --world processes run the layer; rank{r}.json.gz
                                        and routing.json
  moesim record OUTDIR --shape-sweep    time the layer's expert GEMMs and memory-bound
                                        ops over row counts in one process, for
                                        moesim calibrate --shape-sweep""",
    "ingest": """\
Read torch.profiler traces of an MoE layer (a folder of rank traces, or the files):
ops, phases and byte matrices per rank. A trace with GPU kernels is read as a GPU
trace (kernels per layer and phase).""",
    "calibrate": """\
Fit compute and communication models to recorded traces and write a calibration file.

modes:
  moesim calibrate TRACE_DIR... -o F                  from CPU recordings (moesim record)
  moesim calibrate TRACE_DIR... --shape-sweep DIR -o F  GEMM (and memory-bound) times
                                                      interpolated by shape
  moesim calibrate GPU_TRACE.json -o F                from one GPU trace (Kineto JSON)""",
    "validate": """\
Compare the simulator with recorded traces: measured against simulated time per rank.

modes:
  moesim validate TRACE_DIR --calibration F        CPU recordings, priced by the
                                                   calibration file
  moesim validate GPU_TRACE --scenario S           a GPU trace against the scenario's
                                                   per-layer kernel times (a DualPipe
                                                   scenario: one rank's F&B pair)
-o DIR writes validation.json and overlay.png.""",
    "sweep": """\
Run a what-if grid of scenarios (a sweep file: a scenario, the axes, seeds) on a local
Dask cluster or an existing one (--scheduler), then summarise and plot it.

Output folder: -o DIR, or out/sweeps/<sweep name>; --no-files only prints. It gets
summary.md and summary.json (counts, the points whose layout does not fit in device
memory, means per combination), results.parquet, means.csv, points.jsonl and plots.
Re-running the same sweep resumes; --plot-only redraws the plots. Points that do not
fit are counted in one warning; --strict makes them exit 2.""",
}
