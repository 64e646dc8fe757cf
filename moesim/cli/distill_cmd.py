"""``moesim distill SCENARIO``: a student's training step with a teacher's forward pass
(the scenario's ``distill:`` section, docs/distillation.md): colocated on the student's
GPUs or on its own, full or top-k logits.

Prints the step, the time distillation adds (teacher forward, transfer of its outputs,
the loss), the bytes moved and the memory per GPU; ``--json`` prints summary.json; the
output folder (``-o DIR``, default ``out/<scenario name>``, none with ``--no-files``)
gets summary.md and summary.json. A teacher, or its outputs, that do not fit beside the
student is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moesim.cli.common import OUT_DEFAULT, add_output_flags


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file with a distill section, or shipped "
                   "name (e.g. distill-qwen3-30b-a3b)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set distill.outputs=logits (repeatable)")
    add_output_flags(p, out_default=OUT_DEFAULT, strict=False)


def run(args: argparse.Namespace) -> int:
    from moesim.cli.common import output_folder
    from moesim.distill.step import distill_setup
    from moesim.outputs import check_run_folder, claim

    setup = distill_setup(args.scenario, args.overrides)
    out = output_folder(args, setup.scenario.name, args.overrides)
    if out is None:
        return _report(args, setup, None)
    identity = setup.scenario.to_dict()
    check_run_folder(out, args.force, identity=identity)
    with claim(out, force=args.force, identity=identity):
        return _report(args, setup, out)


def _report(args: argparse.Namespace, setup, out: Path | None) -> int:
    import sys

    from moesim.distill.step import simulate_distill
    from moesim.distill.summary import summarize, text_summary

    summary = summarize(setup, simulate_distill(setup))
    if out is not None:
        from moesim.outputs import Outputs

        outs = Outputs(out, force=args.force)
        try:
            outs.commit(summary, lambda s: "# Distillation step\n\n```\n" + text_summary(s)
                        + "\n```\n")
        finally:
            outs.discard()
    if args.json:
        print(json.dumps(summary, indent=1, allow_nan=False))
        if out is not None:
            print(f"moesim distill: wrote {out}/", file=sys.stderr)
    else:
        print(text_summary(summary))
        if out is not None:
            print(f"  wrote {out}/ (summary.md, summary.json)")
    return 0
