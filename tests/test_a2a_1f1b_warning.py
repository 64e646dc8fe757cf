"""A step run with Megatron's EP overlap in 1F1B (``overlap.kind: a2a-1f1b``) says, where
it is printed, that its gain came out larger than measured (docs/schedules.md, "How far
to trust a2a-1f1b"): `moesim run` once on stderr and in the summary's warnings, `moesim
memory` once in its report; other overlaps do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moesim.cli import main
from moesim.schedule.a2a_overlap import TRUST_WARNING
from moesim.wiring import resolve_path


@pytest.mark.parametrize("sets, warned", [
    (["overlap.kind=a2a-1f1b"], True),
    (["overlap.kind=none"], False),
    # the static pairing needs a schedule with adjacent micro-batches: GPipe
    (["overlap.kind=static", "schedule.kind=gpipe"], False),
])
def test_resolving_warns_only_for_a2a_1f1b(sets, warned):
    res = resolve_path("toy-cpu", sets)
    assert res.warnings.count(TRUST_WARNING) == (1 if warned else 0)


def test_the_warning_names_the_page_that_holds_the_comparisons():
    assert 'docs/schedules.md, "How far to trust a2a-1f1b"' in TRUST_WARNING
    page = (Path(__file__).resolve().parent.parent / "docs" / "schedules.md").read_text()
    assert "**How far to trust a2a-1f1b.**" in page
    assert "all three runs published with and without Megatron's EP overlap" in page


def test_run_prints_it_once_and_the_summary_carries_it(capsys):
    assert main(["run", "toy-cpu", "--set", "overlap.kind=a2a-1f1b", "--no-files",
                 "--quiet", "--json"]) == 0
    cap = capsys.readouterr()
    assert cap.err.count(TRUST_WARNING) == 1
    assert json.loads(cap.out)["warnings"] == [TRUST_WARNING]


def test_memory_report_carries_it_once(capsys):
    assert main(["memory", "toy-cpu", "--set", "overlap.kind=a2a-1f1b"]) == 0
    assert capsys.readouterr().out.count(f"warning: {TRUST_WARNING}") == 1
    assert main(["memory", "toy-cpu"]) == 0
    assert TRUST_WARNING not in capsys.readouterr().out
