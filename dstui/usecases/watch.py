"""Following a batch until its runs end: one watcher, whose events every face renders.

`dstui run`, `dstui status --follow`, `dstui demo --no-tui` and bisect follow a
batch through :class:`BatchWatcher`; it reads the run folders and yields

- :class:`RunChanged` when a run's state, reason, guard flag or phase changes
  (and every few seconds while one runs or waits in a phase, so its progress
  and the phase's seconds show: ``building op shm_comm 35s``, not ``0s`` for
  the whole build),
- :class:`Trouble` the moment a run fails, is killed, hangs or is flagged,
- :class:`Note` for batch problems said once (MLflow down, disk full, ...),
- :class:`TookOver` when its supervisor was gone and another was started
  (the rule is :class:`~dstui.usecases.takeover.Takeover`'s),
- :class:`Ended` last: every run ended and the batch finalized, or MLflow still
  taking the last points after a grace, or the supervisor kept stopping.

The watcher does nothing but read and (by the takeover rule) start supervisors;
Ctrl-C in a face stops the watching, never the runs.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.core import failures
from dstui.core.errors import DstuiError
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import backends, batch_lock
from dstui.execute.ingest import unsent_points
from dstui.execute.supervisor import is_finishing
from dstui.usecases.takeover import GAVE_UP, RESTARTED, Takeover

FINALIZE_WAIT_S = 15.0  # after the last run ends, how long to wait for an unreachable MLflow
FINALIZE_MAX_S = 300.0  # ... and for a reachable one still taking the last points and artifacts
FAST_FOR_S = 10.0  # after a run's last step, how long to follow at the short interval
STEP_EVERY_S = 5.0  # a running run is reported this often even when nothing but its step moved


@dataclass(frozen=True)
class RunChanged:
    run: RunDir
    status: dict[str, Any]


@dataclass(frozen=True)
class Trouble:
    run: RunDir
    text: str  # 'FAILED a-r0: reason'


@dataclass(frozen=True)
class Note:
    text: str


@dataclass(frozen=True)
class TookOver:
    times: int


@dataclass(frozen=True)
class Ended:
    finalized: bool
    waiting_points: int | None  # points still to reach MLflow (None: finalized, all sent)
    gave_up: bool = False  # the supervisor kept stopping


Event = RunChanged | Trouble | Note | TookOver | Ended


LOW_SPACE_BYTES = 16 << 20


def batch_notes(info: dict[str, Any], path: os.PathLike[str] | str | None = None) -> list[str]:
    """Problems of a batch a person must hear about once: store lost or down, disk full."""
    notes = [info[k] for k in ("tracking_problem", "tracking_note", "supervisor_problem", "creation_problem") if info.get(k)]
    if path is not None:
        stopped = batch_lock.stopped_note(BatchDir(Path(path)))  # alive but SIGSTOPped: it holds the lock, nothing moves
        if stopped:
            notes.append(stopped)
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            free = None
        if free is not None and free < LOW_SPACE_BYTES:
            notes.append(f"disk full: {free / 2**20:.1f} MiB free where the runs are ({path})")
    return notes


def job_fields(b: BatchDir) -> tuple[tuple[str, str, int], ...]:
    """(header, status field, keep order) of what the batch's executor shows of its jobs (Slurm: job id, nodes)."""
    try:
        return tuple(backends.get(b.info().get("executor")).shown_fields)
    except DstuiError:  # an executor this process does not know (its registration is gone): the runs still show
        return ()


def change_key(st: dict[str, Any]) -> tuple:
    """What makes a run worth a line: state, reason, the guard's flag, the phase."""
    return st.get("state"), st.get("reason"), bool(st.get("diverged")), st.get("phase")


def in_phase(st: dict[str, Any]) -> bool:
    """A run that has not ended and has not stepped yet, doing something it names (``building op X``):
    its line is due every few seconds, as a running run's, so the phase's seconds count."""
    return bool(st.get("phase")) and st.get("state") not in FINAL_STATES and not st.get("steps_done")


def all_steps_done(st: dict) -> bool:
    """A running run whose last step is logged (its teardown and exit come next)."""
    done, total = st.get("steps_done"), st.get("steps_total")
    return st.get("state") == "running" and isinstance(done, int) and isinstance(total, int) and 0 < total <= done


def trouble_line(name: str, st: dict) -> str | None:
    """'FAILED a-r0: reason' for a run that failed, was killed, hung or was flagged by the guard."""
    t = failures.trouble(st)
    return f"{t.kind.upper()} {name}: {t.text}" if t else None


