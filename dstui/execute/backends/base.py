"""What an executor backend is: everything that depends on where a batch's runs start.

The planning side (``dstui run``, ``--dry-run``, ``dstui list``, the TUI's launch)
asks a backend what a run gets (:meth:`Backend.capacity`), what it would refuse
(:meth:`Backend.preflight`) and what would start (:meth:`Backend.preview`). The
supervisor (:mod:`dstui.execute.supervisor`, :mod:`dstui.execute.follow`) owns the
batch's loop, MLflow, ingestion and the guard, and asks its backend which queued
runs may start now and where (:meth:`Backend.start_queued`), to start one
(:meth:`Backend.start`), for its view of the batch's jobs once a pass
(:meth:`Backend.refresh`), for a live run's system readings
(:meth:`Backend.readings`) and for one look at a live run's job: cancel, stall,
and once it ended its outcome (:meth:`Backend.follow_job`). Anyone holding a
run's ``status.json`` (``dstui cancel``, ``--resume``, the guard's stop) reaches
its job through :meth:`Backend.alive` and :meth:`Backend.cancel`.

A backend class takes the batch's ``batch.json`` (``{}`` for the shared
instance) and is registered by name in :mod:`dstui.core.executors`. It writes
``executor: <name>`` into a run's status when it starts it, with whatever it
needs later to find the job again (a process group, a job id): the run folder
stays the contract, so a supervisor started later reaches the job the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the backends import these modules, not the other way round
    from dstui.core.rundir import BatchDir, RunDir
    from dstui.execute.batch import Plan
    from dstui.execute.feasibility import Machine
    from dstui.execute.ingest import Tracked
    from dstui.spec.experiment import ExperimentSpec, RunSpec

#: start(rd, slot): what start_queued calls for each run it lets start (slot: the backend's own, e.g. GPUs)
Starter = Callable[["RunDir", Any], None]


@dataclass(frozen=True)
class Preview:
    """What ``--dry-run`` shows of one run: its command (as shown: secrets masked) and what would start."""

    command: list[str]
    text: str


class Backend(Protocol):
    """One way of starting a batch's runs: this machine's process groups, Slurm jobs, ..."""

    name: str
    #: the supervisor's pass interval while a run is past its last step (its exit is near); None: the usual poll
    finishing_poll_s: float | None
    #: status.json fields worth a column of their own in `dstui status` (header, field, keep priority)
    shown_fields: tuple[tuple[str, str, int], ...]

    # ---- before a batch exists ----

    def capacity(self) -> Machine | None:
        """The machine each run gets (GPUs, their memory, cores), to judge runs by; None: a scheduler judges."""
        ...

    def preflight(self, plan: Plan) -> None:
        """Everything this backend would refuse, found before any folder or job exists (a one-line DstuiError)."""
        ...

    def preview(self, plan: Plan, run: RunSpec, rd: RunDir) -> Preview:
        """What would start for ``run`` (``rd``: where its folder would be)."""
        ...

    def batch_options(self, spec: ExperimentSpec) -> dict[str, Any] | None:
        """This backend's options from the spec, kept in batch.json for the supervisor (None: it has none)."""
        ...

    def launch_notes(self, batch: BatchDir) -> list[str]:
        """What to say before the runs start (e.g. other batches hold this machine's GPUs)."""
        ...

    # ---- the supervisor of one batch ----

    def before_first_run(self, batch: BatchDir, log: logging.Logger) -> None:
        """Once per supervisor, before it starts any run (e.g. JIT ops built before any run's clock starts)."""
        ...

    def refresh(self, runs: list[RunDir]) -> list[RunDir]:
        """Once a pass: the backend's view of the batch's jobs into their statuses; the runs that changed."""
        ...

    def start_queued(self, batch: BatchDir, queued: list[RunDir], active: list[RunDir], start: Starter) -> None:
        """Call ``start`` for the queued runs (in batch order) that may start now; ``active``: the live ones."""
        ...

    def start(self, rd: RunDir, t: Tracked, slot: Any) -> bool:
        """Start one run's job; False when it could not (the run is then marked failed with the reason)."""
        ...

    def live(self, st: dict[str, Any]) -> bool:
        """Started and not ended: the supervisor follows it (a job waiting in a scheduler's queue included)."""
        ...

    def readings(self, t: Tracked, st: dict[str, Any], *, live: bool, interval_s: float) -> None:
        """The run's system readings into its system.jsonl (and what it does now, where the backend can see it)."""
        ...

    def follow_job(self, t: Tracked, st: dict[str, Any]) -> None:
        """One look at a live run's job: a cancel request, a stall, or its end and outcome (status.json settled)."""
        ...

    def tags(self, st: dict[str, Any]) -> dict[str, Any]:
        """MLflow tags of the run's job (job id, node list, ...), from its status."""
        ...

    # ---- a run's job, from its status alone ----

    def alive(self, st: dict[str, Any]) -> bool:
        """True while any process of the job still runs (or its job still waits)."""
        ...

    def cancel(self, st: dict[str, Any], *, grace_s: float = 5.0) -> None:
        """Stop the whole job: politely, then for sure after ``grace_s`` where the backend waits itself."""
        ...
