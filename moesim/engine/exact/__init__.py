"""The exact engine: simpy processes per rank stream over the flow network."""
