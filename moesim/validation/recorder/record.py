"""Record a real expert-parallel MoE layer under ``torch.profiler`` on N processes.

``record(cfg)`` spawns ``cfg.world`` processes (gloo on CPU, nccl when CUDA is
present), trains the layer of :mod:`moesim.validation.recorder.moe_layer` for ``cfg.steps``
steps, and profiles the steps after ``cfg.warmup`` with a ``torch.profiler.schedule``;
each profiled step appears as a ``ProfilerStep#N`` span. It writes

- ``rank{r}.json.gz`` (or ``.json``): the Kineto trace of rank r;
- ``routing.json``: tokens per expert per step and rank, the arguments, the torch
  version and the host CPU.

torch is imported here only; the rest of moesim runs without it.

Host memory. By default (``keep_memory``) the ranks start with glibc malloc told to
keep freed memory in the process (``KEEP_MEMORY_ENV``: no ``mmap``-served blocks, no
trimming of the heap). Otherwise every step hands its large buffers back to the
kernel and faults them in again on first touch; on the recording VM that cost up to
~22 ms on one 8 MB elementwise op (about 10 µs per 4 KiB page), landing on different
ops and ranks from step to step depending on the heap's layout (measured: in one
hot-skew recording rank 1's ``returned * w`` took 1.1, 8.6 or 23 ms in different
steps; with these settings 0.9-6 ms). A GPU run has no such cost in steady state:
PyTorch's CUDA caching allocator reuses freed blocks. ``--release-memory`` turns it
off. Not removed: single elementwise ops on buffers of tens of MB still take
20-40 ms now and then (page-fault-like; seen in a recording with hidden 768, FFN
1536). This VM's host runs a DAMON ``pageout`` scheme (/sys/kernel/mm/damon: regions
accessed in at most 1 of 10 samples per 5 s aggregation, for 60 s, are paged out),
which may be why; ``mlockall`` was tried against it and made things worse (each heap
extension was faulted in at once: 0.3-0.8 s stalls), so it is not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from moesim.errors import InputError
from moesim.outputs import check_dir_target, make_dir

#: glibc malloc tunables for the ranks (read by glibc at process start; spawned
#: workers inherit them, mallopt(3)): no block is served by mmap (M_MMAP_MAX 0; a
#: threshold alone stops at 32 MiB, glibc's maximum on 64-bit), the heap is never
#: trimmed, and it grows 256 MiB at a time. Like a caching allocator, memory freed in
#: one step is reused in the next without page faults.
KEEP_MEMORY_ENV = {"MALLOC_MMAP_MAX_": "0",
                   "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
                   "MALLOC_TRIM_THRESHOLD_": str(2**40),
                   "MALLOC_TOP_PAD_": str(256 * 2**20)}


@dataclass(frozen=True)
class RecordConfig:
    outdir: str
    world: int = 2
    skew: str = "uniform"
    zipf_s: float = 1.2
    hot_fraction: float = 0.5
    hidden: int = 512
    ffn: int = 1024
    experts: int = 8
    top_k: int = 2
    tokens: int = 2048          # tokens per rank per step
    steps: int = 6              # total training steps
    warmup: int = 2             # steps before profiling (not in the trace)
    seed: int = 0
    backend: str = "gloo"
    gzip: bool = True
    lr: float = 1e-3
    pin: bool = False           # pin rank r to CPU core r (mod the cores this process may use)
    nice: int = 0               # niceness increment for each rank (negative needs root)
    keep_memory: bool = True    # glibc keeps freed memory (KEEP_MEMORY_ENV), as a caching allocator

    def check(self) -> None:
        src = "command line"
        if self.world < 1:
            raise InputError(src, "--world", "a positive number of processes", self.world)
        if self.skew not in ("uniform", "zipf", "hot"):
            raise InputError(src, "--skew", "uniform, zipf or hot", self.skew)
        if self.experts < 1 or self.experts % self.world:
            raise InputError(src, "--experts", f"a positive multiple of --world {self.world}",
                             self.experts)
        if not 1 <= self.top_k <= self.experts:
            raise InputError(src, "--top-k", f"between 1 and --experts {self.experts}", self.top_k)
        for name in ("hidden", "ffn", "tokens"):
            if getattr(self, name) < 1:
                raise InputError(src, f"--{name}", "a positive integer", getattr(self, name))
        if self.warmup < 0 or self.steps <= self.warmup:
            raise InputError(src, "--steps", f"more than --warmup {self.warmup}", self.steps)
        if not 0.0 < self.hot_fraction < 1.0:
            raise InputError(src, "--hot-fraction", "a fraction in (0, 1)", self.hot_fraction)
        if self.backend not in ("gloo", "nccl"):
            raise InputError(src, "--backend", "gloo or nccl", self.backend)
        if not -20 <= self.nice <= 19:
            raise InputError(src, "--nice", "a niceness increment in -20..19", self.nice)


def host_info() -> dict:
    """CPU model and core count of this host (for the provenance record)."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {"cpu_model": model, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "loadavg_1_5_15min": load}


