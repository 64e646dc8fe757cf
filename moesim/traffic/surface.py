"""Step costs from the engine, as a surface: a :class:`moesim.traffic.step_costs.StepCosts`
whose times are serving steps simulated at grid points and interpolated.

- decode: the step of ``batch`` requests per attention-DP rank at ``context`` tokens of KV
  cache each (``serve.phase: decode``), on a grid of batches x contexts;
- prefill: the step of ``prompts`` prompts of ``tokens / prompts`` tokens per
  attention-DP rank (``serve.phase: prefill``), on a grid of prompts x prompt lengths
  (with DeepEP's normal kernels where the scenario decodes with its low-latency ones).

Between grid points the time is bilinear (linear in each coordinate; beyond the grid,
the last two points extended). The step is not linear in the batch everywhere: a GEMM of
m tokens is priced by the kernel catalog from its smallest published row on and by the
roofline below it (``moesim.compute.catalog``: DeepGEMM's rows start at m = 64), so a
decode step jumps where a micro-batch reaches 64 tokens (DeepSeek-V3 decode: +7 % from
126 to 128 requests per GPU), and bends at the rows after. The default decode grid is
therefore refined where it is wrong (:meth:`EngineStepCosts._refine`): each batch
interval's midpoint is simulated at the smallest and the largest context and, when the
interpolation misses it by more than ``REFINE_RTOL``, it becomes a grid row and both
halves are checked in turn, down to adjacent batches the deployment runs (so a jump lies
between two rows, never inside an interval). The contexts are refined the same way at the
largest batch and the row nearest half of it: with two micro-batches the step is the
larger of one's compute and the other's all-to-all at every segment, so it bends where
the KV reads make attention outlast the exchange (DeepSeek-V3 decode at 256 requests per
GPU: 5.2 ms per 1K tokens of context below ~8K, 7.2 above; linear interpolation between
4K and 16K missed 8K by 3.3 %). An explicit ``batches`` grid is used as given. Every point is one step of the scenario's engine with
its routing, EP kernels and network (two micro-batches where the batch divides in two).
The grid's times are cached on disk under a key of the scenario's content (the
resolved scenario, the serve section, the grid, moesim's version and a digest of its
source and data files, :func:`code_hash`), so a second run reads them and a changed
moesim does not. :meth:`EngineStepCosts.check` simulates random points directly and returns
the worst relative error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

#: default grids (requests per attention-DP rank, tokens)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (128, 1024, 4096, 16384)
PROMPTS = (1, 2, 4, 8)
PROMPT_LENS = (128, 1024, 4096)
#: the default decode grid is refined where the interpolation misses a midpoint by more
#: than this (relative), with at most REFINE_MAX_ROWS rows and columns added
REFINE_RTOL = 0.005
REFINE_MAX_ROWS = 24


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """A digest of moesim's own source and data files, part of a surface's cache key: a
    cached surface was priced by this code (the version string alone stays the same
    across changes to the kernel prices)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if (p.suffix in (".py", ".yaml", ".yml", ".json", ".csv") and "__pycache__" not in p.parts
                and p.is_file()):
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("MOESIM_CACHE") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "moesim" if base else Path.home() / ".cache" / "moesim"


def _interp(xs: np.ndarray, x: float) -> tuple[int, float]:
    """Segment index i and weight w with x = (1-w)·xs[i] + w·xs[i+1] (extended)."""
    if len(xs) == 1:
        return 0, 0.0
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


def bilinear(xs, ys, z, x: float, y: float) -> float:
    i, u = _interp(xs, x)
    j, v = _interp(ys, y)
    if len(ys) == 1:
        return float(z[i, 0] * (1 - u) + (z[i + 1, 0] * u if len(xs) > 1 else 0.0))
    i1 = min(i + 1, len(xs) - 1)
    return float((1 - u) * ((1 - v) * z[i, j] + v * z[i, j + 1])
                 + u * ((1 - v) * z[i1, j] + v * z[i1, j + 1]))


def bilinear_many(xs, ys, z, x: float, y) -> np.ndarray:
    """:func:`bilinear` at ``(x, y_k)`` for every ``y_k`` of ``y``: the same floats (the
    same IEEE operations in the same order, elementwise)."""
    i, u = _interp(xs, x)
    y = np.asarray(y, dtype=float)
    if len(ys) == 1:
        return np.full(y.shape, bilinear(xs, ys, z, x, 0.0))
    j = np.clip(np.searchsorted(ys, y) - 1, 0, len(ys) - 2)
    v = (y - ys[j]) / (ys[j + 1] - ys[j])
    i1 = min(i + 1, len(xs) - 1)
    return ((1 - u) * ((1 - v) * z[i, j] + v * z[i, j + 1])
            + u * ((1 - v) * z[i1, j] + v * z[i1, j + 1]))


