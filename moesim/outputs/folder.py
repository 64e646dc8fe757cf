"""A run's folder: one run writes it at a time, its files are marked as the run's own,
and a rerun of the same command and scenario replaces them.

- :func:`claim`: a run folder belongs to one run at a time (a lock on
  ``FOLDER/.moesim.lock`` held from the check before the work to the last rename); a
  second run writing there at once fails in one line naming the first ("being written
  by another moesim run (pid N on HOST)"), never "files moesim did not write";
- :func:`check_run_folder`: before the long work, and again under the claim: the
  folder can be written, no other run is writing it, it holds nothing moesim did not
  write and, unless ``force``, no outputs of another command or another scenario;
- :class:`Outputs`: the files of one run, written atomically, ``summary.json`` last; its
  :data:`MARKER` record lists the files, the command that wrote them and the run's
  identity (a hash of its scenario), which is how a folder is recognised as a run's own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from moesim import __version__
from moesim.errors import InputError
from moesim.outputs import files
from moesim.outputs.files import _put, _temporary, _tmp_path, is_temporary, make_dir, os_error

#: key of summary.json that marks a folder as a moesim run and lists the files it wrote
MARKER = "moesim_output"
#: the lock file of a run folder while a run is writing there
LOCK_NAME = ".moesim.lock"

_command: list[str | None] = [None]     # the moesim command this process runs
_held: dict[str, str | None] = {}       # folders this process has claimed -> identity key


def set_command(name: str | None) -> None:
    """Name the moesim command this process runs (``moesim.cli.main`` does): the
    marker of every folder it writes records it, and another command's folder is
    refused without ``--force``."""
    _command[0] = name


def identity_key(identity: Any) -> str:
    """A short, stable hash of what a run is (its scenario as a dict, a sweep's name)."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _key(folder: Path) -> str:
    return os.path.realpath(folder)


# ---------------------------------------------------------------- what a folder holds

def run_manifest(folder: Path) -> dict | None:
    """The :data:`MARKER` record of ``folder/summary.json`` when moesim wrote it, else None."""
    try:
        doc = json.loads((Path(folder) / "summary.json").read_text())
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
    folder = Path(folder)
    if not folder.is_dir():
        return []
    own = owned_files(folder) | {LOCK_NAME}
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in own and not is_temporary(p.name))


def marker(names: list[str], complete: bool = True, *, command: str | None = None,
           identity: str | None = None) -> dict:
    """The :data:`MARKER` record for summary.json: moesim's version, the files, and
    (when known) the command that wrote them and the run's identity key."""
    rec: dict[str, Any] = {"version": __version__, "files": sorted(names)}
    if command:
        rec["command"] = command
    if identity:
        rec["identity"] = identity
    if not complete:
        rec["complete"] = False
    return rec


# ---------------------------------------------------------------- one run per folder

def busy_holder(folder: str | Path) -> str | None:
    """Who is writing ``folder`` now ("pid N on HOST") when another run holds its
    claim; None when nobody does (or this process does)."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    if _key(folder) in _held or not path.exists():
        return None
    try:
        import fcntl
    except ImportError:        # no flock: the lock file's existence is the claim
        return _holder_text(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _holder_text(path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _holder_text(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "pid unknown"


def _busy(folder: Path, flag: str, holder: str) -> InputError:
    return InputError(str(folder), flag, "a folder no other run is writing to at the same "
                      "time (wait for it to finish or choose another -o)",
                      f"being written by another moesim run ({holder})")


def check_dir_target(path: str | Path, flag: str = "-o") -> Path:
    """:func:`moesim.outputs.files.check_dir_target`, and no other run writing there."""
    p = files.check_dir_target(path, flag)
    if p.is_dir():
        holder = busy_holder(p)
        if holder:
            raise _busy(p, flag, holder)
    return p


def check_run_folder(folder: str | Path, force: bool, *, identity: Any = None,
                     flag: str = "-o") -> Path:
    """Check ``folder`` before a run writes it (before the long work, and again under
    :func:`claim`): writable, no other run writing it, and, unless ``force``, holding
    only files moesim wrote, of this command (:func:`set_command`) and, with
    ``identity`` (e.g. the scenario as a dict), of this same run."""
    p = check_dir_target(folder, flag)
    if force or not p.is_dir():
        return p
    foreign = foreign_files(p)
    if foreign:
        raise InputError(str(p), flag, "a new folder or one holding only moesim's outputs "
                         "(pass --force to write there anyway)",
                         "files moesim did not write: " + ", ".join(foreign[:5]))
    rec = run_manifest(p)      # (an interrupted run's marker says whose it was too)
    if rec is None:
        return p
    theirs, mine = rec.get("command"), _command[0]
    if theirs and mine and theirs != mine:
        raise InputError(str(p), flag, f"a new folder or one of `moesim {mine}` (pass "
                         "--force to replace its outputs)", f"the outputs of `moesim {theirs}`")
    if identity is not None and rec.get("identity") not in (None, identity_key(identity)):
        raise InputError(str(p), flag, "a new folder or this run's own (pass --force to "
                         "replace its outputs)", "the outputs of another scenario or settings")
    return p


@contextlib.contextmanager
def claim(folder: str | Path, flag: str = "-o", *, force: bool | None = None,
          identity: Any = None) -> Iterator[Path]:
    """Hold ``folder`` (made if missing) for one run: a second :func:`claim` of it, from
    any other process, raises InputError naming the holder until this one ends. With
    ``force`` given (True or False), :func:`check_run_folder` is run again once the
    folder is held; ``identity`` is recorded in the marker :class:`Outputs` writes.

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
    key = _key(folder)
    _held[key] = identity_key(identity) if identity is not None else None
    try:
        if force is not None:
            check_run_folder(folder, force, identity=identity, flag=flag)
        yield folder
    finally:
        _held.pop(key, None)
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()      # only if empty: the run failed before writing


