"""``moesim record --shape-sweep``: time the layer's expert GEMMs and memory-bound ops
over the row counts routing skew produces, in one process, under ``torch.profiler``.

Skew makes the hot expert's GEMMs many times taller than any in a uniform recording
(on the shipped study ~4060 rows against ~1050), and a fit of uniform recordings
extrapolates there. The sweep runs the rank's expert block of the recorded layer
(:func:`moesim.validation.recorder.moe_layer.local_experts`: regroup, SwiGLU, regroup back;
forward and backward) with ``R`` received rows for each of the rank's
``experts / world`` experts (so the GEMMs cycle through the rank's expert weights as
in the layer), for ``R`` on a geometric grid from 1 to every token copy of every rank
(``world · tokens · top_k``),
``repeats`` times each after one untraced warm-up pass, each pass inside a
``sweep/rows=R`` label. On CPU by default; with ``device="cuda"`` (``moesim record
--shape-sweep --backend nccl``) on the first GPU, profiled with CUDA activity too and
synchronized at the end of every pass, so that
:func:`moesim.validation.calibration.shape_fit.sweep_samples` reads each op's kernels' GPU time.
It writes

- ``shape_sweep.json.gz`` (or ``.json``): the Kineto trace (``record_shapes=True``);
  :func:`moesim.validation.calibration.shape_fit.sweep_samples` reads its GEMMs and memory-bound
  ops as ingest does;
- ``sweep.json``: ``{"format": "moesim-shape-sweep/1", "args", "rows", "torch_version",
  "host"}`` with the recorder's host facts (load average before and after, niceness,
  core, glibc tunables).

torch is imported here only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from moesim.errors import InputError
from moesim.outputs import make_dir
from moesim.validation.recorder.record import (
    KEEP_MEMORY_ENV,
    _environment,
    _filtered_stderr,
    _log,
    _quiet_the_rank,
    checked_outdir,
    host_info,
    import_torch,
)

SWEEP_FORMAT = "moesim-shape-sweep/1"
SWEEP_FILES = ("shape_sweep.json.gz", "shape_sweep.json", "sweep.json")


@dataclass(frozen=True)
class SweepConfig:
    outdir: str
    world: int = 2              # ranks of the layer the sweep stands for (sets the largest R)
    experts: int = 8            # experts of the layer; a rank holds experts / world of them
    hidden: int = 512
    ffn: int = 1024
    top_k: int = 2
    tokens: int = 2048          # tokens per rank per step
    points: int = 16            # grid points from 1 to world · tokens · top_k rows
    repeats: int = 5            # traced passes per point
    seed: int = 0
    gzip: bool = True
    pin: bool = False
    nice: int = 0
    keep_memory: bool = True
    device: str = "cpu"         # "cpu" or "cuda" (the first GPU)

    def check(self) -> None:
        src = "command line"
        for name in ("world", "experts", "hidden", "ffn", "top_k", "tokens", "repeats"):
            if getattr(self, name) < 1:
                raise InputError(src, "--" + name.replace("_", "-"), "a positive integer",
                                 getattr(self, name))
        if self.experts % self.world:
            raise InputError(src, "--experts", f"a positive multiple of --world {self.world}",
                             self.experts)
        if self.points < 2:
            raise InputError(src, "--points", "at least 2 grid points", self.points)
        if not -20 <= self.nice <= 19:
            raise InputError(src, "--nice", "a niceness increment in -20..19", self.nice)
        if self.device not in ("cpu", "cuda"):
            raise InputError(src, "device", "cpu or cuda", self.device)

    @property
    def max_rows(self) -> int:
        return self.world * self.tokens * self.top_k


def row_grid(max_rows: int, points: int) -> list[int]:
    """Distinct integer row counts, geometric from 1 to ``max_rows`` (both included)."""
    return sorted({int(round(x)) for x in np.geomspace(1, max_rows, points)})


def _sweep_worker(_: int, cfg: SweepConfig) -> None:
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from moesim.validation.recorder.moe_layer import SwiGLUExperts, local_experts

    quiet = _quiet_the_rank(0, cfg)   # uses cfg.nice and cfg.pin only
    quiet["malloc_env"] = {k: os.environ[k] for k in KEEP_MEMORY_ENV if k in os.environ}
    torch.set_num_threads(1)          # as each rank of moesim record
    torch.manual_seed(cfg.seed)
    cuda = cfg.device == "cuda"
    dev = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    n_local = cfg.experts // cfg.world
    experts = SwiGLUExperts(n_local, cfg.hidden, cfg.ffn).to(dev)
    gen = torch.Generator().manual_seed(cfg.seed * 1000)
    rows = row_grid(cfg.max_rows, cfg.points)
    inputs = {}
    for r in rows:
        # r rows for every local expert, from the sources in turn: the GEMMs cycle
        # through the rank's expert weights as in the layer (cache state)
        split = [r // cfg.world + (s < r % cfg.world) for s in range(cfg.world)]
        inputs[r] = (torch.randn(n_local * r, cfg.hidden, generator=gen).to(dev),
                     torch.tensor(split, dtype=torch.int64).view(cfg.world, 1).repeat(
                         1, n_local).to(dev),
                     torch.randn(n_local * r, cfg.hidden, generator=gen).to(dev))

    def one_pass(r: int) -> None:
        x0, recv_mat, gy = inputs[r]
        x = x0.clone().requires_grad_()          # stands for the dispatch's output
        y = local_experts(experts, x, recv_mat)
        y.backward(gy)
        for p in experts.parameters():           # as opt.zero_grad(set_to_none=True)
            p.grad = None
        if cuda:                                 # the pass's kernels end inside its label
            torch.cuda.synchronize()

    for r in rows:                               # warm-up, not traced
        one_pass(r)
    ext = ".json.gz" if cfg.gzip else ".json"
    out = Path(cfg.outdir) / f"shape_sweep{ext}"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _rep in range(cfg.repeats):
            for r in rows:
                with record_function(f"sweep/rows={r}"):
                    one_pass(r)
            _log(f"pass {_rep + 1}/{cfg.repeats} over {len(rows)} row counts done")
    prof.export_chrome_trace(str(out))
    (Path(cfg.outdir) / ".sweep_process.json").write_text(json.dumps(
        {"process": quiet, "rows": rows,
         "cuda_device": torch.cuda.get_device_name(0) if cuda else None}))


def _check_cuda() -> None:
    """One line, before anything is written, when no CUDA device is usable here."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise InputError("command line", "--backend", "gloo (nccl: a shape sweep on the GPU, "
                         "needs torch with CUDA and a CUDA device; none here)", "nccl")


