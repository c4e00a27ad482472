"""The local backend: each run is a process group in its own session on this machine.

The job runs under :mod:`dstui.execute.injob.wrap` (its exit status lands in
``exit.json``, so a supervisor started later still learns how it ended); its
ranks start directly (:mod:`dstui.execute.injob.ranks`) or through DeepSpeed's
launcher (:mod:`dstui.execute.launch` decides). GPUs are one resource across
batches: runs start in batch order while enough of them are free
(:mod:`~dstui.execute.gpu_share`), decided and recorded under the machine's
ledger (:mod:`~dstui.execute.gpu_ledger`). The supervisor samples the job's
process tree and GPUs itself, and names what the run does now
(:mod:`~dstui.execute.live_phase`).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import time
from typing import Any

from dstui.core import startup_trace
from dstui.core.rundir import FINAL_STATES, LIVE_STATES, BatchDir, RunDir
from dstui.execute import (
    feasibility,
    gpu_ledger,
    gpu_share,
    ingest,
    launch,
    live_phase,
    liveness,
    prebuild,
    sysmetrics,
)
from dstui.execute.backends.base import Preview, Starter
from dstui.execute.ingest import Tracked
from dstui.execute.process_group import KILL_GRACE_S, job_alive, stop_job

log = logging.getLogger("dstui.execute.supervisor")

FINISHING_POLL_S = 0.1  # the pass interval while a run is past its last step (its reap and end are near)


class LocalBackend:
    """Process groups on this host; :class:`~dstui.execute.backends.base.Backend` for ``"local"``."""

    name = "local"
    finishing_poll_s: float | None = FINISHING_POLL_S
    shown_fields: tuple[tuple[str, str, int], ...] = ()

    def __init__(self, info: dict[str, Any] | None = None) -> None:
        self.info = info or {}
        self.parallel = max(gpu_share.AUTO, int(self.info.get("parallel", 1)))
        self.phases = live_phase.LivePhases()

    # ---- before a batch exists ----

    def capacity(self) -> feasibility.Machine:
        return feasibility.this_machine()

    def preflight(self, plan: Any) -> None:
        """Nothing beyond the machine's feasibility (:meth:`capacity`), which the caller judges."""

    def preview(self, plan: Any, run: Any, rd: RunDir) -> Preview:
        python = (plan.revisions.get(run.revision) or {}).get("python")
        command = launch.shown_command(run, launch.build_argv(run, rd, python=python))
        return Preview(command, shlex.join(command))

    def batch_options(self, spec: Any) -> None:
        return None

    def launch_notes(self, batch: BatchDir) -> list[str]:
        """Other batches holding this machine's GPUs: this one's runs wait for them, said up front."""
        if not sysmetrics.gpu_count():
            return []
        with gpu_ledger.opened() as ledger:
            held = ledger.held_elsewhere(batch.path)
        return [f"GPUs busy: {gpu_ledger.holders_text(held)}; runs wait for them"] if held else []

    # ---- the supervisor of one batch ----

    def before_first_run(self, batch: BatchDir, log: logging.Logger) -> None:
        """JIT ops built once, before any run's clock starts."""
        prebuild.before_first_run(batch, on_gpu=sysmetrics.gpu_count() > 0, log=log)
        startup_trace.mark("ops_checked", "supervisor")

    def refresh(self, runs: list[RunDir]) -> list[RunDir]:
        return []  # each process group is asked about in its own pass (follow_job)

    def start_queued(self, batch: BatchDir, queued: list[RunDir], active: list[RunDir], start: Starter) -> None:
        """Start queued runs in batch order while GPUs (or, without GPUs, ``parallel``) allow."""
        if sysmetrics.gpu_count() > 0:
            # GPUs are one resource across batches: decide and launch under the machine's ledger
            with gpu_ledger.opened() as ledger:
                self._admit(batch, queued, active, start, ledger)
        else:
            self._admit(batch, queued, active, start, None)

    def _admit(
        self, batch: BatchDir, queued: list[RunDir], active: list[RunDir], start: Starter, ledger: gpu_ledger.Ledger | None
    ) -> None:
        total_gpus = sysmetrics.gpu_count()
        others = ledger.held_elsewhere(batch.path) if ledger is not None else []
        for rd in queued:
            go, gpu_slice = gpu_share.choose(
                rd.settings(),
                parallel=self.parallel,
                active=len(active),
                busy_slices=[b.status().get("gpu_slice") for b in active],
                total_gpus=total_gpus,
                elsewhere=[h.gpus for h in others],
            )
            if not go:
                if others and not active:  # nothing of ours runs: it is the other batches we wait for
                    live_phase.set_phase(rd, f"waiting for GPUs held by {gpu_ledger.holders_text(others)}")
                break  # runs start in their batch order
            start(rd, gpu_slice)
            active.append(rd)
            if ledger is not None and rd.state not in FINAL_STATES:
                ledger.add(rd, gpu_slice if gpu_slice is not None else list(range(total_gpus)))

    def start(self, rd: RunDir, t: Tracked, slot: Any) -> bool:
        try:
            run = launch.load_runspec(rd)
        except (OSError, ValueError) as e:  # a folder without its spec: never a reason to stop supervising
            rd.update_status(state="failed", reason=f"could not start: {type(e).__name__}: {e}"[:300], ended=time.time())
            return False
        rev = rd.spec().get("revision_info") or {}
        # the MLflow child's start time: the same moment in any store it is created in later
        now = time.time()
        rd.update_status(executor=self.name, state="starting", starting=now, phase="launching", phase_since=now)
        try:
            t.proc = launch.start(
                run,
                rd,
                python=rev.get("python"),
                gpu_slice=slot,
                # Bundled runners start in the run folder: `python -m` puts the cwd first on
                # sys.path, and a DeepSpeed clone there would shadow the revision's deepspeed.
                cwd=self.info.get("cwd") if run.settings.kind == "command" else None,
                revision=rev,
            )
        except OSError as e:
            rd.update_status(state="failed", reason=f"could not start: {e}", ended=time.time())
            return False
        pid = rd.status().get("pid")
        t.tree = sysmetrics.ProcessTreeSampler(pid, wrapper=True) if pid else None
        log.info("started %s (%s, pid %s)", rd.name, self.name, pid)
        startup_trace.mark("run_launched", "supervisor")
        return True

    def live(self, st: dict[str, Any]) -> bool:
        return st.get("state") in LIVE_STATES

    def readings(self, t: Tracked, st: dict[str, Any], *, live: bool, interval_s: float) -> None:
        """The job's process tree and this machine's GPUs, sampled here; what the run does now."""
        if live:
            ingest.sample_system(t, st, interval_s, time.time())
        self.phases.update(t.rd)  # for every view; cleared once it ended

    def follow_job(self, t: Tracked, st: dict[str, Any]) -> None:
        liveness.check(t, st, self)

    def tags(self, st: dict[str, Any]) -> dict[str, Any]:
        return {}

    # ---- a run's job, from its status alone ----

    def alive(self, st: dict[str, Any]) -> bool:
        """Any process of the job (checked by its leader's start and boot, never the number alone)."""
        return job_alive(st)

    def cancel(self, st: dict[str, Any], *, grace_s: float = KILL_GRACE_S) -> None:
        """The job's group and the helpers that left it (its token); a process that took its number is left be."""
        stop_job(st, grace_s=grace_s)

    # ---- what liveness.check asks of a process job ----

    def ended(self, rd: RunDir, st: dict[str, Any], handle: Any) -> bool:
        """The job's leader is over (its exit status may be in exit.json); ranks may outlive it."""
        if rd.exit_file.exists():
            return True
        if handle is not None:
            return handle.poll() is not None
        return not job_alive(st)  # a mismatch (the number given to another process) means it is gone

    def reap(self, handle: Any) -> None:
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.wait(timeout=5)
