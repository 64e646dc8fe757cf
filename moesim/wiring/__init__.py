"""Wiring: a scenario file or name -> checked data (:mod:`moesim.scenario`) -> built
objects (:class:`~moesim.scenario.resolved.Resolved`) -> an engine (:mod:`moesim.engine`).

The layer above the engines that the CLI, notebooks, serving, RL, validation and sweeps
call, so each of them turns a scenario into runnable objects the same way.
"""

from moesim.wiring.resolve import load_cluster, resolve
from moesim.wiring.run import resolve_path, simulate

__all__ = ["load_cluster", "resolve", "resolve_path", "simulate"]
