"""Validation against real torch runs: record, ingest, calibrate, validate.

Modules (torch is optional; only ``moe_layer`` and ``record`` import it, and
only when called):

- ``moe_layer``     an expert-parallel MoE layer in torch (all-to-all dispatch/combine)
- ``record``        runs it on N processes under ``torch.profiler`` (optionally pinned and
                    at raised priority), writes Kineto traces + ``routing.json``
- ``kineto``        loads a Kineto JSON (gzip or not) into complete events; rank, world
- ``collectives``   finds torch.distributed all-to-alls and their split sizes in events
- ``steps``         training steps: ``ProfilerStep`` spans, or found from the all-to-alls
- ``op_cost``       FLOPs and bytes of a traced op from its recorded shapes
- ``gpu_kernels``   GPU kernel names → classes (GEMM, attention, NCCL, DeepEP, ...)
- ``gpu_trace``     GPU kernels of a Kineto trace, per stream, with their launching op
- ``gpu_summary``   busy time, overlap, exposed communication, phases of a GPU trace
- ``gpu_report``    the text tables of ``moesim ingest`` on a GPU trace
- ``gpu_calibrate`` a device calibration from a GPU trace's kernels
- ``gpu_validate``  a GPU trace's per-layer phases against a scenario's compute model
- ``gpu_pair``      a simulated DualPipe F&B pair read as a GPU trace of one is read
- ``ingest``        parses Kineto (torch.profiler) JSON into :class:`TraceStep` data
- ``ingest_report`` the text table of ``moesim ingest``
- ``calibrate``     least-squares fit of compute, communication and host-gap models
- ``calibration``   the fitted model (a ``ComputeModel``) and its file format
- ``replay``        traced steps → simulator op programs (pure; no trace durations)
- ``validate``      simulates each traced step; measured vs simulated phases, medians
                    over steps, relative errors
- ``noise``         run-to-run noise of two recordings of one configuration
- ``overlay``       plot of measured over simulated timelines on a matplotlib Axes
"""

from __future__ import annotations