def _quiet_the_rank(rank: int, cfg: RecordConfig) -> dict:
    """Apply ``cfg.nice`` and ``cfg.pin`` to this process (one rank); returns what was
    actually applied.

    Linux with autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``)
    shares the CPU fairly between *sessions* first, so a niceness only ranks
    processes within one session. With ``nice`` set, the rank therefore starts its
    own session (``setsid``) and gives that session's autogroup the niceness too; a
    lowered niceness needs root. ``pin`` binds the rank to one core of those this
    process may use (rank r → the r-th, modulo their number)."""
    done: dict = {}
    if cfg.nice:
        try:
            os.setsid()
            Path("/proc/self/autogroup").write_text(str(cfg.nice))
            done["autogroup"] = Path("/proc/self/autogroup").read_text().strip()
        except OSError as err:
            done["autogroup_error"] = str(err)
        try:
            done["nice"] = os.nice(cfg.nice)
        except OSError as err:
            done["nice_error"] = str(err)
    if cfg.pin and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        core = cores[rank % len(cores)]
        os.sched_setaffinity(0, {core})
        done["core"] = core
    return done


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """Set environment variables for processes started inside the block."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log(msg: str) -> None:
    print(f"moesim record: {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _filtered_stderr(drop: tuple[str, ...] = ("USDT:",)):
    """Route fd 2 (inherited by spawned workers) through a pipe, dropping the lines
    torch's profiler prints on start/stop (``USDT: ... profiler_start``)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (embedded use): leave it alone
        yield
        return
    r, w = os.pipe()
    os.dup2(w, 2)
    os.close(w)

    def pump() -> None:
        with os.fdopen(r, "rb") as src:
            for line in src:
                if not line.startswith(tuple(d.encode() for d in drop)):
                    os.write(saved, line)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)   # closes our last copy of the pipe's write end
        t.join(timeout=10)
        os.close(saved)


