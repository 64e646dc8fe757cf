"""Which input to blame: a value given by ``--set`` is the command line's, not the
scenario file's; so is an error about a file's value that only a ``--set`` brought
about (``--set model.heads=3`` against the file's ``kv_heads: 8``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar

from moesim.errors import InputError

CLI = "command line"

#: the most ``--set`` items whose part in an error is worked out: each costs two more
#: passes over the checks (about a second each on a 2,048-GPU scenario)
MAX_RECHECKED = 8

#: set while :func:`blame_overrides` checks the file again, so that check does not
#: check again itself
_RECHECKING: ContextVar[bool] = ContextVar("moesim_blame_rechecking", default=False)


def blame_overrides(err: InputError, source: str, overrides: Sequence[str],
                    recheck: Callable[[list[str]], object] | None = None) -> InputError:
    """``err`` naming the command line (``--set FIELD``) when the value it is about, a
    field of the scenario file ``source``, was given by one of ``overrides``
    (``key=value`` items). Else, with ``recheck`` (the same checks run on the file with
    some of the overrides), when the file alone passes them: the command line, naming
    the ``--set`` items that bring the error about and the file's field it is about.
    Else ``err`` itself."""
    if err.source != source or not err.field:
        return err
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if err.field == key or err.field.startswith((key + ".", key + "[")):
            return InputError(CLI, f"--set {err.field}", *err.args[2:])
    if recheck is None or not overrides or len(overrides) > MAX_RECHECKED or _RECHECKING.get():
        return err
    token = _RECHECKING.set(True)
    try:
        if _same(err, recheck, []) is not False:
            return err                      # the file alone has it (or another error)
        # an item that brings the error about alone, or without which it is gone
        culprits = [o for i, o in enumerate(overrides) if _same(err, recheck, [o]) or (
            len(overrides) > 1
            and _same(err, recheck, [*overrides[:i], *overrides[i + 1:]]) is False)]
    finally:
        _RECHECKING.reset(token)
    keys = [o.split("=", 1)[0].strip() for o in (culprits or overrides)]
    from moesim.paths import shown
    # a field the file leaves out (got None) is not the file's value: the --set needs it
    whose = f"then {err.field}" if err.got is None else f"with {shown(source)}'s {err.field}"
    return InputError(CLI, f"--set {', '.join(keys)} ({whose})", *err.args[2:])


def _same(err: InputError, recheck: Callable[[list[str]], object], overrides: list[str]
          ) -> bool | None:
    """True: ``recheck(overrides)`` raises ``err`` again; False: it passes; None: it
    raises another error."""
    try:
        recheck(overrides)
    except InputError as again:
        return (again.source, again.field) == (err.source, err.field) or None
    return False


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
