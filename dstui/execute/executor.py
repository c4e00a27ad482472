"""Where executors plug in: how a run's job is started, checked and stopped.

The supervisor never touches processes itself; it asks an :class:`Executor`.
Today there is one, :class:`LocalExecutor` (the job is a process group on this
host, under :mod:`dstui.execute.wrap`). A new one (Slurm, ...) implements the
same four methods and registers itself in :data:`EXECUTORS`; a run's
``status.json`` names its executor (``"executor"``, default ``"local"``), so a
supervisor restarted later, or ``dstui cancel``, reaches the job the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Protocol

import psutil

from dstui.core.rundir import RunDir
from dstui.spec.models import RunSpec

KILL_GRACE_S = 5.0


class Executor(Protocol):
    """Start / is-alive / kill of one run's job; the job handle is the executor's own."""

    name: str

    def start(
        self,
        run: RunSpec,
        rd: RunDir,
        *,
        python: str | None,
        gpu_slice: list[int] | None,
        cwd: str | None,
        revision: dict | None,
    ) -> Any:
        """Start the job; record in status.json what :meth:`alive`/:meth:`kill` need later."""
        ...

    def ended(self, rd: RunDir, st: dict, handle: Any) -> bool:
        """True once the job's main process is over (its exit status may be in exit.json)."""
        ...

    def alive(self, st: dict) -> bool:
        """True while any process of the job is still running (ranks may outlive the leader)."""
        ...

    def kill(self, st: dict, grace_s: float = KILL_GRACE_S) -> None:
        """Stop the whole job: politely, then for sure after ``grace_s``."""
        ...

    def reap(self, handle: Any) -> None:
        """Collect what is left of the job once it ended (zombies, handles)."""
        ...


# -- the local process group ------------------------------------------------


def group_alive(pgid: int | None) -> bool:
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
    """SIGTERM the run's whole process group, then SIGKILL what is left."""
    if not pgid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and group_alive(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class LocalExecutor:
    """The job is a process group in its own session on this host."""

    name = "local"

    def start(
        self,
        run: RunSpec,
        rd: RunDir,
        *,
        python: str | None,
        gpu_slice: list[int] | None,
        cwd: str | None,
        revision: dict | None,
    ) -> Any:
        from dstui.execute import launch

        return launch.start(run, rd, python=python, gpu_slice=gpu_slice, cwd=cwd, revision=revision)

    def ended(self, rd: RunDir, st: dict, handle: Any) -> bool:
        if rd.exit_file.exists():
            return True
        if handle is not None:
            return handle.poll() is not None
        return not group_alive(st.get("pgid"))

    def alive(self, st: dict) -> bool:
        return group_alive(st.get("pgid"))

    def kill(self, st: dict, grace_s: float = KILL_GRACE_S) -> None:
        kill_group(st.get("pgid"), grace_s=grace_s)

    def reap(self, handle: Any) -> None:
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.wait(timeout=5)


EXECUTORS: dict[str, Executor] = {"local": LocalExecutor()}


def executor_for(st: dict | None = None) -> Executor:
    """The executor that runs (or will run) a job, by the name its status records."""
    name = (st or {}).get("executor") or "local"
    try:
        return EXECUTORS[name]
    except KeyError:
        raise ValueError(f"unknown executor {name!r}; known: {', '.join(sorted(EXECUTORS))}") from None
