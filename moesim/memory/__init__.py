"""Memory accounting: :mod:`moesim.memory.model` (bytes per rank by category, from the
model, the layout and the tokens) and :mod:`moesim.memory.report` (per-stage peaks over
the schedule's in-flight micro-batches, the table of ``moesim memory`` and of a run)."""
