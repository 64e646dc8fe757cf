"""Memoized kernel-list durations, shared by the exact builder and the fast path."""

from __future__ import annotations

from moesim.compute.base import ComputeModel, Kernel


class Timer:
    """Memoized kernel-list durations (identical layers cost the same); the kernel lists
    are kept by key (:meth:`kernels_for`) for the ops that carry them."""

    def __init__(self, model: ComputeModel) -> None:
        self.model = model
        self.cache: dict[tuple, tuple[float, float]] = {}
        self.kernels: dict[tuple, tuple[Kernel, ...]] = {}

    def __call__(self, key: tuple, make) -> tuple[float, float]:
        hit = self.cache.get(key)
        if hit is None:
            ks: list[Kernel] = make()
            self.kernels[key] = tuple(ks)
            hit = self.cache[key] = (sum(self.model.time_s(k) for k in ks),
                                     sum(k.flops for k in ks))
        return hit

    def kernels_for(self, key: tuple) -> tuple[Kernel, ...]:
        """The kernels priced under ``key`` (after a call with it)."""
        return self.kernels.get(key, ())
