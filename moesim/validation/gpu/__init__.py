"""GPU kernels of a Kineto trace: classes, streams, busy/overlap/exposed summaries, and
comparison with a simulation. See :mod:`moesim.validation`."""
