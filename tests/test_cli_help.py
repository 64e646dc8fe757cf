"""``moesim COMMAND --help``: plain text (no reStructuredText or Markdown markup), and
the description above the flags names every mode of the command."""

from __future__ import annotations

import argparse
import re

import pytest

from moesim.cli import build_parser

# ``literal``, :func:`x`, :mod:`x`, `x` (RST roles and literals, Markdown code)
MARKUP = re.compile(r"``|:(func|mod|class|meth|data|attr|ref|doc):|`")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


SUBS = _subparsers()


def _description(help_text: str) -> str:
    """The text between the usage block and the first argument group."""
    body = help_text.split("\n\n", 1)[1]
    return re.split(r"\n(positional arguments|options):\n", body)[0]


def test_top_level_help_has_no_markup():
    assert not MARKUP.search(build_parser().format_help())


@pytest.mark.parametrize("name", sorted(SUBS))
def test_help_has_no_markup(name):
    text = SUBS[name].format_help()
    found = MARKUP.search(text)
    where = text[max(0, found.start() - 60):found.end() + 20] if found else ""
    assert found is None, f"moesim {name} --help: {where!r}"


MODES = {
    "serve": ["one step", "under load", "--find-capacity", "--check-surface", "--slo"],
    "memory": ["moesim memory SCENARIO", "--matmul", "--megatron"],
    "collective": ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv",
                   "all_to_all_v", "ep_dispatch", "ep_combine", "dist_topk", "--kernel"],
    "kernels": ["fwd", "dgrad", "wgrad"],
    "topology": ["--draw", "--json"],
    "flows": ["--model flow", "--model analytical"],
    "plot": ["--what timeline", "--what experts"],
    "record": ["--shape-sweep"],
    "calibrate": ["--shape-sweep", "GPU_TRACE"],
    "validate": ["--calibration", "--scenario"],
    "sweep": ["--plot-only", "--scheduler", "summary.md", "summary.json", "--strict"],
    "run": ["summary.md", "summary.json", "--no-files", "--strict"],
    "rl": ["summary.md", "summary.json", "--strict", "fill-and-drain"],
}


@pytest.mark.parametrize("name", sorted(MODES))
def test_description_names_every_mode(name):
    desc = _description(SUBS[name].format_help())
    missing = [m for m in MODES[name] if m not in desc]
    assert not missing, f"moesim {name} --help does not name {missing} above its flags"


@pytest.mark.parametrize("name", sorted(SUBS))
def test_every_command_has_a_description_of_its_own(name):
    """More than the one-line summary of ``moesim --help`` (models: owned elsewhere)."""
    desc = _description(SUBS[name].format_help()).strip()
    if name == "models":
        assert desc
        return
    assert "\n" in desc and len(desc) > 120, desc
