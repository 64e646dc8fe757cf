"""benchmarks/readme_images.py: the README's timeline image is the timeline.png of the
very run whose summary it prints, put in place atomically (tested on the small toy-cpu
scenario, into tmp_path; the shipped image comes from `moesim run hot-expert`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import readme_images  # noqa: E402

from moesim.cli import main as moesim_main  # noqa: E402


def test_image_is_the_runs_timeline_and_replaces_the_old_one(tmp_path, capsys):
    out = tmp_path / "img" / "timeline.png"
    out.parent.mkdir()
    out.write_bytes(b"old picture")
    assert readme_images.main(["--scenario", "toy-cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("$ moesim run toy-cpu\n")
    assert "toy-cpu: step " in printed and " ms on 2 GPUs" in printed
    assert printed.rstrip().endswith("(timeline.png of that run)")
    # the same command run by hand draws the same picture, byte for byte
    assert moesim_main(["run", "toy-cpu", "-o", str(tmp_path / "run"), "--quiet"]) == 0
    assert out.read_bytes() == (tmp_path / "run" / "timeline.png").read_bytes()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["timeline.png"]  # no temporaries


def test_a_failed_run_leaves_the_image_alone(tmp_path, capsys):
    out = tmp_path / "timeline.png"
    out.write_bytes(b"old picture")
    rc = readme_images.main(["--scenario", "toy-cpu", "--set", "model.layers=-1",
                             "--out", str(out)])
    assert rc == 2
    assert "model.layers" in capsys.readouterr().err
    assert out.read_bytes() == b"old picture"


def test_the_default_command_is_the_readmes():
    cmd = readme_images.run_command("hot-expert", [], Path("/x"))
    assert cmd[1:5] == ["-m", "moesim", "run", "hot-expert"]
    assert readme_images.DEFAULT_OUT.relative_to(readme_images.ROOT).as_posix() == \
        "docs/img/hot-expert-timeline.png"
