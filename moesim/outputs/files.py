"""Output files: names, the default folder of a run, checks before long work, atomic
writes.

- :func:`check_name`: a scenario or sweep name that becomes a folder name
  (no path separators, no ``..``, not empty, not too long);
- :func:`default_run_dir`: the folder a run writes when no ``-o`` is given;
- :func:`check_file_target` / :func:`check_dir_target`: before any long work, the
  output path can be written (no file where a folder must be, parent folder exists,
  names not too long, writable);
- :func:`write_file` / :func:`write_text` / :func:`save_figure`: every file is written
  to a temporary file in the same folder and renamed into place (``os.replace``), the
  destination checked again at that moment.

Operating-system errors become :class:`moesim.errors.InputError` (one line, exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from moesim.errors import InputError

#: longest scenario / sweep name (a folder name gets a suffix for the overrides)
NAME_MAX = 100
_TMP_SUFFIX = ".moesim-tmp"


def check_name(src: str, field: str, name: Any) -> str:
    """``name`` if it can be a folder name of its own; else InputError."""
    if not isinstance(name, str) or not name.strip():
        raise InputError(src, field, "a non-empty name", name)
    bad = [c for c in ("/", "\\", "\0") if c in name]
    if bad or name in (".", "..") or name.startswith(".."):
        raise InputError(src, field, "a name without path separators or '..' (it names "
                         "the output folder out/<name>)", name)
    if len(name) > NAME_MAX:
        raise InputError(src, field, f"a name of at most {NAME_MAX} characters", name[:40] + "…")
    return name


_SLUG_OK = re.compile(r"[A-Za-z0-9._=,-]+")
_SLUG_MAX = 80


def default_run_dir(name: str, overrides: list[str] | tuple[str, ...] = (),
                    root: str | Path = "out") -> Path:
    """The default folder of a run: ``out/<name>`` without overrides, else
    ``out/<name>--<overrides>``, the ``--set`` items joined by ``+`` as written when they
    are short and plain (``out/hot-expert--routing.kind=uniform``), else a readable
    prefix and 8 hex digits of their SHA-256 (stable across machines and runs), so each
    distinct run (scenario + overrides) has a folder of its own."""
    check_name("scenario", "name", name)
    if not overrides:
        return Path(root) / name
    items = [o.strip() for o in overrides]
    slug = "+".join(items)
    if not all(_SLUG_OK.fullmatch(i) for i in items) or len(slug) > _SLUG_MAX:
        digest = hashlib.sha256("\0".join(items).encode()).hexdigest()[:8]
        readable = re.sub(r"[^A-Za-z0-9._=,-]+", "_", slug)[:40].strip("_.")
        slug = f"{readable}-{digest}" if readable else digest
    return Path(root) / f"{name}--{slug}"


def os_error(path: Path | str, err: OSError, what: str = "a writable path") -> InputError:
    """An OSError while writing ``path`` as one InputError line."""
    reason = err.strerror or str(err)
    if err.errno == errno.ENAMETOOLONG:
        reason = "name too long"
    return InputError(str(path), "output", what, reason)


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _check_creatable(path: Path, what: str, field: str = "output") -> None:
    """``path`` (absent or present) can be created or written: every existing ancestor
    is a folder we may write in, no name too long, the parent exists or can be made."""
    anc = path.parent
    missing = [path.name]
    while not anc.exists() and anc != anc.parent:
        missing.append(anc.name)
        anc = anc.parent
    here = anc if str(anc) else Path(".")
    if not here.is_dir():
        raise InputError(str(here), field, what, "a file where a folder must be")
    limit = _name_max(here)
    long = [n for n in missing if len(os.fsencode(n)) > limit]
    if long:
        raise InputError(str(path), field, what, f"name too long ({len(long[0])} > {limit} "
                         "bytes)")
    if not os.access(here, os.W_OK | os.X_OK):
        reason = "read-only file system" if _read_only(here) else "permission denied"
        raise InputError(str(here), field, what, reason)


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


#: bytes a temporary name adds to a file's name (".", ".<pid>.marker.moesim-tmp")
_TMP_EXTRA = 40


def _check_lengths(p: Path, last_extra: int = 0, field: str = "output") -> None:
    """No part of ``p`` longer than a file name may be (255 bytes on Linux, macOS and
    Windows file systems; the last less ``last_extra``, room for the temporary name),
    checked before anything else: asking the system about such a path fails with
    ENAMETOOLONG."""
    limits = [255] * (len(p.parts) - 1) + [255 - last_extra]
    for part, limit in zip(p.parts, limits, strict=True):
        if len(os.fsencode(part)) > limit:
            raise InputError(str(p), field, f"a path whose names have at most {limit} bytes",
                             f"name too long ({len(os.fsencode(part))} bytes)")


def check_file_target(path: str | Path, force: bool, flag: str = "-o") -> Path:
    """Check before any long work that ``path`` can be written as a file: its folder
    exists, it is not a folder, it does not exist unless ``force``."""
    p = Path(path)
    _check_lengths(p, _TMP_EXTRA, flag)
    what = "a file path in an existing, writable folder"
    if p.is_dir():
        raise InputError(str(p), flag, "a file path", "a folder")
    if not p.parent.is_dir() and str(p.parent):
        kind = "a file" if p.parent.exists() else "missing"
        raise InputError(str(p.parent), flag, "an existing folder for the output file", kind)
    _check_creatable(p, what, flag)
    if p.exists() and not force:
        raise InputError(str(p), flag, "a path that does not exist yet (or pass --force)",
                         "existing file")
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError(str(p), flag, what, "permission denied")
    return p


def check_dir_target(path: str | Path, flag: str = "-o") -> Path:
    """Check before any long work that ``path`` is or can be made a writable folder."""
    p = Path(path)
    _check_lengths(p, 0, flag)
    what = "a folder that exists or can be created"
    if p.exists() and not p.is_dir():
        raise InputError(str(p), flag, "a folder", "a file")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            reason = "read-only file system" if _read_only(p) else "permission denied"
            raise InputError(str(p), flag, what, reason)
    else:
        _check_creatable(p, what, flag)
    return p


def make_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(path, err, "a folder that can be created") from None
    return path


def _tmp_path(path: Path, tag: str = "") -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{tag}{_TMP_SUFFIX}")


def is_temporary(name: str) -> bool:
    """A temporary file of an interrupted moesim write (``.NAME.PID.moesim-tmp``)."""
    return name.startswith(".") and name.endswith(_TMP_SUFFIX)


@contextlib.contextmanager
def _temporary(path: Path, tag: str = "") -> Iterator[Path]:
    """A temporary path next to ``path``, removed on error."""
    tmp = _tmp_path(path, tag)
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _put(tmp: Path, path: Path, may_replace: Callable[[Path], bool]) -> None:
    """Rename ``tmp`` onto ``path``, checking the destination at this moment."""
    if (path.exists() or path.is_symlink()) and not may_replace(path):
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InputError(str(path), "output", "a path that does not exist yet or a file "
                         "moesim wrote (pass --force to replace it)", "a file moesim did not write")
    if path.is_dir():
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InputError(str(path), "output", "a file path", "a folder")
    try:
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise os_error(path, err) from None


def write_file(path: str | Path, write: Callable[[Path], Any], *, force: bool) -> Path:
    """Write one output file atomically: ``write(tmp)`` writes a temporary file in the
    same folder, which is renamed onto ``path``. An existing ``path`` is replaced only
    with ``force`` (checked at the moment of the rename). Returns ``path``."""
    path = Path(path)
    with _temporary(path) as tmp:
        try:
            write(tmp)
        except OSError as err:
            raise os_error(path, err) from None
        _put(tmp, path, lambda _p: force)
    return path


def write_text(path: str | Path, text: str, *, force: bool) -> Path:
    return write_file(path, lambda t: t.write_text(text), force=force)


def figure_formats() -> tuple[str, ...]:
    """File formats matplotlib's Agg canvas writes (png, pdf, svg, ...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return tuple(sorted(FigureCanvasAgg.get_supported_filetypes()))


def check_figure_target(path: str | Path, force: bool, flag: str = "-o") -> Path:
    """:func:`check_file_target` for a picture, whose suffix must name a format the
    figure can be written in (checked before the drawing, not after)."""
    p = Path(path)
    fmt = p.suffix.lstrip(".").lower()
    if fmt and fmt not in figure_formats():
        raise InputError(str(p), flag, "a picture file ending in one of ."
                         + ", .".join(figure_formats()), p.suffix)
    return check_file_target(p, force, flag)


def save_figure(fig: Any, path: str | Path, *, force: bool, **kw: Any) -> Path:
    """``fig.savefig`` to exactly ``path`` (its format from the suffix; PNG without one),
    atomically."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    return write_file(path, lambda t: fig.savefig(t, format=fmt, **kw), force=force)
