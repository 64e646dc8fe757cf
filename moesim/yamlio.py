"""Reading a user's YAML file: one safe loader, and one clear error line.

Every file a user writes (scenario, topology, sweep) is read here, so a malformed
file always names the file, the line and column, and what was wrong. The loader is
PyYAML's safe loader with two changes:

* ``2.5e1``, ``1e3``, ``1E-6`` are numbers (YAML 1.2 reads them so; PyYAML's YAML
  1.1 resolver wants a dot and a signed exponent, and read them as strings);
* a key given twice in one mapping is an error naming both lines (PyYAML keeps the
  last one silently).

Any number that is not finite (``.nan``, ``.inf``, ``1e400``) is refused with the
dotted path of the field it sits in (see :func:`check_finite`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from moesim.errors import InputError

# Forms of YAML 1.2's float that YAML 1.1 (PyYAML) reads as strings: no dot, or an
# exponent without a sign (``1e3``, ``2.5e1``, ``1E-6``, ``.5e3``).
_SCI_FLOAT = re.compile(r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+
                          |[-+]?\.[0-9][0-9_]*[eE][-+]?[0-9]+)$""", re.X)


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping names the same key twice."""


class MoesimLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` reading scientific notation as floats and refusing
    duplicate keys."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKeyError(
                        None, None, f"duplicate key {key!r} (first at line {first})",
                        key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


MoesimLoader.add_implicit_resolver("tag:yaml.org,2002:float", _SCI_FLOAT,
                                   list("-+0123456789."))


def load_text(text: str) -> Any:
    """Parse YAML text with :class:`MoesimLoader` (yaml.YAMLError on bad text)."""
    return yaml.load(text, Loader=MoesimLoader)  # noqa: S506 (a SafeLoader subclass)


def first_non_finite(data: Any, path: str = "") -> tuple[str, float] | None:
    """``(dotted.path, value)`` of the first NaN or infinite float in ``data``
    (dicts, lists, scalars), or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return path, data
    if isinstance(data, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in data.items())
    elif isinstance(data, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(data))
    else:
        return None
    for sub, v in items:
        found = first_non_finite(v, sub)
        if found is not None:
            return found
    return None


def check_finite(data: Any, source: str, prefix: str = "") -> None:
    """InputError naming the field of the first NaN/infinite number in ``data``."""
    found = first_non_finite(data, prefix)
    if found is not None:
        raise InputError(source, found[0] or "value", "a finite number", found[1])


def read_yaml(path: str | Path, expected: str, *, empty_ok: bool = False) -> dict[str, Any]:
    """The mapping at the top of ``path``; ``expected`` describes it for errors (e.g.
    "a mapping of sections (name, cluster, model, ...)")."""
    p = Path(path)
    if p.is_dir():
        raise InputError(str(p), "", "a YAML file", "a directory")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(str(p), "", "a readable UTF-8 YAML file", str(err)) from None
    try:
        data = load_text(text)
    except DuplicateKeyError as err:
        mark = err.problem_mark
        raise InputError(str(p), f"line {mark.line + 1}", "each key once in a mapping",
                         err.problem) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "YAML"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(str(p), where, "valid YAML", problem) from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise InputError(str(p), "", expected, type(data).__name__)
    check_finite(data, str(p))
    return data
