"""Engines: how simulated time advances over the op programs of a step.

- :mod:`moesim.engine.api`: the one interface (``simulate``) and the registry of engines;
- :mod:`moesim.engine.exact`: simpy, every flow on the max-min network;
- :mod:`moesim.engine.fast`: the analytical lockstep path for thousands of GPUs;
- :mod:`moesim.engine.breakdown`, :mod:`moesim.engine.summary`: what both report.
- :mod:`moesim.engine.collector`: Python's cyclic garbage collector paused during a step.
"""
