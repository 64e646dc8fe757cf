"""Serving: one prefill or decode step of an MoE model on the training machinery
(topology, routing, EP exchanges, op programs, executor, outputs). See docs/serving.md."""
