"""User-facing input errors.

Every problem with something a user wrote (a YAML file, a flag, a trace) is raised
as :class:`InputError`. The CLI turns it into one line on stderr and exit status 2,
never a traceback.
"""

from __future__ import annotations

from typing import Any

_MISSING = object()


class InputError(Exception):
    """Bad user input: names the file, the field and what was expected.

    ``args`` holds exactly the constructor's arguments, so ``type(e)(*e.args)``
    rebuilds the same error: simpy re-raises an exception from a process that way.
    """

    def __init__(self, source: str, field: str, expected: str, got: Any = _MISSING) -> None:
        self.source = str(source)
        self.field = field
        self.expected = expected
        self.got = got
        if got is _MISSING:
            super().__init__(source, field, expected)
        else:
            super().__init__(source, field, expected, got)

    @property
    def message(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        text = f"{where}: expected {self.expected}"
        if self.got is not _MISSING:
            text += f", got {self.got!r}"
        return text

    def __str__(self) -> str:
        return self.message
