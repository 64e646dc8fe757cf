"""The fast engine: an analytical lockstep model of a step for thousands of GPUs."""
