"""The ``moesim`` command line.

Each subcommand lives in its own module ``moesim.cli.<name>`` exposing
``add_arguments(parser)`` and ``run(args) -> int``. A bad input raises
:class:`moesim.errors.InputError`, which becomes one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from moesim import __version__
from moesim.cli.common import OneLineParser, join_negative_values
from moesim.cli.help_text import DESCRIPTIONS, TOP
from moesim.errors import InputError
from moesim.trace.progress import end_lines

# name -> (module, one-line help). Modules are imported lazily so that a command
# needing an optional extra (torch, dask) does not slow or break the others.
COMMANDS: dict[str, tuple[str, str]] = {
    "topology": ("moesim.cli.topology_cmd", "describe or draw a cluster topology"),
    "flows": ("moesim.cli.flows_cmd", "run point-to-point flows through the network model"),
    "collective": ("moesim.cli.collective_cmd", "simulate one collective on a topology"),
    "run": ("moesim.cli.run_cmd", "simulate one training step of a scenario"),
    "serve": ("moesim.cli.serve_cmd", "simulate one prefill or decode step of a serving "
              "deployment"),
    "rl": ("moesim.cli.rl_cmd", "simulate GRPO post-training steps (rollouts, scoring, "
           "training, weight sync)"),
    "distill": ("moesim.cli.distill_cmd", "a student's training step with a teacher's "
                "forward pass (full or top-k logits, colocated or separate)"),
    "train": ("moesim.cli.train_cmd", "pre-training over days: failures, checkpoints, "
              "restarts, ETTR"),
    "memory": ("moesim.cli.memory_cmd", "per-rank memory table of a scenario"),
    "kernels": ("moesim.cli.kernels_cmd", "one layer's kernels by pass: shape, dtype, FLOPs, "
                "bytes, what priced them, time"),
    "layout": ("moesim.cli.layout_cmd", "the process groups of a rank and the nodes they span"),
    "schedule": ("moesim.cli.schedule_cmd", "a pipeline schedule's step, bubble and "
                 "activations in stage time"),
    "plot": ("moesim.cli.plot_cmd", "redraw a timeline from a run directory"),
    "compare": ("moesim.cli.compare_cmd", "compare the summaries of two runs"),
    "record": ("moesim.cli.record_cmd", "record a real torch MoE layer with torch.profiler"),
    "ingest": ("moesim.cli.ingest_cmd", "read torch.profiler traces of an MoE layer"),
    "calibrate": ("moesim.cli.calibrate_cmd", "fit compute and communication models to traces"),
    "validate": ("moesim.cli.validate_cmd", "compare the simulator with recorded traces"),
    "sweep": ("moesim.cli.sweep_cmd", "run a what-if grid of scenarios"),
    "models": ("moesim.cli.models_cmd", "list model presets, devices and topologies, or "
               "read a Hugging Face config.json"),
}


def _available() -> dict[str, tuple[str, str]]:
    found = {}
    for name, (mod, help_) in COMMANDS.items():
        if importlib.util.find_spec(mod) is not None:
            found[name] = (mod, help_)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="moesim", description=TOP)
    parser.add_argument("--version", action="version", version=f"moesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=DESCRIPTIONS.get(name, help_),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        importlib.import_module(mod).add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(join_negative_values(parser, sys.argv[1:] if argv is None
                                                      else list(argv)))
    except SystemExit as stop:  # a bad flag (one line already printed), --help, --version
        return int(stop.code or 0)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    # the process's own command line (it exits after the command): a command may then
    # leave process-wide state as it is (moesim run freezes the garbage collector's heap)
    args._own_process = argv is None
    from moesim.outputs import set_command

    set_command(args.command)   # the marker of the folder it writes names the command
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except InputError as err:
        end_lines()
        print(f"moesim {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        end_lines()
        print(f"moesim {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `moesim flows ... | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:   # a path the system refuses (name too long, ...): one line
        print(f"moesim {args.command}: error: {os_error_line(err)}", file=sys.stderr)
        return 2
    finally:
        set_command(None)


def os_error_line(err: OSError) -> str:
    """An operating-system error on a path a user gave, as InputError's one line."""
    import errno

    reason = "name too long" if err.errno == errno.ENAMETOOLONG else (
        err.strerror or type(err).__name__)
    where = err.filename if err.filename is not None else "command line"
    name = str(where)
    if len(name) > 80:
        name = name[:40] + "…" + name[-20:]
    return str(InputError(name, "path", "a path the operating system accepts", reason))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
