"""A run's ``status.json`` as one typed record, and the named transitions that alone change its state.

The life of a run::

    queued ──> starting ──> running ──> ended: done | failed | killed
      │  ^          (a scheduler's job may wait queued after it ran: waiting)
      │  └── requeued (a retry's new attempt) <── ended
      ├──> skipped   (predicted out of memory: never launched)
      └──> ended     (killed: cancelled before start; failed: could not start, never laid out)

Every writer of a state goes through one function here (:func:`queued`, :func:`requeued`,
:func:`waiting`, :func:`starting`, :func:`running`, :func:`ended`, :func:`skipped`,
:func:`cancelled_before_start`), so the words a state is written with, its time stamps and
what it clears live in one place; :meth:`dstui.core.rundir.RunDir.update_status` refuses a
``state`` (the other fields, phase, progress, the MLflow run id, a job's handle, are written
there). Readers get the fields every face shows typed (:meth:`RunStatus.of`); any other
field a backend or a newer dstui wrote stays readable through :meth:`RunStatus.get`. The
file format is unchanged: an old run folder reads as it always did, and a field of the
wrong type reads as missing (the folder is the job's too: untrusted).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from dstui.core.rundir import ACTIVE_STATES, FINAL_STATES, LIVE_STATES, merge_status

if TYPE_CHECKING:
    from dstui.core.rundir import RunDir

QUEUED, STARTING, RUNNING = "queued", "starting", "running"
DONE, FAILED, KILLED, SKIPPED = "done", "failed", "killed", "skipped"
UNKNOWN = "unknown"  # a folder without a status (or one a job overwrote with something else)
ENDINGS = (DONE, FAILED, KILLED)  # what :func:`ended` takes; skipped has its own transition
CANCELLED_BEFORE_START = "cancelled before start"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past any float
        return None
    return number if math.isfinite(number) else None


def _count(value: Any) -> int | None:
    n = _number(value)
    return int(n) if n is not None else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return MappingProxyType(value) if isinstance(value, dict) else MappingProxyType({})


@dataclass(frozen=True)
class RunStatus:
    """What a run's status.json says, the fields every face reads typed (missing or mistyped: None)."""

    state: str = UNKNOWN
    reason: str | None = None
    name: str | None = None
    condition: str | None = None
    revision: str | None = None
    executor: str | None = None
    attempt: int = 1
    steps_done: int | None = None
    steps_total: int | None = None
    starting: float | None = None  # when the backend began starting the job
    started: float | None = None  # when the job ran (its first attempt's start stays)
    ended: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    phase: str | None = None
    mlflow_run_id: str | None = None
    job_id: str | None = None
    verdict: str | None = None
    last: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # the newest step's values
    summary: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    raw: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), repr=False)

    @classmethod
    def from_dict(cls, st: Any) -> RunStatus:
        """Typed fields out of a status as read (any JSON value: a job may have written the file)."""
        if not isinstance(st, dict):
            return cls()
        return cls(
            state=_text(st.get("state")) or UNKNOWN,
            reason=_text(st.get("reason")),
            name=_text(st.get("name")),
            condition=_text(st.get("condition")),
            revision=_text(st.get("revision")),
            executor=_text(st.get("executor")),
            attempt=_count(st.get("attempt")) or 1,
            steps_done=_count(st.get("steps_done")),
            steps_total=_count(st.get("steps_total")),
            starting=_number(st.get("starting")),
            started=_number(st.get("started")),
            ended=_number(st.get("ended")),
            exit_code=_count(st.get("exit_code")),
            signal=_count(st.get("signal")),
            phase=_text(st.get("phase")),
            mlflow_run_id=_text(st.get("mlflow_run_id")),
            job_id=_text(st.get("job_id")) or (str(st["job_id"]) if isinstance(st.get("job_id"), int) else None),
            verdict=_text(st.get("verdict")),
            last=_mapping(st.get("last")),
            summary=_mapping(st.get("summary")),
            raw=MappingProxyType(dict(st)),
        )

    @classmethod
    def of(cls, rd: RunDir) -> RunStatus:
        return cls.from_dict(rd.status())

    def get(self, key: str, default: Any = None) -> Any:
        """Any field as written (a backend's own, a newer dstui's), untyped."""
        return self.raw.get(key, default)

    @property
    def is_active(self) -> bool:
        """Queued, starting or running: not over."""
        return self.state in ACTIVE_STATES

    @property
    def is_live(self) -> bool:
        """A job was started and has not ended."""
        return self.state in LIVE_STATES

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def began(self) -> float | None:
        """When the run began: its launch, else its job's start; one that never started began where it ended."""
        return self.starting or self.started or self.ended


