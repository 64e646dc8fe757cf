"""Parallel layout: :mod:`moesim.layout.mesh` maps ranks to (tp, pp, dp, ep, edp)
coordinates and process groups in Megatron-Core's order."""
