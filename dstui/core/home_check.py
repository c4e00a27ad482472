"""A runs home that cannot be written (read-only mount, no permission, disk full) is one line, before any work.

Every command but the ones that only print (`list`, `run --dry-run`, `ui`) writes
to the home: locks, run folders, status files, the MLflow store, the library log.
`status` is asked too, but shows the batches it can read before it says the line
(a full disk is when a person most needs to see them), settling and starting nothing.
On a read-only home they crashed with a traceback each (issue 40.6: `run`,
`status`, `report`, `import`; the library log handler's mkdir came first), half
way through their work. :func:`check_writable` is asked first, by the CLI, and
says what is wrong in one line (exit 2) before anything is touched:

* less than :data:`MIN_FREE_BYTES` free is a full home (a run folder, a status
  update or an MLflow transaction would fail part way), said before anything else;
* a folder that exists is then tried with a small file of its own, written and
  removed (only that shows a read-only mount or a permission for certain);
* one not made yet is judged by its nearest existing parent, without making anything.

:func:`problem_of` names the same trouble when it strikes later (the disk fills
during a command): the CLI turns such an error into the same kind of line.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from dstui.core import paths
from dstui.core.errors import DstuiError

MIN_FREE_BYTES = 1 << 20
READ_ONLY = (errno.EROFS,)
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
NOT_ALLOWED = (errno.EACCES, errno.EPERM)
ADVICE = "set DSTUI_HOME to a writable folder with room"


class HomeNotWritable(DstuiError):
    """The runs home is read-only, not this user's to write, or full."""


def folders() -> list[Path]:
    """The home, and the run folders' parent when DSTUI_RUNS_DIR moved it elsewhere."""
    home, runs = paths.home(), paths.runs_dir()
    return [home] if runs.is_relative_to(home) else [home, runs]


def check_writable() -> None:
    """Raise :class:`HomeNotWritable` (one line) unless every folder of the home can be written and has room."""
    for folder in folders():
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        try:
            free = os.statvfs(existing)
            room = free.f_bavail * free.f_frsize
            if room < MIN_FREE_BYTES and not free.f_flag & os.ST_RDONLY:  # said before the probe: it would touch the folder
                raise HomeNotWritable(f"the runs home {folder} is full ({room >> 10} KiB free): free some space, or {ADVICE}")
            if existing == folder:
                _probe(folder)
            elif not os.access(existing, os.W_OK | os.X_OK):
                raise OSError(errno.EROFS if free.f_flag & os.ST_RDONLY else errno.EACCES, "", str(existing))
        except OSError as e:
            raise HomeNotWritable(describe(e, folder)) from None


def unwritable() -> str | None:
    """The one line of :func:`check_writable`'s trouble, None when the home can be written."""
    try:
        check_writable()
    except HomeNotWritable as e:
        return str(e)
    return None


def _probe(folder: Path) -> None:
    fd, name = tempfile.mkstemp(prefix=".dstui-write-check-", dir=folder)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
        os.unlink(name)


def describe(e: OSError, folder: Path) -> str:
    """One line for a home that could not be written, by what the system said."""
    if e.errno in READ_ONLY:
        return f"the runs home {folder} is on a read-only file system: dstui keeps its runs, locks and MLflow store there; {ADVICE}"
    if e.errno in NO_ROOM:
        return f"the runs home {folder} is full ({os.strerror(e.errno)}): free some space, or {ADVICE}"
    if e.errno in NOT_ALLOWED:
        return f"the runs home {folder} is not writable by this user ({os.strerror(e.errno)}); {ADVICE}"
    return f"the runs home {folder} cannot be written ({e.strerror or e}); {ADVICE}"


SQLITE_WORDS = {"readonly database": errno.EROFS, "database or disk is full": errno.ENOSPC}


def problem_of(e: BaseException | None) -> str | None:
    """The one line for an error met part way that says a disk cannot be written, else None.

    An OSError of a read-only, full or over-quota disk anywhere in the error's
    chain (about the home, or a file elsewhere: a report's folder), or SQLite's
    words for the same (MLflow wraps them in SQLAlchemy's errors: the store is the home's).
    """
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (*READ_ONLY, *NO_ROOM):
            where = Path(e.filename) if e.filename else None
            if where is None or where.absolute().is_relative_to(paths.home()):
                return describe(e, paths.home())
            return f"{where}: {os.strerror(e.errno)}"
        text = str(e).lower()
        for words, code in SQLITE_WORDS.items():
            if words in text:
                return describe(OSError(code, os.strerror(code)), paths.home())
        e = e.__cause__ or e.__context__
    return None
