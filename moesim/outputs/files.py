"""Safe output files: names, checks before long work, atomic writes, ownership.

Every command that writes files goes through here:

- :func:`check_name`: a scenario or sweep name that becomes a folder name
  (no path separators, no ``..``, not empty, not too long);
- :func:`check_file_target` / :func:`check_dir_target`: before any long work, the
  output path can be written (no file where a folder must be, parent folder exists,
  names not too long, writable) and, unless ``force``, holds nothing of the user's;
- :func:`claim`: a run folder belongs to one run at a time (a lock on
  ``FOLDER/.moesim.lock`` held from the check before the work to the last rename); a
  second run writing there at once fails in one line instead of both printing "wrote";
- :func:`write_file` / :class:`Outputs`: every file is written to a temporary file in
  the same folder and renamed into place (``os.replace``), the destination is
  checked again at that moment, and the files of a run directory are put in place
  with ``summary.json`` (which lists them, see :data:`MARKER`) last.

Operating-system errors become :class:`moesim.errors.InputError` (one line, exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from moesim import __version__
from moesim.errors import InputError

#: key of summary.json that marks a folder as a moesim run and lists the files it wrote
MARKER = "moesim_output"
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


# ---------------------------------------------------------------- run folders

def run_manifest(folder: Path) -> dict | None:
    """The :data:`MARKER` record of ``folder/summary.json`` when moesim wrote it, else None."""
    try:
        doc = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    rec = doc.get(MARKER) if isinstance(doc, dict) else None
    if isinstance(rec, dict) and isinstance(rec.get("files"), list):
        return rec
    return None


def owned_files(folder: Path) -> set[str]:
    """Names in ``folder`` that moesim wrote there (listed in its summary.json marker)."""
    rec = run_manifest(folder)
    if rec is None:
        return set()
    return {str(f) for f in rec["files"]} | {"summary.json"}


def foreign_files(folder: Path) -> list[str]:
    """Names in ``folder`` moesim did not write (left-over temporary files and the lock
    of a run writing there excepted)."""
    if not folder.is_dir():
        return []
    own = owned_files(folder) | {LOCK_NAME}
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in own and not is_temporary(p.name))


# ---------------------------------------------------------------- one run per folder

#: the lock file of a run folder while a run is writing there
LOCK_NAME = ".moesim.lock"


@contextlib.contextmanager
def claim(folder: str | Path, flag: str = "-o") -> Iterator[Path]:
    """Hold ``folder`` (made if missing) for one run: a second :func:`claim` of it, from
    this or any other process, raises InputError naming the holder until this one ends.

    The lock is ``fcntl.flock`` on ``folder/.moesim.lock``: the kernel releases it when
    the holder exits, so a killed run leaves no stale lock (its file is taken over). The
    holder removes the file when done; a claimer that locked a file removed meanwhile
    tries again, so two runs never hold two different files. Where ``fcntl`` is missing
    (Windows) the file is created with ``O_CREAT | O_EXCL`` instead. A folder the claim
    made and left empty is removed again."""
    folder = Path(folder)
    made = not folder.exists()
    make_dir(folder)
    path = folder / LOCK_NAME
    fd = _lock(path, flag)
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()      # only if empty: the run failed before writing


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return f"in use by another moesim run ({text})" if text else "in use by another moesim run"


def _busy(path: Path, flag: str) -> InputError:
    return InputError(str(path.parent), flag, "a folder no other run is writing to at the "
                      "same time (wait for it to finish or choose another -o)", _holder(path))


def _lock(path: Path, flag: str) -> int:
    me = f"pid {os.getpid()} on {socket.gethostname()}"
    try:
        import fcntl
    except ImportError:        # no flock: the file itself is the lock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise _busy(path, flag) from None
        except OSError as err:
            raise os_error(path, err) from None
        os.write(fd, me.encode())
        return fd
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise os_error(path, err) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise _busy(path, flag) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:            # else the holder removed it between our open and flock
            os.ftruncate(fd, 0)
            os.write(fd, me.encode())
            return fd
        os.close(fd)


def marker(files: list[str], complete: bool = True) -> dict:
    """The :data:`MARKER` record for summary.json."""
    rec: dict[str, Any] = {"version": __version__, "files": sorted(files)}
    if not complete:
        rec["complete"] = False
    return rec


class Outputs:
    """The files of one run folder, written atomically, ``summary.json`` last.

    ``add(name, write)`` writes ``name`` to a temporary file at once;
    ``commit(summary)`` checks every destination again (a file that appeared since,
    not listed in the folder's moesim marker, is refused unless ``force``), marks the
    folder incomplete (summary.json replaced by a marker listing old and new files),
    renames the files into place, removes the files of moesim's previous run there that
    this one does not write (e.g. a ``plot`` of it) and writes the new summary.json
    (with the marker) last. An interruption before the commit leaves the previous run; during it, a
    folder whose summary.json says ``complete: false`` (which ``plot``/``compare``
    refuse and a rerun replaces)."""

    def __init__(self, folder: str | Path, *, force: bool) -> None:
        self.folder = make_dir(Path(folder))
        self.force = force
        self._tmp: dict[str, Path] = {}

    def reserve(self, name: str) -> Path:
        """The temporary path ``name`` is written to (by :meth:`run`, or by another
        process, e.g. a forked writer), registered for the commit."""
        self._tmp[name] = _tmp_path(self.folder / name)
        return self._tmp[name]

    def run(self, name: str, write: Callable[[], Any]) -> None:
        """Call ``write()``, which writes ``name``'s reserved temporary path."""
        try:
            write()
        except OSError as err:
            raise os_error(self.folder / name, err) from None

    def add(self, name: str, write: Callable[[Path], Any]) -> Path:
        """Write ``name`` now, to its temporary path: ``write(tmp)``."""
        tmp = self.reserve(name)
        self.run(name, lambda: write(tmp))
        return self.folder / name

    def discard(self) -> None:
        for tmp in self._tmp.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._tmp.clear()

    def commit(self, summary: dict, render: Callable[[dict], str] | None = None) -> list[Path]:
        """Put every added file in place, then summary.json (``summary`` plus the marker,
        and, with ``render``, summary.md = ``render(summary)`` before it)."""
        try:
            names = sorted({*self._tmp, "summary.json", *(["summary.md"] if render else [])})
            summary = {**summary, MARKER: marker(names)}
            if render is not None:
                self.add("summary.md", lambda t: t.write_text(render(summary)))
            self.add("summary.json", lambda t: t.write_text(
                json.dumps(summary, indent=1, allow_nan=False) + "\n"))
            own = owned_files(self.folder)
            may = (lambda p: True) if self.force else (lambda p: p.name in own)
            for name in names:
                p = self.folder / name
                if (p.exists() or p.is_symlink()) and not may(p):
                    raise InputError(str(p), "output", "a file moesim wrote (pass --force to "
                                     "replace it)", "a file moesim did not write")
            # from here the folder holds no complete run until the new summary.json
            old = owned_files(self.folder) - {"summary.json"}
            if (self.folder / "summary.json").exists():
                inc = {MARKER: marker(sorted(old | set(names)), complete=False)}
                self._write_now("summary.json", json.dumps(inc) + "\n", may)
            paths = []
            for name in names:
                if name != "summary.json":
                    _put(self._tmp[name], self.folder / name, may)
                    del self._tmp[name]
                    paths.append(self.folder / name)
            for name in sorted(old - set(names)):   # the previous run's other files
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    (self.folder / name).unlink()
            _put(self._tmp["summary.json"], self.folder / "summary.json", lambda p: True)
            del self._tmp["summary.json"]
            return [*paths, self.folder / "summary.json"]
        finally:
            self.discard()

    def _write_now(self, name: str, text: str, may: Callable[[Path], bool]) -> None:
        path = self.folder / name
        with _temporary(path, ".marker") as tmp:
            try:
                tmp.write_text(text)
            except OSError as err:
                raise os_error(path, err) from None
            _put(tmp, path, may)


def register(folder: Path, name: str) -> None:
    """List ``name`` (just written into ``folder``) among the files of the moesim run
    there, so that a rerun replaces it instead of refusing it; nothing where ``folder``
    holds no complete moesim run."""
    rec = run_manifest(folder)
    if rec is None or rec.get("complete") is False or name in rec["files"]:
        return
    doc = json.loads((folder / "summary.json").read_text())
    doc[MARKER] = marker([*rec["files"], name])
    write_text(folder / "summary.json", json.dumps(doc, indent=1, allow_nan=False) + "\n",
               force=True)
