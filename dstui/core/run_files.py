"""Files a run wrote, read as untrusted input: never through a link, regular files only, bounded.

A run folder belongs to the job as much as to dstui: the job can replace its
``metrics.jsonl`` with a link to ``/dev/zero`` (an endless read: a supervisor grew
to 18.5 GB and was OOM-killed on every takeover), to a FIFO (a read that never
returns: one run's link froze the whole batch) or to a file outside the home. So
every read of a run's file here

- opens the name itself, never what a link points to (``O_NOFOLLOW``), without
  blocking (``O_NONBLOCK``: a FIFO opens at once and is then refused),
- accepts only a regular file (checked on the open descriptor, so the name cannot be
  swapped between the check and the read),
- reads at most a given number of bytes, and steps over a sparse file's holes
  (``SEEK_DATA``) instead of reading gigabytes of zeros.

Anything else raises :class:`NotRegular`, whose message names what the file is
(``metrics.jsonl is a symbolic link (to /dev/zero): not read``); callers make it a
named problem of that run alone. Stdlib only: the job's wrapper imports the run
folder layout, which uses this module.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
#: how much of a link's target a message shows (it is the job's text)
TARGET_CHARS = 80


class NotRegular(OSError):
    """A run's file that is not a regular file of its own (a link, a FIFO, a device, a folder)."""


def kind_of(mode: int) -> str:
    """What a file of this mode is, in words."""
    for test, words in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return words
    return "not a regular file"


def describe(path: str | os.PathLike[str]) -> str:
    """``NAME is a symbolic link (to TARGET): not read``, from the name alone (nothing followed)."""
    name = os.path.basename(os.fspath(path))
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        return f"{name}: {e.strerror or e}"
    what = kind_of(mode)
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            target = os.readlink(path)
            shown = "".join(c if c.isprintable() else "?" for c in target[:TARGET_CHARS])
            what += f" (to {shown}{'...' if len(target) > TARGET_CHARS else ''})"
    return f"{name} is {what}: not read"


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path`` when it is a regular file; :class:`NotRegular` otherwise.

    FileNotFoundError passes through (a file not written yet is not a problem).
    """
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a link; ENXIO: a socket; EACCES and the like: name it too
        raise NotRegular(describe(path) if os.path.lexists(path) else str(e)) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegular(f"{os.path.basename(os.fspath(path))} is {kind_of(mode)}: not read")
    return fd


def open_append(path: str | os.PathLike[str]) -> int:
    """A descriptor to append to a file dstui writes in a run folder, never through a link; 0600 when new."""
    fd = os.open(path, APPEND_FLAGS, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(f"{os.path.basename(os.fspath(path))} is not a regular file: not written")
    return fd


def next_data(fd: int, offset: int, size: int) -> int:
    """The first offset at or after ``offset`` that holds data (a sparse file's holes hold zeros only);
    ``size`` when only a hole is left, ``offset`` where the file system cannot tell."""
    if offset >= size:
        return offset
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as e:
        import errno

        return size if e.errno == errno.ENXIO else offset  # ENXIO: nothing but a hole after offset
    except AttributeError:  # no SEEK_DATA on this platform
        return offset


def read_small(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The whole of a regular file of at most ``limit`` bytes, None when it is larger (nothing read then)."""
    fd = open_regular(path)
    try:
        if os.fstat(fd).st_size > limit:
            return None
        data = _read(fd, limit + 1)
        return data if len(data) <= limit else None
    finally:
        os.close(fd)


def read_tail(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most the last ``limit`` bytes of a regular file (:class:`NotRegular` otherwise)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        return _read(fd, limit)
    finally:
        os.close(fd)


def _read(fd: int, limit: int) -> bytes:
    parts: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def iter_lines(path: str | os.PathLike[str], max_line: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a finished regular file (the last one unterminated too), each at most ``max_line``
    bytes: a longer one is skipped whole. Memory stays within ``max_line`` + ``chunk``; holes of a
    sparse file are stepped over, not read. :class:`NotRegular` for anything but a regular file."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        offset, partial, skipping = 0, b"", False
        while offset < size:
            data = next_data(fd, offset, size)
            if data - offset > max_line - len(partial):  # a hole longer than any line: the line is over-long
                partial, skipping, offset = b"", True, data
                continue
            os.lseek(fd, offset, os.SEEK_SET)
            block = os.read(fd, min(chunk, size - offset))
            if not block:
                break
            offset += len(block)
            lines = (partial + block).split(b"\n")
            partial = lines.pop()
            for line in lines:
                if skipping:
                    skipping = False
                    continue
                if len(line) <= max_line:
                    yield line
            if len(partial) > max_line:
                partial, skipping = b"", True
        if partial and not skipping:
            yield partial
    finally:
        os.close(fd)
