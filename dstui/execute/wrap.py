"""Session leader of a run: starts the job, waits, records how it ended.

The supervisor may die or be restarted while a run goes on; the exit status of
a process is only known to its parent, so this tiny wrapper (stdlib only, fast
to start) is that parent and writes ``exit.json`` into the run folder.
Usage: python -m dstui.execute.wrap RUN_DIR -- ARGV...
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

from dstui.core.rundir import BATCH_FILE, EXIT_FILE, LOCK_FILE, SUPERVISOR_LOG
from dstui.execute import bytecode

USAGE = "usage: python -m dstui.execute.wrap RUN_DIR -- ARGV..."


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
        print(f"dstui.execute.wrap: {e}", file=sys.stderr, flush=True)
        return 2
    # every Python process of the job dumps its stack on SIGSEGV/SIGABRT/SIGBUS into stdout.log,
    # so a rank's death names its innermost frame (dstui.core.failures.signal_death)
    env = {**os.environ, "PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER") or "1"}
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        print(f"dstui: cannot start {cmd[0]!r}: {e}", flush=True)
        _write(run_dir, {"exit_code": 127, "signal": None, "error": str(e)})
        return 127

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    code = child.wait()
    sig = -code if code < 0 else None
    _write(run_dir, {"exit_code": code, "signal": sig, "ended": time.time()})
    wake_supervisor(run_dir)
    return code if code >= 0 else 128 + (sig or 0)


JOB_ONLY_ENV = ("DSTUI_RUN_DIR", "DSTUI_METRICS_FILE", "DSTUI_DS_CONFIG", "DSTUI_RUN_KEY", "PYTHONFAULTHANDLER")


def wake_supervisor(run_dir: str) -> bool:
    """A batch whose supervisor died is picked up when one of its jobs ends.

    Without this, queued runs of a batch nobody looks at would wait forever. The
    lock is free only when no supervisor lives; a twin started by two jobs ending
    at once finds the lock held and exits. True when one was started.
    """
    batch = os.path.dirname(os.path.abspath(run_dir))
    if not os.path.exists(os.path.join(batch, BATCH_FILE)):
        return False
    try:
        with open(os.path.join(batch, LOCK_FILE), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
        start_supervisor(batch, {k: v for k, v in os.environ.items() if k not in JOB_ONLY_ENV})
    except (BlockingIOError, OSError):
        return False  # supervised (lock held), or nothing we can do from here
    return True


def start_supervisor(batch: str, env: dict[str, str] | None) -> subprocess.Popen:
    """``dstui supervise BATCH`` detached (its own session), logging to the batch's supervisor.log.

    Here, stdlib only, because the wrapper uses it too (see :func:`wake_supervisor`).
    """
    with open(os.path.join(batch, SUPERVISOR_LOG), "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dstui", "supervise", batch],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=bytecode.apply(dict(os.environ) if env is None else env),
        )


def _write(run_dir: str, data: dict) -> None:
    path = os.path.join(run_dir, EXIT_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
