"""moesim.gating.memo.Memo: made once per key, frozen, emptied at its size."""

import numpy as np
import pytest

from moesim.gating.memo import Memo


def test_made_once_per_key_and_frozen():
    calls = []
    memo = Memo(4)

    def make():
        calls.append(1)
        return np.arange(3), (np.ones(2), None)

    a = memo.get("k", make)
    b = memo.get("k", make)
    assert a is b and len(calls) == 1
    assert not a[0].flags.writeable and not a[1][0].flags.writeable
    with pytest.raises(ValueError):
        a[0][0] = 7


def test_emptied_at_its_size_and_none_is_kept():
    memo = Memo(2)
    made = []
    for key in ("a", "b"):
        memo.get(key, lambda key=key: made.append(key))      # None values are kept
    assert len(memo) == 2 and made == ["a", "b"]
    memo.get("a", lambda: made.append("again"))
    assert made == ["a", "b"]                                  # a hit, None included
    memo.get("c", lambda: made.append("c"))                    # full: emptied, then c
    assert len(memo) == 1
    memo.get("a", lambda: made.append("a2"))
    assert made == ["a", "b", "c", "a2"]


def test_a_failing_make_stores_nothing():
    memo = Memo(8)

    def bad():
        raise KeyError("no")

    with pytest.raises(KeyError):
        memo.get("x", bad)
    assert len(memo) == 0
    assert memo.get("x", lambda: 5) == 5
