"""The local backend: each run is a process group in its own session on this machine.

The job runs under :mod:`dstui.execute.injob.wrap` (its exit status lands in
``exit.json``, so a supervisor started later still learns how it ended); its
ranks start directly (:mod:`dstui.execute.injob.ranks`) or through DeepSpeed's
launcher (:mod:`dstui.execute.launch` decides). GPUs are one resource across
batches: runs start in batch order while enough of them are free
(:mod:`~dstui.execute.gpu_share`), decided and recorded under the machine's
ledger (:mod:`~dstui.execute.gpu_ledger`); so are CPU cores
(:mod:`~dstui.execute.core_share`): a run waits while other batches' runs use the
cores it needs, unless its batch was launched to overlap them. The supervisor
samples the job's process tree and GPUs itself, names what the run does now
(:mod:`~dstui.execute.live_phase`) and records what ran beside it
(:mod:`~dstui.execute.overlap`).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import time
from typing import Any

from dstui.core import run_status, startup_trace
from dstui.core.rundir import FINAL_STATES, LIVE_STATES, BatchDir, RunDir
from dstui.execute import (
    core_share,
    feasibility,
    gpu_ledger,
    gpu_share,
    ingest,
    launch,
    live_phase,
    liveness,
    overlap,
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
        self.cores_choice = self.info.get("cores") if self.info.get("cores") in core_share.CHOICES else core_share.WAIT
        self.phases = live_phase.LivePhases()
        self._looked: dict[str, float] = {}  # run folder -> when overlap last looked at the machine for it

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
        """Other batches holding this machine's GPUs or cores: this one's runs wait for them (or overlap), said up front."""
        with gpu_ledger.opened() as ledger:
            held = ledger.held_elsewhere(batch.path)
        notes = []
        gpus = [h for h in held if h.gpus]
        if gpus and sysmetrics.gpu_count():
            notes.append(f"GPUs busy: {gpu_ledger.holders_text(gpus)}; runs wait for them")
        cores = core_share.machine_cores()
        need = max((core_share.cores_needed(rd.settings(), total_gpus=sysmetrics.gpu_count(), cores=cores)
                    for rd in batch.runs() if rd.state == "queued"), default=0)  # fmt: skip
        busy = core_share.blocking(held, need, cores) if need else []
        if busy and batch.info().get("cores") == core_share.OVERLAP:
            notes.append(f"cores shared: {gpu_ledger.runs_text(busy)} use this machine's {cores} cores; runs start beside "
                         "them, and their timings are marked overlapped (reports leave them out of speed comparisons)")  # fmt: skip
        elif busy:
            notes.append(f"cores busy: {gpu_ledger.runs_text(busy)} use this machine's {cores} cores; runs wait for "
                         "them (`dstui run --overlap` starts them beside, timings marked overlapped)")  # fmt: skip
        return notes

    # ---- the supervisor of one batch ----

    def before_first_run(self, batch: BatchDir, log: logging.Logger) -> None:
        """JIT ops built once, before any run's clock starts."""
        prebuild.before_first_run(batch, on_gpu=sysmetrics.gpu_count() > 0, log=log)
        startup_trace.mark("ops_checked", "supervisor")

    def refresh(self, runs: list[RunDir]) -> list[RunDir]:
        return []  # each process group is asked about in its own pass (follow_job)

    def start_queued(self, batch: BatchDir, queued: list[RunDir], active: list[RunDir], start: Starter) -> None:
        """Start queued runs in batch order while GPUs and cores (or, without GPUs, ``parallel``) allow."""
        # GPUs and cores are one resource across batches: decide and launch under the machine's ledger
        with gpu_ledger.opened() as ledger:
            self._admit(batch, queued, active, start, ledger)

    def _admit(self, batch: BatchDir, queued: list[RunDir], active: list[RunDir], start: Starter, ledger: gpu_ledger.Ledger) -> None:
        total_gpus, cores = sysmetrics.gpu_count(), core_share.machine_cores()
        others = ledger.held_elsewhere(batch.path)
        gpu_holders = [h for h in others if h.gpus]
        for rd in queued:
            go, gpu_slice = gpu_share.choose(
                rd.settings(),
                parallel=self.parallel,
                active=len(active),
                busy_slices=[b.status().get("gpu_slice") for b in active],
                total_gpus=total_gpus,
                elsewhere=[h.gpus for h in gpu_holders],
            )
            if not go:
                if gpu_holders and not active:  # nothing of ours runs: it is the other batches we wait for
                    live_phase.set_phase(rd, f"waiting for GPUs held by {gpu_ledger.holders_text(gpu_holders)}")
                break  # runs start in their batch order
            need = core_share.cores_needed(rd.settings(), total_gpus=total_gpus, cores=cores)
            busy = core_share.blocking(others, need, cores) if self.cores_choice == core_share.WAIT else []
            if busy:  # other batches compute on the cores it needs: their timings and its own would mix
                if not active:
                    live_phase.set_phase(rd, f"waiting for cores used by {gpu_ledger.runs_text(busy)}")
                break
            start(rd, gpu_slice)
            active.append(rd)
            if rd.state not in FINAL_STATES:
                ledger.add(rd, gpu_slice if gpu_slice is not None else list(range(total_gpus)), need)

    def start(self, rd: RunDir, t: Tracked, slot: Any) -> bool:
        try:
            run = launch.load_runspec(rd)
        except (OSError, ValueError) as e:  # a folder without its spec: never a reason to stop supervising
            run_status.ended(rd, run_status.FAILED, f"could not start: {type(e).__name__}: {e}"[:300])
            return False
        rev = rd.spec().get("revision_info") or {}
        # the MLflow child's start time: the same moment in any store it is created in later
        run_status.starting(rd, executor=self.name)
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
            run_status.ended(rd, run_status.FAILED, f"could not start: {e}")
            return False
        pid = rd.status().get("pid")
        t.tree = sysmetrics.ProcessTreeSampler(pid, wrapper=True) if pid else None
        log.info("started %s (%s, pid %s)", rd.name, self.name, pid)
        startup_trace.mark("run_launched", "supervisor")
        return True

    def live(self, st: dict[str, Any]) -> bool:
        return st.get("state") in LIVE_STATES

    def readings(self, t: Tracked, st: dict[str, Any], *, live: bool, interval_s: float) -> None:
        """The job's process tree and this machine's GPUs, sampled here; what ran beside it; what the run does now."""
        if live:
            now = time.time()
            ingest.sample_system(t, st, interval_s, now)
            self._look_beside(t.rd, st, now)
        else:
            self._settle_overlap(t.rd)
        self.phases.update(t.rd)  # for every view; cleared once it ended

    def _look_beside(self, rd: RunDir, st: dict[str, Any], now: float) -> None:
        """Which other runs of any batch live beside this one now (the ledger), and the host's load."""
        key = str(rd.path)
        if now - self._looked.get(key, 0.0) < overlap.LOOK_EVERY_S:
            return
        self._looked[key] = now
        live, ended = gpu_ledger.read()
        rd.update_status(**overlap.record(rd, st, live, ended, now, overlap.host_load(), core_share.machine_cores()))

    def _settle_overlap(self, rd: RunDir) -> None:
        """Once the run ended: a last look (a run that ended since the previous one is in the ledger's recent
        runs), and what was still beside it then stayed to its end (status.json, then MLflow's tags)."""
        st = rd.status()
        settled = (st.get(overlap.OVERLAP) or {}).get("final") and overlap.at_last_step(st)
        if st.get("state") not in FINAL_STATES or not st.get("started") or settled:
            return
        end = st.get("ended") if isinstance(st.get("ended"), (int, float)) else time.time()
        live, ended = gpu_ledger.read()
        seen = overlap.record(rd, st, live, ended, end, None, core_share.machine_cores())
        rd.update_status(**{**seen, overlap.OVERLAP: overlap.settled({**st, **seen})})

    def follow_job(self, t: Tracked, st: dict[str, Any]) -> None:
        # an end seen here is settled (overlap) once the follower has drained the job's last lines:
        # its look at the ended run in RunFollower._finalize_run, before the MLflow run's end takes the tags
        liveness.check(t, st, self)

    def tags(self, st: dict[str, Any]) -> dict[str, Any]:
        """Whether other runs shared the machine during its timed steps (dstui.overlapped, dstui.overlap)."""
        return overlap.tags(st)

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