# -- the transitions: the only writers of ``state`` -----------------------------------------


def _write(rd: RunDir, state: str, fields: dict[str, Any]) -> RunStatus:
    if "state" in fields:
        raise ValueError("the transition names the state")
    return RunStatus.from_dict(merge_status(rd, {**fields, "state": state}))


def queued(rd: RunDir, *, name: str, condition: str, revision: str, repeat: int, key: str, order: int,
           steps_total: int) -> RunStatus:  # fmt: skip
    """A new run laid out, waiting for its batch's supervisor."""
    return _write(rd, QUEUED, dict(name=name, condition=condition, revision=revision, repeat=repeat, key=key,
                                   order=order, steps_total=steps_total, steps_done=0))  # fmt: skip


def requeued(rd: RunDir, *, attempt: int, **kept: Any) -> RunStatus:
    """A new attempt of an ended run (``dstui retry``): queued again, its progress from zero; ``kept``
    carries what stays of the run (its name, condition, key, ..., the earlier attempts)."""
    return _write(rd, QUEUED, {**kept, "steps_done": 0, "attempt": attempt})


def waiting(rd: RunDir, reason: str, **job: Any) -> RunStatus:
    """Queued in a scheduler (submitted, pending, or back in its queue after it ran); ``reason`` says why it waits."""
    return _write(rd, QUEUED, {**job, "reason": reason})


def starting(rd: RunDir, *, executor: str, **job: Any) -> RunStatus:
    """The backend is starting the run's job now."""
    now = time.time()
    return _write(rd, STARTING, {"executor": executor, "starting": now, "phase": "launching", "phase_since": now, **job})


def running(rd: RunDir, **job: Any) -> RunStatus:
    """The job runs; ``job`` is how to find it again (process group, job id) and what it was started with."""
    return _write(rd, RUNNING, job)


def moved_by_scheduler(rd: RunDir, state: str, **job: Any) -> RunStatus:
    """A scheduler's view of a submitted, unfinished job (Slurm's squeue): waiting, starting or running."""
    if state not in ACTIVE_STATES:
        raise ValueError(f"a scheduler moves an unfinished job to {', '.join(ACTIVE_STATES)}, not {state!r}")
    return _write(rd, state, job)


def ended(rd: RunDir, state: str, reason: str | None, **more: Any) -> RunStatus:
    """The run is over: ``state`` done, failed or killed, with why (None: nothing to say, a clean end)."""
    if state not in ENDINGS:
        raise ValueError(f"a run ends {', '.join(ENDINGS)}, not {state!r}")
    more.setdefault("ended", time.time())
    return _write(rd, state, {**more, "reason": reason})


def skipped(rd: RunDir, reason: str) -> RunStatus:
    """Never launched: its forecast says it would not fit (``skip_predicted_oom``)."""
    return _write(rd, SKIPPED, {"reason": reason, "ended": time.time()})


def cancelled_before_start(rd: RunDir) -> RunStatus:
    """A queued run's cancel request, seen before any job started."""
    return ended(rd, KILLED, CANCELLED_BEFORE_START)