def nap(path: os.PathLike[str] | str, seconds: float, *, tick_s: float = 0.05) -> None:
    """Sleep up to ``seconds``, waking early when ``path`` changes.

    ``path`` is batch.json: the supervisor rewrites it when the batch is
    finalized (and for a note), so a follower returns within a tick of the
    batch's end instead of up to a whole poll later. One stat a tick.
    """

    def stamp() -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    before = stamp()
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(tick_s, left))
        if stamp() != before:
            return


class BatchWatcher:
    """Follows one batch; :meth:`events` yields what happened, :class:`Ended` last.

    ``key``: what counts as a change of a run (bisect: state and step);
    ``step_every_s``: report running runs this often anyway (None: only changes);
    ``finalize_wait``: give up waiting for MLflow's last points after
    :data:`FINALIZE_WAIT_S`/:data:`FINALIZE_MAX_S` (False: wait for the batch's finalization).
    """

    def __init__(
        self,
        b: BatchDir,
        *,
        poll_s: float = 0.5,
        takeover: Takeover | None = None,
        key: Callable[[dict[str, Any]], tuple] = change_key,
        step_every_s: float | None = STEP_EVERY_S,
        finalize_wait: bool = True,
    ) -> None:
        self.b = b
        self.poll_s = poll_s
        self.takeover = takeover if takeover is not None else Takeover()
        self.key = key
        self.step_every_s = step_every_s
        self.finalize_wait = finalize_wait
        self._seen: dict[str, tuple] = {}
        self._notes_seen: set[str] = set()
        self._last_step_report = 0.0
        self._ended_at: float | None = None

    def events(self) -> Iterator[Event]:
        while True:
            runs = self.b.runs()
            now = time.time()
            finishing = yield from self._runs(runs, now)
            info = self.b.info()
            for note in batch_notes(info, self.b.path):
                if note not in self._notes_seen:  # each problem once
                    self._notes_seen.add(note)
                    yield Note(note)
            if self._over(runs, info, now):
                break
            if not info.get("finalized"):
                verdict = self.takeover.look_one(self.b)
                if verdict == RESTARTED:
                    yield TookOver(self.takeover.restarts.get(self.b.id, 0))
                elif verdict == GAVE_UP:
                    yield Note(self.takeover.gave_up_note(self.b))
                    yield self._end(gave_up=True)
                    return
            # a run past its last step, or every run ended: the reap and the supervisor's finalizing take a
            # fraction of a second; don't add a whole poll to the command's wall (issue 31)
            nap(self.b.batch_file, min(self.poll_s, 0.2) if self._ended_at or finishing else self.poll_s)
        yield self._end()

    def _runs(self, runs: list[RunDir], now: float) -> Iterator[Event]:
        """A RunChanged (and a Trouble the moment one starts) per run that changed; whether one is finishing."""
        finishing = False
        due = self.step_every_s is not None and now - self._last_step_report > self.step_every_s
        seen = []
        for rd in runs:
            st = rd.status()
            seen.append(st)
            # its last step is logged (status.json's last_step_at says when): teardown and exit next
            finishing |= is_finishing(st) or (all_steps_done(st) and now - float(st.get("last_step_at") or 0.0) < FAST_FOR_S)
            key = self.key(st)
            before = self._seen.get(rd.name)
            if before != key or (due and (st.get("state") == "running" or in_phase(st))):
                yield RunChanged(rd, st)
                alarm = trouble_line(rd.name, st)
                if alarm and (before or (None,))[:3] != key[:3]:
                    yield Trouble(rd, alarm)  # the moment it happens, not only in the final table
                self._seen[rd.name] = key
        if due and any(st.get("state") == "running" or in_phase(st) for st in seen):
            self._last_step_report = now
        return finishing

    def _over(self, runs: list[RunDir], info: dict[str, Any], now: float) -> bool:
        if not all(rd.state in FINAL_STATES for rd in runs):
            return False
        if info.get("finalized"):
            return True
        if not self.finalize_wait:
            return False
        self._ended_at = self._ended_at or now
        # MLflow known to be down: say what waits and return; else let it finish sending
        limit = FINALIZE_WAIT_S if info.get("tracking_problem") else FINALIZE_MAX_S
        return now - self._ended_at > limit

    def _end(self, *, gave_up: bool = False) -> Ended:
        finalized = bool(self.b.info().get("finalized"))
        waiting = None if finalized else sum(unsent_points(rd) for rd in self.b.runs())
        return Ended(finalized, waiting, gave_up)