def record_sweep(cfg: SweepConfig, force: bool = False) -> Path:
    """Run the sweep; returns the output directory. Refuses a non-empty ``cfg.outdir``
    unless ``force`` (then only the sweep's own files are replaced)."""
    cfg.check()
    outdir = checked_outdir(cfg.outdir, force)
    if cfg.device == "cuda":
        _check_cuda()
    torch, mp = import_torch()
    make_dir(outdir)
    for name in SWEEP_FILES:
        (outdir / name).unlink(missing_ok=True)
    load_before = host_info()["loadavg_1_5_15min"]
    _log(f"shape sweep: rows 1..{cfg.max_rows} on {cfg.points} points, {cfg.repeats} passes "
         f"-> {outdir}; load average {load_before}")
    env = KEEP_MEMORY_ENV if cfg.keep_memory else {}
    with _filtered_stderr(), _environment(env):
        # a fresh process: glibc reads its malloc tunables at start-up
        mp.spawn(_sweep_worker, args=(cfg,), nprocs=1, join=True)
    part = outdir / ".sweep_process.json"
    done = json.loads(part.read_text())
    part.unlink()
    host = host_info()
    host["loadavg_before_1_5_15min"] = load_before
    host["rank_processes"] = [done["process"]]
    host["malloc_env"] = env
    doc = {"format": SWEEP_FORMAT,
           "args": {k: v for k, v in asdict(cfg).items() if k != "outdir"},
           "rows": done["rows"], "torch_version": torch.__version__, "host": host,
           "dtype": "float32", "device": cfg.device}
    if done.get("cuda_device"):
        host["cuda_device"] = done["cuda_device"]
    (outdir / "sweep.json").write_text(json.dumps(doc, indent=1) + "\n")
    _log(f"wrote shape_sweep trace and sweep.json to {outdir}")
    return outdir
