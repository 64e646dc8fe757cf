"""What-if sweeps: sweep files (:mod:`.spec`), Dask execution with streaming results
and resume (:mod:`.runner`), result frames (:mod:`.results`) and plots (:mod:`.plots`).

pandas is imported by :mod:`.results`; dask.distributed only when a sweep runs.
"""

from moesim.sweep.spec import Axis, Point, SweepSpec, expand, load_sweep, parse_sweep

__all__ = ["Axis", "Point", "SweepSpec", "expand", "load_sweep", "parse_sweep"]
