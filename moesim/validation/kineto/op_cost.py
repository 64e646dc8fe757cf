"""FLOPs and bytes of one traced op from its recorded shapes (``record_shapes=True``):
a matmul's (batch, m, k, n), a memory-bound op's bytes read and written.

Used by CPU-op ingest (:mod:`moesim.validation.cpu.ingest`) and by GPU-kernel ingest
(:mod:`moesim.validation.gpu.trace`), where a kernel takes the shapes of the op that
launched it.
"""

from __future__ import annotations

import numpy as np

from moesim.validation.kineto.events import DTYPE_BYTES, Event


def gemm_dims(ev: Event) -> tuple[int, int, int, int] | None:
    """(batch, m, k, n) of a matmul from its Input Dims."""
    d = [x for x in ev.dims if isinstance(x, list)]
    try:
        if ev.name == "aten::addmm":
            (m, k), (_, n) = d[1], d[2]
            return 1, m, k, n
        if ev.name == "aten::baddbmm":
            (b, m, k), (_, _, n) = d[1], d[2]
            return b, m, k, n
        if ev.name == "aten::linear":
            *lead, k = d[0]
            n = d[1][0]
            return 1, int(np.prod(lead)) if lead else 1, k, n
        a, b = d[0], d[1]
        if len(a) == 3 and len(b) == 3:
            return a[0], a[1], a[2], b[2]
        *lead, k = a
        return 1, int(np.prod(lead)) if lead else 1, k, b[-1]
    except (IndexError, ValueError, TypeError):
        return None


#: ops whose output has one row per index entry: (input position, index position)
GATHERS = {"aten::index_select": (0, 2), "aten::embedding": (0, 1)}
#: ops that only write their first argument (it is not read)
WRITE_ONLY = {"aten::fill_", "aten::zero_", "aten::copy_"}


def _distinct(dims: list, strides: object) -> float:
    """Elements a tensor argument really holds: a dimension with stride 0 (an
    ``expand``ed view) repeats the same memory, so it does not multiply the count."""
    if isinstance(strides, list) and len(strides) == len(dims):
        return float(np.prod([d for d, s in zip(dims, strides, strict=True) if s != 0]))
    return float(np.prod(dims))


def tensor_bytes(ev: Event, list_elem_bytes: int = 4) -> float:
    """Estimated bytes moved by a memory-bound op, from its recorded shapes:

    - every tensor argument is read once, counting only the memory it holds (a
      stride-0 dimension of an expanded view is read once, not per index);
    - an in-place op (``name_``) writes its first argument again; an op in
      ``WRITE_ONLY`` (``fill_``, ``zero_``, ``copy_`` into it) only writes it;
    - a gather (``GATHERS``) writes index-length rows of its input's width;
    - any other op writes an output as large as its largest argument (elementwise);
    - a ``TensorList`` argument (``aten::cat``/``stack``) counts every listed tensor,
      read and written once; the trace gives no element type for it:
      ``list_elem_bytes`` stands for it (4, float32, unless the caller knows better).
    """
    sizes = []
    strides = ev.strides
    for i, (dims, typ) in enumerate(zip(ev.dims, ev.types, strict=False)):
        if not isinstance(dims, list) or not dims:
            continue
        if typ == "TensorList" and all(isinstance(d, list) for d in dims):
            listed = sum(float(np.prod(d)) for d in dims if d) * list_elem_bytes
            return 2.0 * listed
        if typ in DTYPE_BYTES and all(isinstance(d, int) for d in dims):
            st = strides[i] if i < len(strides) else None
            sizes.append(_distinct(dims, st) * DTYPE_BYTES[typ])
        elif i == 0:
            sizes.append(0.0)   # keep position 0 meaning "the first argument"
    if not any(sizes):
        return 0.0
    if ev.name in WRITE_ONLY:
        return sum(sizes)       # the first argument written, the rest read
    if ev.name.endswith("_"):
        return sum(sizes) + sizes[0]
    gather = GATHERS.get(ev.name)
    if gather is not None:
        try:
            src, idx = ev.dims[gather[0]], ev.dims[gather[1]]
            row = float(np.prod(src[1:])) * DTYPE_BYTES[ev.types[gather[0]]]
            return sum(sizes) + float(np.prod(idx)) * row
        except (IndexError, KeyError, TypeError, ValueError):
            pass
    return sum(sizes) + max(sizes)
