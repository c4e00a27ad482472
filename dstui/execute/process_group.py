"""A local job's processes: is any of it alive, and stopping all of it — never anyone else's.

Each local run is its own session (:mod:`dstui.execute.injob.wrap` leads it), so
its launcher and ranks are one process group that can be asked about and killed
at once, also by a process that did not start it (a supervisor that took over,
``dstui cancel``, the GPU ledger checking who still holds GPUs).

A recorded group id is not enough to find it again: after a crash or a reboot the
kernel hands the number to any process (a ``dstui status`` takeover killed an
unrelated ``setsid sleep`` that had got it, as "hung"). So a job is known by
:class:`JobProcesses`: its leader's number *and* start time on this boot, and the
token every process of the job carries in its environment
(:mod:`dstui.core.proc_identity`). Before any signal and any "alive" verdict the
leader is checked; a mismatch means the job is gone. Its processes are the group
while its leader is the recorded one, plus every process carrying the token
(helpers that left the job's session with ``setsid``; ranks that outlived a killed
leader), so ``dstui cancel`` ends those too. One small race stays: a whole job
ending and its number coming round again between the check and the group signal
(microseconds; each single process is signalled through a pidfd checked first).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import psutil

from dstui.core import proc_identity as ident

KILL_GRACE_S = 5.0


def group_alive(pgid: int | None) -> bool:
    """Whether any live process has this group id (no identity check: a group you started and hold)."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader still "exists"; look for a live member
    for p in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(p.info["pid"]) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def kill_group(pgid: int | None, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM a whole process group, then SIGKILL what is left (no identity check: see :func:`stop_job`)."""
    if not pgid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and group_alive(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass(frozen=True)
class JobProcesses:
    """A job as status.json records it: its group (= its leader's pid), the leader's start, the boot, the token."""

    pgid: int
    start: int | None  # the leader's start in clock ticks since boot; None: recorded before dstui kept it
    boot: str | None
    token: str | None

    @classmethod
    def of(cls, st: dict[str, Any]) -> JobProcesses | None:
        pgid = st.get("pgid")
        if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
            return None
        start = st.get("pid_start")
        return cls(pgid, start if isinstance(start, int) else None, st.get("boot_id"), st.get(ident.TOKEN_FIELD))

    @property
    def recorded_whole(self) -> bool:
        """False for a status written before dstui recorded a leader's start (then only the group id is known)."""
        return self.start is not None

    def other_boot(self) -> bool:
        now = ident.boot_id()
        return self.boot is not None and now is not None and self.boot != now

    def leader_is_ours(self) -> bool:
        """The process with the group's number is the job's leader (alive or a zombie), not a newcomer."""
        return not self.other_boot() and ident.is_same(self.pgid, self.start, self.boot)

    def members(self) -> dict[int, int]:
        """The job's live processes (pid -> start ticks): its group while the leader is the recorded one,
        and every process carrying its token that started after it (helpers in sessions of their own)."""
        if not self.recorded_whole or self.other_boot():
            return {}
        ours = self.leader_is_ours()
        found: dict[int, int] = {}
        for pid in ident.own_pids():
            fields = ident.stat_fields(pid)
            if not fields or fields[0] == "Z" or pid == os.getpid():
                continue
            try:
                pgrp, ticks = int(fields[2]), int(fields[19])
            except (IndexError, ValueError):
                continue
            if (ours and pgrp == self.pgid) or (
                self.token and ticks >= (self.start or 0) and ident.carries_token(pid, self.token)
            ):
                found[pid] = ticks
        return found

    def alive(self) -> bool:
        if not self.recorded_whole:
            return group_alive(self.pgid)
        if self.leader_is_ours() and ident.state_of(self.pgid) != "Z":
            return True
        return bool(self.members())

    def signal(self, sig: int) -> int:
        """Send ``sig`` to every process of the job (and to nothing else); how many were signalled."""
        if not self.recorded_whole:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
            return 1
        members = self.members()
        if self.leader_is_ours():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)  # at once, so a rank forking now is not missed
            members = {p: t for p, t in members.items() if ident.pgid_of(p) != self.pgid}
        for pid, ticks in members.items():
            send_checked(pid, ticks, sig)
        return len(members)

    def stop(self, grace_s: float = KILL_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` what of the job is left."""
        self.signal(signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and self.alive():
            time.sleep(0.1)
        self.signal(signal.SIGKILL)


def send_checked(pid: int, ticks: int, sig: int) -> None:
    """Signal one process only if it is still the one that started at ``ticks`` (through a pidfd when the
    system has them: the check and the signal then reach the same process)."""
    fd = None
    with contextlib.suppress(AttributeError, OSError):
        fd = os.pidfd_open(pid)
    try:
        if ident.start_ticks(pid) != ticks:
            return
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    finally:
        if fd is not None:
            os.close(fd)


def job_alive(st: dict[str, Any]) -> bool:
    """Whether any process of the job a status records still runs (a process that took its number does not count)."""
    job = JobProcesses.of(st)
    return job is not None and job.alive()


def stop_job(st: dict[str, Any], grace_s: float = KILL_GRACE_S) -> None:
    """Stop every process of the job a status records, and nothing else."""
    job = JobProcesses.of(st)
    if job is not None:
        job.stop(grace_s)


def record(pid: int, token: str) -> dict[str, Any]:
    """status.json's fields that make a job known again: its group, the leader's start and boot, its token."""
    return {"pid": pid, "pgid": pid, **ident.identity(pid), ident.TOKEN_FIELD: token}
