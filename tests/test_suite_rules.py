"""Rules for the suite itself (issue 20, item 5): no test asserts on a clock, so the suite
passes on a loaded machine; time limits live in benchmarks/. A clock value may still bound
a wait (a generous timeout that only catches a hang), but no ``assert`` may read one.

Checked with ``ast``: in every test module, names bound (directly or through other names)
to a call of a clock (``time.time``, ``perf_counter``, ``monotonic``, ``process_time``,
their ``_ns`` forms, ``resource.getrusage``) are clock values; an ``assert`` whose test
reads a clock call or a clock value is a wall-clock assertion.
"""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import settings

TESTS = Path(__file__).resolve().parent
CLOCKS = {"time", "perf_counter", "monotonic", "process_time", "time_ns", "perf_counter_ns",
          "monotonic_ns", "process_time_ns", "getrusage"}


def _reads_clock(node: ast.AST, clocked: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and f.id in CLOCKS:        # from time import ...
                return True
            if (isinstance(f, ast.Attribute) and f.attr in CLOCKS   # time.perf_counter()
                    and isinstance(f.value, ast.Name) and f.value.id in ("time", "resource")):
                return True
        if isinstance(n, ast.Name) and n.id in clocked:
            return True
    return False


def clock_assertions(source: str) -> list[int]:
    """Line numbers of the ``assert`` statements of ``source`` that read a clock."""
    tree = ast.parse(source)
    clocked: set[str] = set()
    changed = True
    while changed:   # names bound to clock values, transitively (t0 -> elapsed -> ...)
        changed = False
        for n in ast.walk(tree):
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                if _reads_clock(n.value, clocked):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        for m in ast.walk(t):
                            if isinstance(m, ast.Name) and m.id not in clocked:
                                clocked.add(m.id)
                                changed = True
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Assert) and _reads_clock(n.test, clocked)]


def test_the_checker_finds_clock_assertions():
    src = ("import time\n"
           "def test_a():\n    t0 = time.perf_counter()\n    work()\n"
           "    elapsed = time.perf_counter() - t0\n    assert elapsed < 1.0\n"
           "def test_b():\n    t0 = time.monotonic()\n    assert time.monotonic() - t0 < 2\n"
           "def test_c():\n    n = f.time(3)\n    assert n == f.time(3)\n")  # a method
    assert clock_assertions(src) == [6, 9]


def test_no_test_asserts_on_a_clock():
    found = {p.name: lines for p in sorted(TESTS.glob("*.py"))
             if (lines := clock_assertions(p.read_text()))}
    assert found == {}, f"wall-clock assertions (move the limit to benchmarks/): {found}"


def test_hypothesis_has_no_deadline():
    # tests/conftest.py loads a profile without the 200 ms per-example deadline
    assert settings.default.deadline is None
