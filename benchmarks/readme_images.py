"""Regenerate the README's timeline image from the run the README quotes.

    python benchmarks/readme_images.py

runs ``moesim run hot-expert`` (the command whose summary the README prints) into a
temporary folder, prints the command and the summary it printed, and puts that run's
``timeline.png`` at ``docs/img/hot-expert-timeline.png`` atomically (a temporary file
in ``docs/img/`` renamed over the old image), so the picture and the README's figures
come from one run. Commit the image afterwards. ``--scenario``, ``--set`` and ``--out``
draw another run elsewhere (the tests use a small scenario and a temporary path).
Exit status: the run's when it fails (its message printed), else 0.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "img" / "hot-expert-timeline.png"


def run_command(scenario: str, overrides: list[str], outdir: Path) -> list[str]:
    """The ``moesim run`` command line writing ``scenario``'s run into ``outdir``."""
    sets = [a for kv in overrides for a in ("--set", kv)]
    return [sys.executable, "-m", "moesim", "run", scenario, *sets, "-o", str(outdir),
            "--quiet"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="hot-expert",
                    help="scenario name or YAML file (default: hot-expert, as the README)")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="KEY=VALUE", help="passed on to moesim run")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="where the image goes (default: docs/img/hot-expert-timeline.png)")
    args = ap.parse_args(argv)
    from moesim.outputs import write_file  # atomic: a temporary file renamed into place

    with tempfile.TemporaryDirectory(prefix="moesim-readme-") as tmp:
        outdir = Path(tmp) / "run"
        cmd = run_command(args.scenario, args.overrides, outdir)
        shown = " ".join(["moesim", *cmd[3:-3]])   # as a user types it, without -o/--quiet
        print(f"$ {shown}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        out = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.lstrip().startswith(
            "wrote "))
        print(out)
        if proc.returncode != 0:
            print(proc.stderr.strip(), file=sys.stderr)
            return proc.returncode
        src = outdir / "timeline.png"
        if not src.is_file():
            print(f"{shown} wrote no timeline.png into {outdir}", file=sys.stderr)
            return 1
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_file(args.out, lambda t: shutil.copyfile(src, t), force=True)
    try:
        where = args.out.resolve().relative_to(ROOT)
    except ValueError:
        where = args.out
    print(f"wrote {where} (timeline.png of that run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
