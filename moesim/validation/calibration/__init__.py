"""Calibration: compute, communication and host-gap models fitted to traces (CPU or GPU),
the calibration file, and the shape sweep. See :mod:`moesim.validation`."""
