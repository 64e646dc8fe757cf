"""Validation against real torch runs: record, ingest, calibrate.

Modules (torch is optional; only ``moe_layer`` and ``record`` import it, and
only when called):

- ``moe_layer``   an expert-parallel MoE layer in torch (all-to-all dispatch/combine)
- ``record``      runs it on N processes under ``torch.profiler``
- ``ingest``      parses Kineto (torch.profiler) JSON into :class:`TraceStep` data
- ``calibrate``   least-squares fit of compute and communication models
- ``calibration`` the fitted model (a ``ComputeModel``) and its file format
"""

from __future__ import annotations