def _worker(rank: int, cfg: RecordConfig, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from moesim.validation.recorder.moe_layer import ExpertParallelMoE, SkewSpec

    quiet = _quiet_the_rank(rank, cfg)
    # the glibc tunables this process started with (read by glibc at start-up)
    quiet["malloc_env"] = {k: os.environ[k] for k in KEEP_MEMORY_ENV if k in os.environ}
    torch.set_num_threads(1)  # two ranks on two cores: stable timings
    cuda = cfg.backend == "nccl"
    dist.init_process_group(cfg.backend, init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=cfg.world)
    device = torch.device(f"cuda:{rank % max(torch.cuda.device_count(), 1)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(cfg.seed)  # same weights on every rank for the router
    skew = SkewSpec(cfg.skew, cfg.zipf_s, cfg.hot_fraction)
    layer = ExpertParallelMoE(cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k, cfg.world, rank,
                              skew).to(device)
    opt = torch.optim.SGD(layer.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    counts: list[list[int]] = []
    ext = ".json.gz" if cfg.gzip else ".json"
    out = Path(cfg.outdir) / f"rank{rank}{ext}"
    sched = schedule(wait=0, warmup=cfg.warmup, active=cfg.steps - cfg.warmup, repeat=1)
    with profile(activities=activities, schedule=sched, record_shapes=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for step in range(cfg.steps):
            # the layer input needs a gradient (it is the previous layer's output),
            # so backward runs the dispatch-grad all-to-all too
            x = torch.randn(cfg.tokens, cfg.hidden, generator=gen).to(device).requires_grad_()
            with record_function("moe/forward"):
                y = layer(x)
                loss = (y.float() ** 2).mean()
            with record_function("moe/backward"):
                loss.backward()
            with record_function("moe/optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            assert layer.last_counts is not None
            counts.append([int(c) for c in layer.last_counts.tolist()])
            prof.step()
            if rank == 0:
                _log(f"step {step + 1}/{cfg.steps} done"
                     + (" (warm-up, not traced)" if step < cfg.warmup else ""))
    dist.barrier()
    dist.destroy_process_group()
    part = Path(cfg.outdir) / f".routing{rank}.json"
    part.write_text(json.dumps({"counts": counts, "process": quiet}))


def checked_outdir(path, force: bool) -> Path:
    """A recording's output folder: a new or empty directory (or ``force``), writable."""
    outdir = check_dir_target(path, "OUTDIR")  # a file, under a file, no permission
    if outdir.exists() and not outdir.is_dir():
        raise InputError(str(outdir), "OUTDIR", "a directory (or a path that does not exist)",
                         "a file")
    if outdir.is_dir() and any(outdir.iterdir()) and not force:
        raise InputError(str(outdir), "OUTDIR", "an empty or new directory (or --force)",
                         "a non-empty directory")
    return outdir


def import_torch():
    """``(torch, torch.multiprocessing)``, or one line saying how to install it."""
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise InputError("command line", "record", "torch installed (pip install moesim[torch])",
                         str(err)) from err
    return torch, mp


def record(cfg: RecordConfig, force: bool = False) -> Path:
    """Run the recording; returns the output directory. Refuses a non-empty
    ``cfg.outdir`` unless ``force`` (then only our own file names are replaced)."""
    cfg.check()
    outdir = checked_outdir(cfg.outdir, force)
    torch, mp = import_torch()
    if cfg.backend == "nccl" and not torch.cuda.is_available():
        raise InputError("command line", "--backend", "gloo (nccl needs CUDA)", cfg.backend)
    make_dir(outdir)
    for old in [*outdir.glob("rank*.json"), *outdir.glob("rank*.json.gz")]:
        old.unlink()
    load_before = host_info()["loadavg_1_5_15min"]
    _log(f"{cfg.world} ranks, {cfg.backend}, skew {cfg.skew}, {cfg.steps} steps "
         f"({cfg.warmup} warm-up) -> {outdir}; load average {load_before}")
    env = KEEP_MEMORY_ENV if cfg.keep_memory else {}
    with _filtered_stderr(), _environment(env):
        mp.spawn(_worker, args=(cfg, _free_port()), nprocs=cfg.world, join=True)
    per_rank, processes = [], []
    for r in range(cfg.world):
        part = outdir / f".routing{r}.json"
        doc = json.loads(part.read_text())
        per_rank.append(doc["counts"])
        processes.append(doc["process"])
        part.unlink()
    steps = []
    for s in range(cfg.steps):
        steps.append({
            "step": s,
            "traced": s >= cfg.warmup,
            "profiler_step": s,  # ProfilerStep#N numbering starts at 0 with the first step
            "tokens_per_expert_by_rank": [per_rank[r][s] for r in range(cfg.world)],
        })
    host = host_info()
    host["loadavg_before_1_5_15min"] = load_before
    host["rank_processes"] = processes   # niceness / core each rank actually ran with
    host["malloc_env"] = env             # glibc tunables the ranks started with
    if cfg.backend == "nccl":            # the GPU the study calibrates (moesim calibrate)
        host["cuda_device"] = torch.cuda.get_device_name(0)
    routing = {
        "format": "moesim-routing/1",
        "args": {k: v for k, v in asdict(cfg).items() if k != "outdir"},
        "torch_version": torch.__version__,
        "host": host,
        "dtype": "float32",
        "steps": steps,
    }
    (outdir / "routing.json").write_text(json.dumps(routing, indent=1) + "\n")
    _log(f"wrote {cfg.world} traces and routing.json to {outdir}")
    return outdir
