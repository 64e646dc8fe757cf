"""Which input to blame: a value given by ``--set`` is the command line's, not the
scenario file's."""

from __future__ import annotations

from moesim.errors import InputError

CLI = "command line"


def blame_overrides(err: InputError, source: str, overrides: list[str] | tuple[str, ...]
                    ) -> InputError:
    """``err`` naming the command line (``--set FIELD``) when the value it is about, a
    field of the scenario file ``source``, was given by one of ``overrides``
    (``key=value`` items); else ``err`` itself."""
    if err.source != source or not err.field:
        return err
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if err.field == key or err.field.startswith((key + ".", key + "[")):
            return InputError(CLI, f"--set {err.field}", *err.args[2:])
    return err