#: how long a claimer retries a lock someone holds (a reader of :func:`busy_holder`
#: holds it for microseconds), seconds
_RETRY_S = 0.2


def _lock(path: Path, flag: str) -> int:
    me = f"pid {os.getpid()} on {socket.gethostname()}"
    try:
        import fcntl
    except ImportError:        # no flock: the file itself is the lock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise _busy(path.parent, flag, _holder_text(path)) from None
        except OSError as err:
            raise os_error(path, err) from None
        os.write(fd, me.encode())
        return fd
    deadline = time.monotonic() + _RETRY_S
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise os_error(path, err) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            raise _busy(path.parent, flag, _holder_text(path)) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:            # else the holder removed it between our open and flock
            os.ftruncate(fd, 0)
            os.write(fd, me.encode())
            return fd
        os.close(fd)


# ---------------------------------------------------------------- writing a run's files

class Outputs:
    """The files of one run folder, written atomically, ``summary.json`` last.

    ``add(name, write)`` writes ``name`` to a temporary file at once; ``adopt(name)``
    lists a file the run has already put in place itself (an append-only log);
    ``commit(summary)`` checks every destination again (a file that appeared since,
    not listed in the folder's moesim marker, is refused unless ``force``), marks the
    folder incomplete (summary.json replaced by a marker listing old and new files),
    renames the files into place, removes the files of moesim's previous run there that
    this one does not write (e.g. a ``plot`` of it) and writes the new summary.json
    (with the marker: files, command, identity of the claim) last. An interruption
    before the commit leaves the previous run; during it, a folder whose summary.json
    says ``complete: false`` (which ``plot``/``compare`` refuse and a rerun replaces)."""

    def __init__(self, folder: str | Path, *, force: bool) -> None:
        self.folder = make_dir(Path(folder))
        self.force = force
        self.command = _command[0]
        self.identity = _held.get(_key(self.folder))
        self._tmp: dict[str, Path] = {}
        self._adopted: set[str] = set()

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

    def adopt(self, *names: str) -> None:
        """List files this run already wrote in place (atomically, or append-only) as
        its own in the marker."""
        self._adopted.update(names)

    def discard(self) -> None:
        for tmp in self._tmp.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._tmp.clear()

    def _marker(self, names: list[str], complete: bool = True) -> dict:
        return marker(names, complete, command=self.command, identity=self.identity)

    def commit(self, summary: dict, render: Callable[[dict], str] | None = None) -> list[Path]:
        """Put every added file in place, then summary.json (``summary`` plus the marker,
        and, with ``render``, summary.md = ``render(summary)`` before it)."""
        try:
            names = sorted({*self._tmp, *self._adopted, "summary.json",
                            *(["summary.md"] if render else [])})
            summary = {**summary, MARKER: self._marker(names)}
            if render is not None:
                self.add("summary.md", lambda t: t.write_text(render(summary)))
            self.add("summary.json", lambda t: t.write_text(
                json.dumps(summary, indent=1, allow_nan=False) + "\n"))
            own = owned_files(self.folder)
            may = (lambda p: True) if self.force else (lambda p: p.name in own)
            for name in self._tmp:
                p = self.folder / name
                if (p.exists() or p.is_symlink()) and not may(p):
                    raise InputError(str(p), "output", "a file moesim wrote (pass --force to "
                                     "replace it)", "a file moesim did not write")
            # from here the folder holds no complete run until the new summary.json
            old = owned_files(self.folder) - {"summary.json"}
            inc = {MARKER: self._marker(sorted(old | set(names)), complete=False)}
            self._write_now("summary.json", json.dumps(inc) + "\n", may)
            paths = []
            for name in names:
                if name != "summary.json" and name in self._tmp:
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
    doc[MARKER] = {**rec, "files": sorted([*rec["files"], name])}
    files.write_text(folder / "summary.json",
                     json.dumps(doc, indent=1, allow_nan=False) + "\n", force=True)
