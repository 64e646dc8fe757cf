"""Mirrored traffic for identical replicas on the exact engine.

With ``engine.replicas: identical`` only one representative per replica class runs its
op program (:mod:`moesim.program.replicas`); this proxy puts the mirrors' flows on the
network as well, so replicas contend for shared links as in the full run.
"""

from __future__ import annotations


class MirroredNetwork:
    """A network model proxy that puts the mirrors' traffic on the network.

    A flow started for a representative is started again, at the same instant and
    with the same bytes, between the mirrors of its endpoints (one copy per replica),
    unless its ``tag`` is in :attr:`full_keys` (collectives whose group holds the
    mirrors themselves, run in full by the communicator). The event returned is the
    representative's; the copies only load the links as the real replicas would, so
    contention between replicas (shared NICs, leaves, spines) is kept, by symmetry
    exactly. Everything else is delegated to the wrapped model."""

    #: no ``send`` (it would reach the wrapped model's through ``__getattr__`` and start
    #: no copies): callers that look for it (the communicator) use ``transfer``
    send = None

    def __init__(self, network, gpu_mirrors: dict[str, tuple[str, ...]]) -> None:
        self._net = network
        self._gm = gpu_mirrors
        self.full_keys: set = set()
        self.n_mirrored = 0     # flows started for mirrors

    def __getattr__(self, name: str):
        return getattr(self._net, name)

    def _copies(self, flows) -> list[list[tuple]]:
        out: list[list[tuple]] = []
        for f in flows:
            ms, md = self._gm.get(f[0]), self._gm.get(f[1])
            if not ms or not md:
                continue
            for e, (s, d) in enumerate(zip(ms, md, strict=True)):
                if e == len(out):
                    out.append([])
                out[e].append((s, d, *f[2:]))
        return out

    def transfer(self, src: str, dst: str, nbytes: float, key: int = 0, tag=None):
        return self.transfer_many([(src, dst, nbytes)], key=key, tag=tag)

    def transfer_many(self, flows, key: int = 0, tag=None, **kw):
        ev = self._net.transfer_many(flows, key=key, tag=tag, **kw)
        if tag is None or tag not in self.full_keys:
            for copy in self._copies(flows):
                self.n_mirrored += len(copy)
                self._net.transfer_many(copy, key=key, tag=tag, **kw)
        return ev
