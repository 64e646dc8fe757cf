"""The one memory verdict every command flags (moesim.memory.fit), worked by hand."""

from __future__ import annotations

import io

import pytest

from moesim.errors import InputError
from moesim.memory.fit import Fit, fit_line, fit_summary, flag_fits
from moesim.units import GiB


def test_fit_by_hand():
    ok = Fit("trainer (stage 0)", 60 * GiB, 79.5 * GiB)
    bad = Fit("rollout engine", 80 * GiB, 79.5 * GiB)
    assert not ok.oom and bad.oom
    assert bad.text() == "rollout engine needs 80.0 GiB of 79.5 GiB per GPU: does not fit"
    s = fit_summary([ok, bad])
    assert s["oom"] is True and [c["oom"] for c in s["checks"]] == [False, True]
    assert s["checks"][1]["need_bytes"] == 80 * GiB


def test_flag_warns_once_per_placement_and_strict_refuses():
    err = io.StringIO()
    s = flag_fits([Fit("a", 2.0, 1.0), Fit("b", 1.0, 1.0)], "rl", stream=err)
    assert s["oom"] and err.getvalue().count("\n") == 1
    assert err.getvalue().startswith("moesim rl: warning: a needs")
    with pytest.raises(InputError) as e:
        flag_fits([Fit("a", 2.0, 1.0)], "rl", strict=True)
    assert e.value.field == "--strict" and "does not fit" in str(e.value)
    assert flag_fits([Fit("b", 1.0, 1.0)], "rl", strict=True)["oom"] is False  # exactly full fits


def test_fit_line():
    assert "does not fit" in fit_line(fit_summary([Fit("x", 3 * GiB, 2 * GiB)]))
    assert fit_line(fit_summary([Fit("x", 1 * GiB, 2 * GiB)])) == \
        "  memory per GPU: x 1.0 of 2.0 GiB"
