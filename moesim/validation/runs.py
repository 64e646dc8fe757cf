"""Validation runs end to end: what ``moesim calibrate``, ``moesim validate`` and a
notebook call.

- :func:`calibrate_recordings` / :func:`calibrate_gpu_trace`: a calibration document
  (``moesim calibrate -o``) fitted on CPU recordings or on one GPU trace, with an
  optional shape sweep;

- :func:`validate_recording`: a CPU recording (rank traces of one ``moesim record``) replayed
  with a calibration, measured against simulated per rank and phase;
- :func:`gpu_compute_model` and :func:`validate_gpu_trace`: one GPU Kineto trace against a
  resolved scenario (:func:`moesim.wiring.resolve`): the compute model it is priced with
  (the scenario's, a calibration's, or one fitted on the traced forward phases), then the
  per-layer phases, the simulated DualPipe F&B pair and the kernel classes compared.

    from moesim.scenario import load_scenario
    from moesim.validation.runs import gpu_compute_model, validate_gpu_trace
    from moesim.wiring import resolve
    res = resolve(load_scenario("deepseek-v3-fb-pair"))
    model, fit = gpu_compute_model(trace, res)
    doc, priced = validate_gpu_trace(trace, res, model)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moesim.compute.calibrated import load_calibration
from moesim.errors import InputError
from moesim.validation.calibration.calibrate import calibrate
from moesim.validation.calibration.gpu_calibrate import gpu_calibration
from moesim.validation.calibration.shape_fit import gpu_samples, shape_section, sweep_table
from moesim.validation.cpu.host_facts import warning_line
from moesim.validation.cpu.ingest import ingest
from moesim.validation.cpu.replay import outside_fitted_range
from moesim.validation.cpu.validate import validate
from moesim.validation.gpu.classes import compare as compare_classes
from moesim.validation.gpu.classes import pair_model, recompute_kernels
from moesim.validation.gpu.pair import measured_streams, simulate_pair
from moesim.validation.gpu.summary import summarize
from moesim.validation.gpu.validate import forward_fit, gpu_validate


def calibrate_recordings(trace_dirs: Sequence[str], backend: str, device: str,
                         shape_sweep: Sequence[str] = (), sweep_memory: bool = False) -> dict:
    """A calibration fitted on CPU recordings (one ``moesim record`` directory each) of
    ``backend`` (gloo or nccl) on ``device``; with ``shape_sweep`` (``moesim record
    --shape-sweep`` directories) its times interpolated by GEMM shape (and, with
    ``sweep_memory``, memory-bound op size)."""
    sets = [ingest([d]) for d in trace_dirs]
    table = sweep_table(list(shape_sweep), memory=sweep_memory) if shape_sweep else None
    return calibrate(sets, list(trace_dirs), backend=backend, device=device, shapes=table,
                     shape_sources=list(shape_sweep))


def calibrate_gpu_trace(trace: Any, device: str, shape_sweep: Sequence[str] = (),
                        sweep_memory: bool = False) -> dict:
    """A device calibration fitted on one GPU Kineto trace's kernels, anchored shape sweep
    included when ``shape_sweep`` gives one with a family of two sizes or more."""
    doc = gpu_calibration(trace, device)
    if shape_sweep:
        table = sweep_table(list(shape_sweep), memory=sweep_memory)
        if table:
            doc["shape_sweep"] = shape_section(table, *gpu_samples(trace), list(shape_sweep))
    return doc


def validate_recording(trace_dir: str, calibration: str, model: Any = None
                       ) -> tuple[Any, dict]:
    """A CPU recording replayed with ``calibration`` (a ``moesim calibrate -o`` file;
    ``model``: the file already loaded):
    the :class:`~moesim.validation.cpu.validate.Validation` and its document
    (``validation.json``: per rank and phase measured, simulated, error; the calibration,
    the host warning, the simulated ops outside the calibration's fitted range)."""
    model = load_calibration(calibration) if model is None else model
    ts = ingest([trace_dir])
    v = validate(ts, model, source=trace_dir)
    doc = v.to_json()
    doc["calibration"] = calibration
    doc["host_warning"] = warning_line(json.loads(Path(calibration).read_text()), trace_dir)
    doc["outside_fitted_range"] = outside_fitted_range(ts, model)
    return v, doc


def gpu_compute_model(trace: Any, res: Any, calibration: str | None = None,
                      fit_forward: bool = False, source: str = "trace",
                      summary: dict | None = None) -> tuple[Any, dict | None]:
    """The compute model a GPU trace is compared with: the scenario's, a calibration's,
    or (``fit_forward``) GEMM and attention rates fitted on the traced forward phases;
    and the fit's rates (None unless fitted). ``summary``: the trace's
    :func:`~moesim.validation.gpu.summary.summarize`, if already taken."""
    scn = res.scenario
    model = load_calibration(calibration) if calibration else res.compute
    if not fit_forward:
        return model, None
    if calibration:
        raise InputError("command line", "--fit-forward", "either --fit-forward or "
                         "--calibration", "both")
    tokens = scn.schedule.micro_batch_size * scn.schedule.seq_len
    model = forward_fit(summary or summarize(trace), res.model, tokens, scn.schedule.seq_len,
                        scn.parallel.ep, fallback=res.compute)
    if model is None:
        raise InputError(source, "phases", "attn(F)/mlp(F) annotations with GEMM and "
                         "attention kernels to fit on", "none")
    return model, {"gemm_flops_per_s": model.gemm_flops_per_s,
                   "attention_flops_per_s": model.attention_flops_per_s}


def validate_gpu_trace(trace: Any, res: Any, model: Any, about: dict | None = None,
                       summary: dict | None = None) -> tuple[dict, Any]:
    """One GPU trace against the resolved scenario ``res``, kernels priced by ``model``
    (:func:`gpu_compute_model`): per-layer phases, the simulated F&B pair of the traced
    rank, CUDA stream busy time and kernel classes (``validation.json``; ``about``: the
    fields naming the inputs, placed before the kernel classes). Returns the document and
    the model that priced the kernels."""
    scn = res.scenario
    tokens = scn.schedule.micro_batch_size * scn.schedule.seq_len
    g = summary or summarize(trace)
    sim = simulate_pair(res, model, g["rank"] if g["rank"] is not None else 0)
    # the scenario's own model prices kernels on the SMs an overlapped pair leaves them,
    # as the traced kernels ran (a calibration or a forward fit was measured there)
    priced = pair_model(res, model) if model is res.compute else model
    doc = gpu_validate(g, res.model, priced, tokens, scn.schedule.seq_len, scn.parallel.ep,
                       sim=sim, streams=measured_streams(trace),
                       recompute=recompute_kernels(res))
    doc.update(about or {})
    doc["kernel_classes"] = compare_classes(trace, res, priced)
    return doc, priced