class EngineStepCosts:
    """StepCosts of a resolved serve scenario (``res``, ``cfg``) from its engine."""

    def __init__(self, res, cfg, *, batches=None, contexts=None, prompts=None,
                 prompt_lens=None, cache: Path | None | bool = True, progress=None,
                refine: float | None = None) -> None:
        self.res, self.cfg = res, cfg
        tp = cfg.tp
        self.refine = (REFINE_RTOL if batches is None else 0.0) if refine is None else refine
        self.batches = np.array(sorted({max(tp, b - b % tp) for b in (batches or BATCHES)}),
                                dtype=float)
        self.contexts = np.array(sorted(contexts or CONTEXTS), dtype=float)
        self.prompts = np.array(sorted({max(tp, b - b % tp) for b in (prompts or PROMPTS)}),
                                dtype=float)
        self.prompt_lens = np.array(sorted(prompt_lens or PROMPT_LENS), dtype=float)
        self.progress = progress
        self._steps = None
        self.sims = 0
        self.build_s = 0.0
        self.from_cache = False
        path = None
        if cache:
            d = cache if isinstance(cache, Path) else cache_dir()
            path = d / f"surface-{self.key()}.json"
            if path.is_file():
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    self.batches = np.array(data["batches"], dtype=float)
                    self.decode = np.array(data["decode"])
                    self.prefill = np.array(data["prefill"])
                    self.build_s = float(data.get("build_s", 0.0))
                    self.from_cache = True
                    return
                except (OSError, ValueError, KeyError):
                    pass
        t0 = time.process_time()
        self.decode = np.array([[self.direct_decode(b, c) for c in self.contexts]
                                for b in self.batches])
        if self.refine > 0:
            self._refine()
        self.prefill = np.array([[self.direct_prefill(p, L) for L in self.prompt_lens]
                                 for p in self.prompts])
        self.build_s = time.process_time() - t0
        if path is not None:
            try:
                from moesim.outputs import write_text
                path.parent.mkdir(parents=True, exist_ok=True)
                write_text(path, json.dumps({"batches": self.batches.tolist(),
                                             "decode": self.decode.tolist(),
                                             "prefill": self.prefill.tolist(),
                                             "build_s": self.build_s}), force=True)
            except OSError:
                pass                # a cache that cannot be written is only slower

    # ------------------------------------------------------------ the key
    def key(self) -> str:
        from moesim import __version__
        scn = self.res.scenario.to_dict()
        scn.pop("source", None)
        scn.pop("load", None)
        blob = json.dumps({"scenario": scn, "serve": dataclasses.asdict(self.cfg),
                           "grid": [self.batches.tolist(), self.contexts.tolist(),
                                    self.prompts.tolist(), self.prompt_lens.tolist()],
                           "refine": self.refine,
                           "version": __version__, "code": code_hash()},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def _refine(self) -> None:
        """Add decode rows (batches) where linear interpolation between two rows misses
        their midpoint (a batch the deployment runs: a multiple of tp x micro-batches) by
        more than ``self.refine`` at the smallest or the largest context, then columns
        (contexts) where it misses a context midpoint at the largest batch or the row
        nearest half of it; each added line's halves are checked in turn (at most
        ``REFINE_MAX_ROWS`` lines in all)."""
        unit = self.cfg.tp * self.cfg.microbatches
        left = [REFINE_MAX_ROWS]
        ends = (0, len(self.contexts) - 1)
        self.batches, self.decode = self._refine_axis(
            self.batches, self.contexts, self.decode, unit, ends,
            lambda b, c: self.direct_decode(b, c), left)
        top = len(self.batches) - 1
        half = int(np.argmin(np.abs(self.batches - self.batches[-1] / 2)))
        self.contexts, cols = self._refine_axis(
            self.contexts, self.batches, self.decode.T, 1, tuple(sorted({half, top})),
            lambda c, b: self.direct_decode(b, c), left)
        self.decode = cols.T

    def _refine_axis(self, xs, ys, z, unit: int, probes: tuple, sim, left: list):
        """Lines of ``z`` (one per x in ``xs``, over ``ys``) refined along x: the midpoint
        of each x interval, rounded down to ``unit``, simulated at the ``probes`` (indices
        of ``ys``; ``sim(x, y)``) and added as a line when interpolation misses it by
        more than ``self.refine``. ``left[0]``: lines that may still be added."""
        lines = {float(x): list(r) for x, r in zip(xs, z, strict=True)}
        todo = list(zip(xs[:-1].tolist(), xs[1:].tolist(), strict=True))
        while todo and left[0] > 0:
            lo, hi = todo.pop(0)
            mid = float((lo + hi) // 2 // unit * unit)
            if not lo < mid < hi:
                continue
            got = {j: sim(mid, ys[j]) for j in probes}
            w = (mid - lo) / (hi - lo)
            miss = max(abs((1 - w) * lines[lo][j] + w * lines[hi][j] - d) / d
                       for j, d in got.items())
            if miss <= self.refine:
                continue
            lines[mid] = [got[j] if j in got else sim(mid, y) for j, y in enumerate(ys)]
            left[0] -= 1
            todo += [(lo, mid), (mid, hi)]
        out = np.array(sorted(lines))
        return out, np.array([lines[x] for x in out])

    # ------------------------------------------------------------ direct simulation
    def _step(self, **kw) -> float:
        if self._steps is None:
            from moesim.serve.steps import ServeSteps
            self._steps = ServeSteps(self.res, self.cfg)     # kept across the points
        self.sims += 1
        if self.progress:
            self.progress(kw)
        return self._steps.step_s(**kw)

    def direct_decode(self, batch: float, context: float) -> float:
        b = max(1, int(round(batch)) // self.cfg.tp)
        return self._step(phase="decode", batch_per_gpu=b, context=max(1, int(round(context))))

    def direct_prefill(self, prompts: float, prompt_len: float) -> float:
        p = max(1, int(round(prompts)) // self.cfg.tp)
        return self._step(phase="prefill", batch_per_gpu=p, prompt=max(1, int(round(prompt_len))))

    # ------------------------------------------------------------ StepCosts
    def decode_s(self, batch: int, context: float) -> float:
        if batch <= 0:
            return 0.0
        return max(0.0, bilinear(self.batches, self.contexts, self.decode, batch, context))

    def decode_s_many(self, batch: int, contexts) -> np.ndarray:
        """``decode_s(batch, c)`` for every ``c`` of ``contexts``, vectorised (the same
        floats: the serving loop's skipped runs price their steps with it)."""
        c = np.asarray(contexts, dtype=float)
        if batch <= 0:
            return np.zeros(c.shape)
        return np.maximum(0.0, bilinear_many(self.batches, self.contexts, self.decode,
                                             batch, c))

    def prefill_s(self, tokens: int, prompts: int) -> float:
        if prompts <= 0:
            return max(0.0, bilinear(self.prompts, self.prompt_lens, self.prefill, 0.0,
                                     float(self.prompt_lens[0])))
        return max(0.0, bilinear(self.prompts, self.prompt_lens, self.prefill, prompts,
                                 tokens / prompts))

    def check(self, points: int = 6, seed: int = 0) -> dict:
        """Random points inside the grid, simulated directly: the worst relative error of
        the surface (decode and prefill)."""
        rng = np.random.default_rng(seed)
        rows = []
        # batches the deployment runs as its grid points do: a multiple of tp, and of
        # the two micro-batches when it has them (an odd batch runs as one micro-batch)
        unit = self.cfg.tp * self.cfg.microbatches
        for _ in range(points):
            b = float(rng.integers(self.batches[0], self.batches[-1] + 1))
            b = max(unit, b - b % unit)
            c = float(rng.integers(self.contexts[0], self.contexts[-1] + 1))
            d = self.direct_decode(b, c)
            rows.append(("decode", b, c, self.decode_s(int(b), c), d))
            p = float(rng.integers(self.prompts[0], self.prompts[-1] + 1))
            p = max(unit, p - p % unit)
            L = float(rng.integers(self.prompt_lens[0], self.prompt_lens[-1] + 1))
            rows.append(("prefill", p, L, self.prefill_s(int(p * L), int(p)),
                         self.direct_prefill(p, L)))
        errs = [abs(s - d) / d for _, _, _, s, d in rows if d > 0]
        worst = max(range(len(rows)), key=lambda i: abs(rows[i][3] - rows[i][4]) /
                    max(rows[i][4], 1e-30))
        return {"points": [{"phase": ph, "x": x, "y": y, "surface_s": s, "direct_s": d}
                           for ph, x, y, s, d in rows],
                "worst_error": max(errs, default=0.0), "worst": rows[worst][:3]}
