"""CPU-side traces of a recorded run: collectives, steps, ingest, replay into simulator
programs, validation against a simulation, noise and the overlay plot. See
:mod:`moesim.validation`."""
