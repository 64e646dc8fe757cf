"""The step engine: builds per-rank op streams from a scenario (pure) and runs them
on simpy with the network model and the collectives (``execute``)."""
