"""Session leader of a run: starts the job, waits, records how it ended.

The supervisor may die or be restarted while a run goes on; the exit status of
a process is only known to its parent, so this tiny wrapper (stdlib only, fast
to start) is that parent and writes ``exit.json`` into the run folder.

A full disk must not lose that record: before the job starts, the wrapper
reserves the record's room (:func:`reserve`, a hidden file of
:data:`RESERVED_BYTES` written out in full), and at the end overwrites it in
place and renames it to ``exit.json`` (:func:`record`), which needs no new
space. It also notes whether the run folder's disk was full when the job ended,
so the reason says "disk full" even when the job's own last words could not be
written to its log.
Usage: python -m dstui.execute.injob.wrap RUN_DIR -- ARGV...
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from dstui.core import startup_trace
from dstui.core.proc_identity import JOB_TOKEN_ENV
from dstui.core.rundir import EXIT_FILE
from dstui.execute.injob import standby

USAGE = "usage: python -m dstui.execute.injob.wrap RUN_DIR -- ARGV..."
RESERVED_BYTES = 4096  # one block: an exit record is ~150 bytes
DISK_FULL_BELOW = 1 << 20  # free bytes under which a failed job's disk counts as full


def parse_argv(argv: list[str]) -> tuple[str, list[str]]:
    """RUN_DIR and the job's argv; ValueError (with the usage) for anything else."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0]:
        raise ValueError(f"bad arguments {argv!r}; {USAGE}")
    if not os.path.isdir(argv[0]):
        raise ValueError(f"run folder {argv[0]!r} does not exist; {USAGE}")
    return argv[0], argv[2:]


def main(argv: list[str]) -> int:
    try:
        run_dir, cmd = parse_argv(argv)
    except ValueError as e:
        print(f"dstui.execute.injob.wrap: {e}", file=sys.stderr, flush=True)
        return 2
    # every Python process of the job dumps its stack on SIGSEGV/SIGABRT/SIGBUS into stdout.log,
    # so a rank's death names its innermost frame (dstui.core.failures.signal_death)
    env = {**os.environ, "PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER") or "1"}
    reserved = reserve(run_dir)
    startup_trace.mark("wrap_starts_job", "wrap")
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        print(f"dstui: cannot start {cmd[0]!r}: {e}", flush=True)
        record(run_dir, {"exit_code": 127, "signal": None, "error": str(e)}, reserved)
        return 127

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    code = child.wait()
    sig = -code if code < 0 else None
    ended = {"exit_code": code, "signal": sig, "ended": time.time()}
    if code != 0 and disk_full(run_dir):
        ended["disk_full"] = True
    record(run_dir, ended, reserved)
    wake_supervisor(run_dir)
    return code if code >= 0 else 128 + (sig or 0)


# the job's marker too: a supervisor started from here is not a process of the job (cancel would end it)
JOB_ONLY_ENV = ("DSTUI_RUN_DIR", "DSTUI_METRICS_FILE", "DSTUI_DS_CONFIG", "DSTUI_RUN_KEY", "PYTHONFAULTHANDLER", JOB_TOKEN_ENV)


def wake_supervisor(run_dir: str) -> bool:
    """A batch whose supervisor died is picked up when one of its jobs ends; and one that dies later
    too, before the next run starts: the batch's standby (:mod:`~dstui.execute.injob.standby`) watches
    from now until a job keeps that watch again. True when a standby was started.

    Without it, queued runs of a batch nobody looks at would wait forever: this wrapper used to
    look once, find the supervisor alive, and leave; a supervisor killed a moment later (between
    this run's end and the next start) then left the queue stopped.
    """
    batch = os.path.dirname(os.path.abspath(run_dir))
    return standby.ensure(batch, {k: v for k, v in os.environ.items() if k not in JOB_ONLY_ENV})


def reserve(run_dir: str) -> str | None:
    """A hidden file holding the exit record's room, written out now; None when even that fails.

    Per wrapper (its pid in the name): under Slurm one wrapper runs per task.
    """
    path = os.path.join(run_dir, f".{EXIT_FILE}.{os.getpid()}.reserved")
    try:
        with private_file(path) as fh:
            fh.write(b" " * RESERVED_BYTES)  # space is taken at write time (tmpfs; delayed allocation reserves it)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return path


def private_file(path: str):  # noqa: ANN201 - a binary file object
    """A new file of dstui's in the run folder: 0600 whatever the job's umask, never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "wb")


def disk_full(run_dir: str) -> bool:
    """True when the run folder's file system has (almost) no room left for its user."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < DISK_FULL_BELOW


def record(run_dir: str, data: dict, reserved: str | None) -> bool:
    """Write ``exit.json``: into the reserved room when there is one (no new space needed), else anew.

    JSON allows trailing blanks, so the record overwrites the reservation's start
    and the rest is cut off; then the file is renamed. False when nothing could be
    written (the supervisor falls back to the wrapper's own exit status).
    """
    path = os.path.join(run_dir, EXIT_FILE)
    text = json.dumps(data).encode()
    if reserved is not None and len(text) <= RESERVED_BYTES:
        try:
            with open(reserved, "r+b") as fh:
                fh.write(text)
                fh.truncate(len(text))
            os.replace(reserved, path)
            return True
        except OSError:
            pass
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with private_file(tmp) as fh:
            fh.write(text)
        os.replace(tmp, path)
        return True
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        with contextlib.suppress(OSError):
            print(f"dstui.execute.injob.wrap: cannot record the exit status in {path}: {e}", file=sys.stderr, flush=True)
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
