"""Validation against real runs: record, ingest, calibrate, validate.

One subpackage per concept (torch is optional; only ``recorder`` imports it, and only
when called):

- ``recorder``     the torch recorder: an expert-parallel MoE layer (``moe_layer``), run on
                   N processes under ``torch.profiler`` (``record``), and the GEMM/memory
                   shape sweep (``sweep_record``); writes Kineto traces + ``routing.json``
- ``kineto``       the Kineto JSON format both trace kinds share: loading, complete events,
                   rank and world (``events``); FLOPs and bytes of an op from its recorded
                   shapes (``op_cost``)
- ``cpu``          CPU-side (host) traces of a recorded run: all-to-alls and their splits
                   (``collectives``), training steps (``steps``), parsing into
                   ``TraceStep`` data (``ingest``, table: ``ingest_report``), traced steps
                   → simulator programs (``replay``), measured vs simulated phases
                   (``validate``), run-to-run noise (``noise``), the overlay plot
                   (``overlay``), the recording host's facts (``host_facts``)
- ``gpu``          GPU kernels of a Kineto trace: kernel classes (``kernels``), kernels per
                   stream with their launching op (``trace``), busy/overlap/exposed
                   summaries (``summary``, tables: ``report``), a simulated DualPipe F&B
                   pair read as a trace (``pair``), per-layer phases against a scenario's
                   compute model (``validate``)
- ``calibration``  fitting models to traces: least squares on CPU traces (``calibrate``),
                   a device calibration from GPU kernels (``gpu_calibrate``), the shape
                   sweep's samples (``shape_fit``) and the with/without-sweep study
                   (``shape_study``); the fitted model and its file format are
                   ``moesim.compute.calibrated`` (with ``moesim.compute.shape_table``)
- ``runs``         a validation end to end (a CPU recording, a GPU trace against a
                   scenario): what ``moesim validate`` and a notebook call

Order of use (and of dependence): ``recorder`` writes traces; ``kineto`` reads them;
``cpu`` and ``gpu`` turn them into steps and kernels; ``calibration`` fits a model from
those; ``cpu.replay``/``cpu.validate`` and ``gpu.validate`` price the traced work with the
model and compare.
"""

from __future__ import annotations
