"""Op programs: the pure plan of a step that both engines run (no simpy here).

- :mod:`moesim.program.ops`: one op (compute, collective, send/recv) of a rank's program;
- :mod:`moesim.program.build`: a resolved scenario -> per-rank op programs and step plan;
- :mod:`moesim.program.grads`: data-parallel gradient buckets and ZeRO gathers;
- :mod:`moesim.program.overlap`: the EP all-to-all overlap rules on programs;
- :mod:`moesim.program.replicas`: identical replicas (representatives and mirrors).
"""
