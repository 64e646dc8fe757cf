"""What the command-line modules share: one-line argument errors, values that look
like negative numbers, finite numeric flags, topology errors blamed on the flag
that gave the bad value, printing a result as JSON or text, and the output flags and
folder rule every command that writes files shares (:func:`add_output_flags`,
:func:`output_folder`)."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from moesim.errors import InputError

CLI = "command line"
# "-1GiB", "-5", "-1e3", "-.5": a value, not an option (argparse only lets plain
# negative numbers through, and only when no option looks like one)
_NEGATIVE_VALUE = re.compile(r"^-\.?[0-9]")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the command line (no usage
    block), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {CLI}: {message}\n")


def join_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--bytes -1GiB`` -> ``--bytes=-1GiB`` for every option of ``parser`` (and its
    subcommands) that takes one value, so a negative-looking value reaches the
    option's own check ("expected a size >= 0") instead of argparse's "expected one
    argument"."""
    takes_value: set[str] = set()
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif action.option_strings and action.nargs is None:
                takes_value.update(action.option_strings)
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in takes_value and i + 1 < len(argv) and _NEGATIVE_VALUE.match(argv[i + 1]):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def finite_float(text: str) -> float:
    """argparse ``type`` for a float flag: refuses nan and inf."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return v


def load_topology_args(name: str, params: dict[str, Any], flags: dict[str, str],
                       routing: str | None = None) -> Any:
    """``load_topology(name, routing, **params)``; an error about a value that came
    from the command line (``params``, ``routing``) names the flag in ``flags`` (or
    ``--set KEY``) instead of the topology file."""
    from moesim.topology import load_topology

    try:
        return load_topology(name, routing=routing, **params)
    except InputError as err:
        key = err.field.removeprefix("params.")
        if err.field.startswith("params.") and key in params:
            flag = flags.get(key, f"--set {key}")
            if err.expected.startswith("no parameters"):  # an explicit graph takes none
                raise InputError(CLI, flag, f"no {flag}: {err.source} is an explicit graph "
                                 "with its own nodes", params[key]) from None
            raise InputError(CLI, flag, *err.args[2:]) from None
        if err.field == "routing" and routing is not None:
            raise InputError(CLI, flags.get("routing", "--set routing"),
                             *err.args[2:]) from None
        raise


def print_result(res: dict, as_json: bool, fmt: Callable[[dict], str]) -> int:
    """Print ``res`` as sorted JSON (``--json``) or as ``fmt(res)``; exit status 0."""
    print(json.dumps(res, sort_keys=True) if as_json else fmt(res))
    return 0


def refuse_serving(scn: Any, overrides: list[str], command: str, what: str) -> None:
    """A training command (``run``, ``memory``) on a scenario with a ``serve:`` section
    (from its file, or ``--set serve.…``): one line pointing at ``moesim serve``, never
    a training answer silently given for a serving question."""
    if not scn.serve:
        return
    keys = [o.split("=", 1)[0].strip() for o in overrides]
    given = [k for k in keys if k == "serve" or k.startswith("serve.")]
    raise InputError(CLI if given else scn.source, f"--set {given[0]}" if given else "serve",
                     f"a training scenario (a serve: section is simulated by `moesim serve`; "
                     f"`moesim {command}` would ignore it and {what})", "a serve: section")


# ---------------------------------------------------------------- the output convention

#: ``-o``'s default of ``run``, ``serve`` and ``rl`` (:func:`moesim.outputs.default_run_dir`)
OUT_DEFAULT = "out/<scenario name>, or out/<scenario name>--<overrides> with --set"

def add_output_flags(p: argparse.ArgumentParser, *, out_default: str | None = None,
                     json_help: str = "print the summary as JSON on stdout (nothing else "
                                      "there)",
                     strict: bool = True, quiet: bool = True) -> None:
    """The output flags every command shares, defined once.

    With ``out_default`` (what ``-o`` defaults to, said in its help) the command writes a
    folder: ``-o/--out DIR``, ``--no-files`` and ``--force``. Always ``--json``; with
    ``quiet`` ``--quiet``; with ``strict`` ``--strict`` (exit 2 when a placed model does
    not fit in device memory, :func:`moesim.memory.fit.flag_fits`). The flags sit in
    their own group of ``--help``."""
    g = p.add_argument_group("output")
    if out_default is not None:
        g.add_argument("-o", "--out", default=None, metavar="DIR",
                       help=f"output folder (default {out_default}); it gets summary.md "
                            "and summary.json, plus the command's other files")
        g.add_argument("--no-files", action="store_true",
                       help="write no files, only print")
        g.add_argument("--force", action="store_true",
                       help="write into a folder that holds files moesim did not write, or "
                            "another scenario's or command's outputs")
    g.add_argument("--json", action="store_true", help=json_help)
    if quiet:
        g.add_argument("--quiet", action="store_true",
                       help="no progress line and no notes on stderr (warnings and errors "
                            "are still printed)")
    if strict:
        g.add_argument("--strict", action="store_true",
                       help="exit 2 if a placed model does not fit in device memory "
                            "(default: a warning, and oom: true in summary.json)")


def output_folder(args: argparse.Namespace, name: str, overrides: list[str] | tuple = (),
                  root: str = "out") -> Path | None:
    """The folder a command following the output convention writes: None with
    ``--no-files``; ``-o DIR`` when given; else :func:`moesim.outputs.default_run_dir`
    (``out/<name>``, ``out/<name>--<overrides>`` with ``--set``). ``-o`` with
    ``--no-files`` is one line, exit 2."""
    from moesim.outputs import default_run_dir

    out = getattr(args, "out", None)
    if getattr(args, "no_files", False):
        if out:
            raise InputError(CLI, "--no-files", "either -o DIR or --no-files", "both")
        return None
    return Path(out) if out else default_run_dir(name, list(overrides), root)
