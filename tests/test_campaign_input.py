"""``moesim train`` refuses bad input with one line naming the file, the field and what
was expected, exit 2, no traceback."""

from __future__ import annotations

import pytest

from moesim.cli import main
from tests.test_campaign import tiny


def refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("moesim train: error: ")
    return err


@pytest.mark.parametrize("cause, field, expected", [
    ({"rate_per_day": -1.0, "per": "gpu"}, "failures.causes.bad.rate_per_day", "> 0"),
    ({"rate_per_day": 0, "per": "gpu"}, "failures.causes.bad.rate_per_day", "> 0"),
    ({"count": 0, "per": "node"}, "failures.causes.bad.count", "> 0"),
    ({"count": 3, "per": "rack"}, "failures.causes.bad.per", "gpu, node, job"),
    ({"count": 3, "rate_per_day": 1}, "failures.causes.bad", "either count"),
])
def test_a_bad_rate_is_one_line(tmp_path, capsys, cause, field, expected):
    p = tiny(tmp_path, failures={"causes": {"bad": cause}})
    err = refused(capsys, ["train", "--campaign", str(p), "--days", "1", "--no-files"])
    assert f"{p}: {field}: expected" in err and expected in err


def test_a_checkpoint_larger_than_the_storage(tmp_path, capsys):
    p = tiny(tmp_path, storage={"capacity": "10GB"})
    err = refused(capsys, ["train", "--campaign", str(p), "--days", "1", "--no-files"])
    assert f"{p}: storage.capacity: expected room for one checkpoint of 0.050 TB" in err


def test_a_campaign_of_a_billion_days(tmp_path, capsys):
    p = tiny(tmp_path)
    err = refused(capsys, ["train", "--campaign", str(p), "--days", "1e9", "--no-files"])
    assert "command line: --days: expected a number > 0 and <= 3650" in err
    err = refused(capsys, ["train", "--campaign", str(p), "--no-files"])
    assert "--days D or --tokens N" in err


def test_an_unwritable_output_path(tmp_path, capsys):
    p = tiny(tmp_path)
    (tmp_path / "file").write_text("x")
    err = refused(capsys, ["train", "--campaign", str(p), "--days", "1", "-o",
                           str(tmp_path / "file" / "out"), "--quiet"])
    assert "file" in err


def test_other_bad_fields(tmp_path, capsys):
    p = tiny(tmp_path, checkpoint={"mode": "lazy"})
    assert "checkpoint.mode: expected one of sync, async" in refused(
        capsys, ["train", "--campaign", str(p), "--days", "1", "--no-files"])
    p = tiny(tmp_path, typo=1)
    assert "typo: expected one of the keys" in refused(
        capsys, ["train", "--campaign", str(p), "--days", "1", "--no-files"])
    p = tiny(tmp_path)
    assert "--interval-s: expected a number > 0" in refused(
        capsys, ["train", "--campaign", str(p), "--days", "1", "--interval-s", "0",
                 "--no-files"])
    assert "--step-s: expected a number > 0" in refused(
        capsys, ["train", "--campaign", str(p), "--days", "1", "--step-s", "-2",
                 "--no-files"])


def test_a_negative_seed_and_a_serving_scenario(tmp_path, capsys):
    p = tiny(tmp_path)
    assert "--seed: expected an integer >= 0" in refused(
        capsys, ["train", "--campaign", str(p), "--days", "1", "--seed", "-1", "--no-files"])
    assert "expected a training scenario" in refused(
        capsys, ["train", "mixtral-8x7b-serve", "--days", "1", "--no-files"])


def test_another_campaigns_folder_is_not_replaced_without_force(tmp_path, capsys):
    p = tiny(tmp_path)
    out = tmp_path / "o"
    assert main(["train", "--campaign", str(p), "--days", "1", "-o", str(out), "--quiet",
                 "--no-sweep"]) == 0
    capsys.readouterr()
    (tmp_path / "x").mkdir()
    q = tiny(tmp_path / "x")                 # another campaign file: another run
    assert "pass --force to replace" in refused(
        capsys, ["train", "--campaign", str(q), "--days", "1", "-o", str(out), "--quiet"])
    assert main(["train", "--campaign", str(q), "--days", "1", "-o", str(out), "--quiet",
                 "--no-sweep", "--force"]) == 0
