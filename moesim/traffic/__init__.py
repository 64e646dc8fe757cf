"""Runs over time above the step: a serving deployment under traffic (issue 23) and the
generation it lends to RL post-training (issue 24). The engines stay the single source of
step times; this layer asks them through :mod:`moesim.traffic.step_costs`."""
