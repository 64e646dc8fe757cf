"""Reading a user's YAML file: ``yaml.safe_load`` only, and one clear error line.

Every file a user writes (scenario, topology, sweep) is read here, so a malformed
file always names the file, the line and column, and what was wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from moesim.errors import InputError


def read_yaml(path: str | Path, expected: str, *, empty_ok: bool = False) -> dict[str, Any]:
    """The mapping at the top of ``path``; ``expected`` describes it for errors (e.g.
    "a mapping of sections (name, cluster, model, ...)")."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(str(p), "", "a readable UTF-8 YAML file", str(err)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(str(p), where, "valid YAML", problem) from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise InputError(str(p), "", expected, type(data).__name__)
    return data
