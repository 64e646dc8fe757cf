"""moesim: a discrete-event simulator of GPU clusters training mixture-of-experts models.

Units are SI inside the package (seconds, bytes, FLOP, bytes/s). Conversions to
GB/s, µs and ms happen only at the edges (YAML input, reports).
"""

__version__ = "0.1.0"
