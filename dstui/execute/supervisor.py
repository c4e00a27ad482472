"""The batch supervisor: launches queued runs, follows them, feeds MLflow.

One supervisor per batch, in its own process session (``dstui supervise``),
holding ``supervisor.lock``. It does not depend on a terminal or on the TUI:
they only read the run folders. If it dies, the next ``dstui status`` or TUI
start takes over (the rule: :mod:`dstui.usecases.takeover`): runs keep going (they are in their own sessions), their exit
status is in ``exit.json`` (see :mod:`dstui.execute.injob.wrap`), and ingestion resumes
from the byte offsets in each run's ``ingest.json``.

The work is split by responsibility; this module is only the loop that ties it:

- :mod:`~dstui.execute.control`: starting a supervisor, taking over, cancel
  (:mod:`~dstui.execute.batch_lock`: the lock);
- :mod:`~dstui.execute.backends`: where runs start, which may start now, their
  jobs' state, readings and end (this machine's process groups, Slurm jobs, ...);
- :mod:`~dstui.execute.follow`: one pass over a run (read, guard, check, send, finalize);
- :mod:`~dstui.execute.ingest`: reading new records of a run into points;
- :mod:`~dstui.execute.sink`: MLflow runs, sending points exactly once;
- :mod:`~dstui.execute.liveness`: cancel, hang and end checks, the final reason.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from dstui.core import run_status, secrets, startup_trace
from dstui.core.errors import LockHeld
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import backends, creation, live_phase
from dstui.execute.batch_lock import BatchLock
from dstui.execute.follow import RunFollower
from dstui.execute.injob import standby
from dstui.execute.mlflow_runs import EARLIER_ATTEMPTS
from dstui.execute.sink import MlflowSink
from dstui.tracking import sqlite_store

log = logging.getLogger("dstui.execute.supervisor")

TROUBLE_WAIT_S = 5.0
FINISHING_FAST_FOR_S = 10.0  # the backend's short pass interval (finishing_poll_s) for this long at most


def is_finishing(st: dict) -> bool:
    """A live run that passed its last step in the last few seconds (its teardown and exit are next)."""
    since = st.get("phase_since")
    return (
        st.get("phase") == live_phase.AFTER_MARK["last_step_done"]
        and st.get("state") not in FINAL_STATES
        and isinstance(since, (int, float))
        and time.time() - since < FINISHING_FAST_FOR_S
    )


class Supervisor:
    """The main loop of one batch: launch what may start, follow what runs, finish what ended."""

    def __init__(
        self,
        batch: BatchDir,
        *,
        poll_s: float = 0.5,
        system_interval_s: float = 2.0,
        flush_interval_s: float = 2.0,
        tracking_uri: str | None = None,
    ) -> None:
        self.batch = batch
        self.poll_s = poll_s
        self.info = batch.info()
        self.lock = BatchLock(batch)
        self.sink = MlflowSink(batch, tracking_uri, flush_interval_s)
        self.backend = backends.for_batch(self.info)  # where its runs start: this machine, Slurm, ...
        self.follower = RunFollower(batch, self.sink, self.backend, system_interval_s)
        self._problem: str | None = None
        self._untracked: list[RunDir] = []  # launched, MLflow run not yet made

    def run(self) -> int:
        self.lock.acquire()
        startup_trace.mark("supervisor_locked", "supervisor")
        standby.ensure(str(self.batch.path))  # restarts this supervisor should it die before a job keeps watch
        try:
            log.info("supervising batch %s (pid %d)", self.batch.id, os.getpid())
            note = creation.settle(self.batch, locked=True)  # a `dstui run` killed while laying it out
            if note:
                log.warning("batch %s was cut short while being created: %s", self.batch.id, note)
            if self.batch.info().get("ended"):  # finalized once; a retry or resume runs it again
                self.sink.parent_run_id()
                self.sink.reopen_parent()
            self.backend.before_first_run(self.batch, log)
            while True:
                try:
                    self.step()  # MLflow's batch run comes with the first launches' runs, after them
                    if self.done() and self.finalize_batch():
                        # a retry may have queued a run while we were finishing: look again
                        if not any(r.state == "queued" for r in self.batch.runs()):
                            return 0
                        self.batch.update_info(finalized=False)
                        self.sink.reopen_parent()
                    if self._problem:
                        self._problem = None
                        self.batch.update_info(supervisor_problem=None)
                except OSError as e:
                    # a full disk (or a vanished folder) must not kill the supervisor: a dead one
                    # is restarted by the next `dstui` call and dies again, in a loop
                    self._trouble(e)
                    time.sleep(TROUBLE_WAIT_S)
                collect_again()
                time.sleep(self._pause())
        finally:
            self.lock.release()

    def _pause(self) -> float:
        """The wait before the next pass: short while a run is past its last step (issue 31).

        Its reap, the last records and the MLflow run's end then follow within
        0.1 s instead of up to a whole poll, and so do the batch's end and
        `dstui run`'s return. Where the backend allows it (a Slurm batch's pass
        asks the scheduler, which is not to be asked ten times a second), and
        for the first seconds of the phase only: a teardown that hangs is not
        watched at ten passes a second.
        """
        fast = self.backend.finishing_poll_s
        if fast is not None and any(is_finishing(rd.status()) for rd in self.batch.runs()):
            return min(self.poll_s, fast)
        return self.poll_s

    def _trouble(self, e: OSError) -> None:
        """Say once what keeps the supervisor from working; it retries until it can."""
        what = "disk full" if e.errno == errno.ENOSPC else f"{type(e).__name__}: {e}"
        if what == self._problem:
            return
        self._problem = what
        log.error("%s; waiting and trying again (runs keep going)", what, exc_info=e.errno != errno.ENOSPC)
        with contextlib.suppress(OSError):  # may not be writable right now; `dstui status` checks space itself
            self.batch.update_info(supervisor_problem=what)

    def done(self) -> bool:
        """Every run ended, and MLflow has each attempt's end (earlier attempts' runs included)."""
        runs = self.batch.runs()
        return (
            all(r.state in FINAL_STATES for r in runs)
            and all(self.follower.tracked_of(r).finalized for r in runs)
            and not any(r.status().get(EARLIER_ATTEMPTS) for r in runs)
        )

    def step(self) -> None:
        """One pass: follow every run that runs or still has to be finalized, then start queued ones."""
        runs = self.batch.runs()
        f = self.follower
        if self.sink.store_vanished():
            f.resend_all(runs)
        f.refresh_jobs(runs)
        for rd in runs:
            if not rd.path.exists():
                continue
            st = rd.status()
            if st.get(EARLIER_ATTEMPTS):  # queued again: end what MLflow still shows RUNNING of before
                self.sink.close_earlier(rd)
            if f.live(st) or rd.state in FINAL_STATES and not f.tracked_of(rd).finalized:
                f.follow(rd)
        self._start_queued(runs)
        # MLflow runs of what was just launched, once all of this pass's ranks are starting:
        # they need nothing of MLflow, and its first import and store open take seconds (issue 31)
        while self._untracked:
            self.sink.child_run_id(self._untracked.pop(0))
            startup_trace.mark("mlflow_run_made", "supervisor")

    # ---- launching ----

    def _start_queued(self, runs: list[RunDir]) -> None:
        """Start queued runs in batch order while the backend has room (GPUs free, Slurm's job limit)."""
        f = self.follower
        queued = [rd for rd in runs if rd.state == "queued" and not f.live(rd.status())]
        for rd in [rd for rd in queued if rd.cancel_file.exists()]:
            run_status.cancelled_before_start(rd)
            queued.remove(rd)
        if queued:
            active = [r for r in runs if f.live(r.status())]
            self.backend.start_queued(self.batch, queued, active, self.launch)

    def launch(self, rd: RunDir, slot: Any) -> None:
        """Start one run through the backend; its MLflow run follows at the end of the pass."""
        if self.backend.start(rd, self.follower.tracked_of(rd), slot):
            self._untracked.append(rd)

    # ---- finishing ----

    def finalize_batch(self) -> bool:
        """End the parent run, then mark the batch finalized; False (try again) while MLflow is down."""
        states = [r.state for r in self.batch.runs()]
        if not self.sink.finish_batch(states):
            return False
        self.batch.update_info(finalized=True, ended=time.time())
        startup_trace.mark("batch_finalized", "supervisor")
        log.info("batch %s finished: %s", self.batch.id, {s: states.count(s) for s in set(states)})
        return True


def collect_again() -> None:
    """After the first pass: Python's cycle collector on again, with what the start made set aside for good.

    The first pass imports MLflow and opens its store (with pandas and SQLAlchemy, some 450,000
    objects). With the collector on, its full collections walked that growing heap again and
    again meanwhile: 0.5 of the 2.0 CPU-s of the imports and the store's open (docs/BENCHMARKS.md,
    "Supervisor cost"). ``gc.freeze`` keeps the collections of the passes that follow off those
    objects too (0.13 CPU-s a full collection otherwise). Garbage of the start that the collector
    would have freed stays: a one-off, a start's worth at most.
    """
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def main(batch_path: str) -> int:
    startup_trace.mark("supervisor_main", "supervisor")  # after the interpreter's start and the imports
    gc.disable()  # until the first pass is done (collect_again)
    # An unreachable tracking server must not stall following the runs: fail fast,
    # keep the metrics on disk, retry on a later pass (backing off: execute/store.py).
    # One immediate retry of a failed request: a server failing every third request
    # answered a fixed sequence of calls (experiment, parent search, create) with a 500
    # on the same call every time, and no point got through in 180 s.
    # Set, not defaulted: `dstui run` sets no retries for its own forecast and its supervisor inherits that.
    os.environ.update(
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="0", MLFLOW_HTTP_REQUEST_BACKOFF_JITTER="0.3"
    )
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    secrets.mask_output()  # supervisor.log: no credentials, no hidden env value, tracebacks included
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    batch = BatchDir(Path(batch_path).resolve())
    try:
        return Supervisor(batch).run()
    except LockHeld as e:
        print(f"dstui: {e}", file=sys.stderr)
        return 3
    finally:
        sqlite_store.close_all()  # the store whole in mlflow.db now, however the process then ends (cli: quick_exit)
