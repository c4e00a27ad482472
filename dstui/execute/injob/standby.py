"""A batch's standby: starts its supervisor again when it dies while no job would.

A batch's supervisor may die at any instant (``kill -9``, the OOM killer). While a
run's job lives, nothing is lost: its wrapper (:mod:`dstui.execute.injob.wrap`)
wakes a supervisor when the job ends. But a supervisor killed *between* one run's
end and the next start left the queue stopped until someone ran dstui (109 s and
90 s measured): the ending job's wrapper had looked, found the supervisor alive,
and exited. So there is a standby whenever no job keeps that watch: the supervisor
starts one when it takes the batch, every ending job's wrapper starts one, and it
lives until a job whose wrapper will wake the batch is running again, or the batch
is finalized. Meanwhile it polls the batch lock and, when the lock is free, starts
a supervisor (at most :data:`MAX_STARTS` times: one that keeps dying is left for a
person, with a line in supervisor.log).

One standby per batch (``supervisor.standby.lock``); stdlib and dstui's core only,
because the wrapper starts it from inside the job.
Usage: python -m dstui.execute.injob.standby BATCH_DIR
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from dstui.core import proc_identity
from dstui.core.rundir import BATCH_FILE, EXIT_FILE, LOCK_FILE, SUPERVISOR_LOG, BatchDir, read_json

STANDBY_LOCK = "supervisor.standby.lock"
POLL_S = 0.5
MAX_STARTS = 3
START_WAIT_S = 60.0  # a supervisor's imports take seconds on a loaded box; it holds the lock after them


def held(path: str) -> bool:
    """True when a live process holds the flock on ``path``."""
    try:
        with open(path, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def ensure(batch: str, env: dict[str, str] | None = None) -> bool:
    """Start the batch's standby unless one runs; True when one was started."""
    if not os.path.exists(os.path.join(batch, BATCH_FILE)) or held(os.path.join(batch, STANDBY_LOCK)):
        return False
    base = dict(os.environ if env is None else env)
    base.pop(proc_identity.JOB_TOKEN_ENV, None)  # never a process of a job: its cancel would end it
    try:
        with open(os.path.join(batch, SUPERVISOR_LOG), "ab") as out:
            subprocess.Popen(
                [sys.executable, "-m", "dstui.execute.injob.standby", batch],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, env=base,
            )  # fmt: skip
    except OSError:
        return False
    return True


def watched_by_a_job(batch: BatchDir) -> bool:
    """A run's job is running, and its wrapper (checked by start time, not the number alone) will wake
    the batch when it ends."""
    for rd in batch.runs():
        st = rd.status()
        if st.get("state") != "running" or os.path.lexists(rd.path / EXIT_FILE):
            continue
        pid = st.get("pid")
        if isinstance(pid, int) and proc_identity.is_same(pid, st.get("pid_start"), st.get("boot_id")):
            return True
    return False


def start_supervisor(batch: str, env: dict[str, str] | None) -> subprocess.Popen:
    """``dstui supervise BATCH`` detached (its own session), logging to the batch's supervisor.log.

    Here, stdlib only, because the wrapper and the standby use it too.
    """
    from dstui.execute import bytecode

    base = dict(os.environ if env is None else env)
    base.pop(proc_identity.JOB_TOKEN_ENV, None)  # never a process of a job: its cancel would end it
    with open(os.path.join(batch, SUPERVISOR_LOG), "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dstui", "supervise", batch],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=bytecode.apply(base),
        )


def take_over(batch: str) -> None:
    """Start a supervisor, then wait until it holds the lock (its imports take seconds) or exits."""
    proc = start_supervisor(batch, None)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline and proc.poll() is None and not held(os.path.join(batch, LOCK_FILE)):
        time.sleep(0.05)


def say(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} standby (pid {os.getpid()}): {text}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dstui.execute.injob.standby BATCH_DIR", file=sys.stderr)
        return 2
    batch_path = os.path.abspath(argv[0])
    batch = BatchDir(Path(batch_path))
    try:
        lock = open(os.path.join(batch_path, STANDBY_LOCK), "a+")  # noqa: SIM115 - held for the process lifetime
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, OSError):
        return 0  # another standby watches this batch
    starts = 0
    while True:
        info = read_json(batch.batch_file)
        if not isinstance(info, dict) or info.get("finalized"):
            return 0
        if not held(os.path.join(batch_path, LOCK_FILE)):
            if starts >= MAX_STARTS:
                say(f"the supervisor stopped {starts} times; not starting it again (`dstui status` does)")
                return 1
            starts += 1
            say("the batch has no supervisor; starting one")
            take_over(batch_path)
            continue
        if watched_by_a_job(batch):
            return 0
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
