"""Spans and results of a simulated step, and what is made from them."""
