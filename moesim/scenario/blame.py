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


def named_by(err: InputError, user_file: str, how: str) -> InputError:
    """``err`` about a file that ``user_file`` names (a sweep's scenario, a scenario's
    topology): the same error, its file shown as the user would write it and the file
    the user gave named with it (``bad.yaml (scenario of sweep.yaml)``); else ``err``."""
    from pathlib import Path

    from moesim.paths import shown

    src = err.source
    if src in (user_file, CLI) or not Path(src).is_file():
        return err
    try:
        if Path(src).resolve() == Path(user_file).resolve():
            return err
    except OSError:
        return err
    return InputError(f"{shown(src)} ({how} {shown(user_file)})", *err.args[1:])
