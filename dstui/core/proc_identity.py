"""Which process is which: a process is its number *and* its start, on this boot.

A PID alone names a process only while it lives: the kernel hands the number to
the next process once it is free (on a busy machine within minutes). A run's
status.json outlives its job (a crash, a reboot, ``kill -9`` of the supervisor and
the job), and a ``dstui status`` takeover or ``dstui cancel`` that signals the
recorded number kills whatever holds it now. So a job is recorded with its
leader's start time (clock ticks since boot, ``/proc/<pid>/stat`` field 22) and the
boot id, and every process the job starts carries a marker in its environment
(:data:`JOB_TOKEN_ENV`, a random token per launch), which a helper that leaves the
job's session keeps too. :mod:`dstui.execute.process_group` signals only processes
that match.

Stdlib only and Linux-first (``/proc``); where ``/proc`` is missing nothing can be
verified and the callers fall back to what they did before.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
#: every process of a job carries ``DSTUI_JOB_TOKEN=<token of that launch>`` (children inherit it)
JOB_TOKEN_ENV = "DSTUI_JOB_TOKEN"
TOKEN_FIELD = "job_token"  # where status.json keeps it
ENVIRON_MAX_BYTES = 1 << 20  # a process's environment read at most this far


def new_token() -> str:
    return secrets.token_hex(16)


def boot_id() -> str | None:
    """This boot's id: processes recorded under another boot are all gone."""
    try:
        with open(BOOT_ID_FILE) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses): field 3 first."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            raw = fh.read(4096).decode("ascii", "replace")
    except (OSError, ValueError):
        return None
    close = raw.rfind(")")
    return raw[close + 2 :].split() if close >= 0 else None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (None: no such process, or no /proc)."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of stat(5): starttime
    except (IndexError, ValueError):
        return None


def state_of(pid: int) -> str | None:
    """The process's state letter (R, S, D, T stopped, t traced, Z zombie, ...), None when gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def pgid_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    try:
        return int(fields[2]) if fields else None  # field 5 of stat(5): pgrp
    except (IndexError, ValueError):
        return None


def identity(pid: int) -> dict[str, object]:
    """What to record beside a job's leader so that it is known again: its start and the boot."""
    return {"pid_start": start_ticks(pid), "boot_id": boot_id()}


def is_same(pid: int, start: int | None, boot: str | None) -> bool:
    """True when ``pid`` is still the process recorded with ``start`` on boot ``boot`` (a zombie included)."""
    if not pid or start is None:
        return False
    if boot is not None and boot != boot_id():
        return False
    return start_ticks(pid) == start


def own_pids() -> Iterator[int]:
    """This user's processes (only those can be signalled anyway), from /proc."""
    uid = os.getuid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                yield int(name)
        except OSError:
            continue


def carries_token(pid: int, token: str) -> bool:
    """True when the process's environment holds ``DSTUI_JOB_TOKEN=token`` (it was started by the job)."""
    if not token:
        return False
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as fh:
            env = fh.read(ENVIRON_MAX_BYTES)
    except (OSError, ValueError):
        return False
    entry = f"{JOB_TOKEN_ENV}={token}".encode()
    return env.startswith(entry + b"\0") or (b"\0" + entry + b"\0") in env or env == entry
