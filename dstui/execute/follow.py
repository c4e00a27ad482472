"""Following the runs of a batch: new records in, guard and liveness checks, MLflow out, the end.

One pass over a run (:meth:`RunFollower.follow`): sample its processes, read
its new records (:mod:`~dstui.execute.ingest`), let the live guard judge the new
losses, check that it is alive and not stuck (:mod:`~dstui.execute.liveness`,
or Slurm's view of its job), send the points (:mod:`~dstui.execute.sink`) and,
once it ended, drain and finalize it. The supervisor's loop decides which runs
to follow and when; this module is what following one means.
"""

from __future__ import annotations

import logging
import time

from dstui.core import phases
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import ingest, live_phase, liveness, node_sampler, slurm
from dstui.execute.executor import executor_for
from dstui.execute.guard_watch import BatchGuard
from dstui.execute.ingest import Tracked
from dstui.execute.mlflow_runs import job_tags
from dstui.execute.sink import MlflowSink
from dstui.tracking import tags as tag_keys

log = logging.getLogger("dstui.execute.supervisor")

LIVE_STATES = ("running", "starting")


class RunFollower:
    """Per-run ingestion state of one batch and the pass that moves each run forward."""

    def __init__(
        self, batch: BatchDir, sink: MlflowSink, slurm_ex: slurm.SlurmExecutor | None, system_interval_s: float
    ) -> None:
        self.batch = batch
        self.sink = sink
        self.slurm = slurm_ex  # Slurm jobs are followed batch-wide: one squeue a pass
        self.system_interval_s = system_interval_s
        self.tracked: dict[str, Tracked] = {}
        self.attempts: dict[str, int] = {}  # the attempt each Tracked belongs to
        self.guards = BatchGuard(batch)
        self.jobs_known = True
        self.phases = live_phase.LivePhases()
        self._trouble: dict[str, str] = {}  # run name -> the error last logged for it (logged once)

    def tracked_of(self, rd: RunDir) -> Tracked:
        """The run's ingestion state, for its current attempt: a run queued again (retry, resume)
        while this supervisor lives starts afresh, not at the old attempt's offsets, finalized."""
        t = self.tracked.get(rd.name)
        attempt = rd.status().get("attempt", 1)
        if t is None or self.attempts.get(rd.name) != attempt:
            t = Tracked.load(rd, ingest.metrics_format(rd))
            self.tracked[rd.name] = t
            self.attempts[rd.name] = attempt
        return t

    def live(self, st: dict) -> bool:
        """Started and not ended: a local process, or a submitted Slurm job (pending included)."""
        return st.get("state") in LIVE_STATES or self.slurm is not None and slurm.has_job(st)

    def resend_all(self, runs: list[RunDir]) -> None:
        """The store was lost: every point, tag and artifact goes again, from the run folders."""
        for rd in runs:
            t = self.tracked_of(rd)
            t.rewind()
            t.save()
            rd.update_status(mlflow_run_id=None)

    def refresh_jobs(self, runs: list[RunDir]) -> None:
        """Slurm's view of the batch's jobs, once a pass; their state and pending reason go to MLflow."""
        try:
            changed = self.slurm.refresh(runs)  # type: ignore[union-attr]
            self.jobs_known = True
        except slurm.SlurmError as e:  # slurmctld busy or down: keep following files, judge no job
            log.warning("Slurm did not answer: %s", e)
            self.jobs_known = False
            return
        for rd in changed:  # visible in MLflow while it waits
            st = rd.status()
            self.sink.tag(rd, {tag_keys.STATUS: st.get("state"), tag_keys.REASON: st.get("reason") or "", **job_tags(st)})

    def follow(self, rd: RunDir) -> None:
        """One pass over a run. An unexpected error is logged once and confined to this run:
        the other runs of the batch go on starting, streaming and finalizing (a full disk,
        an OSError, is the supervisor's to wait out and still goes up)."""
        try:
            self._follow(rd)
        except OSError:
            raise
        except Exception as e:
            what = f"{type(e).__name__}: {e}"[:300]
            if self._trouble.get(rd.name) != what:
                self._trouble[rd.name] = what
                log.exception("%s: could not follow this run this pass (%s); the other runs go on", rd.name, what)

    def _follow(self, rd: RunDir) -> None:
        t = self.tracked_of(rd)
        st = rd.status()
        live = self.live(st)
        if live and self.slurm is None:  # a Slurm job's processes are on its nodes
            ingest.sample_system(t, st, self.system_interval_s, time.time())
        elif self.slurm is not None:  # ... where a sampler per node wrote them (dstui.execute.node_sampler)
            node_sampler.merge(rd.path, rd.system_file)
        bad_before = t.metrics.bad_lines
        t.pending.extend(self._read(t))
        if t.metrics.bad_lines != bad_before:
            self._bad_lines(t, bad_before)
        self._guard(rd)
        if live and self.slurm is not None:
            self._check_job(rd, st)
        elif live:
            liveness.check(t, st, executor_for(st))
        self._flush(t)
        if self.slurm is None:
            self.phases.update(rd)  # what it does right now, for every view
        if rd.state in FINAL_STATES and not t.finalized:
            self._finalize_run(t)

    def _bad_lines(self, t: Tracked, before: int) -> None:
        """New bad lines: one log line when the first appears, the count live on the MLflow run."""
        if before == 0:
            log.warning("%s: bad metric line(s) left out (first: %s)", t.rd.name, t.metrics.first_bad)
        self.sink.tag(t.rd, {tag_keys.BAD_METRIC_LINES: t.metrics.bad_lines, tag_keys.FIRST_BAD_LINE: t.metrics.first_bad})

    def _flush(self, t: Tracked, *, force: bool = False) -> None:
        """Send the run's pending points; points that went through end an episode of store trouble."""
        had = bool(t.pending)
        self.sink.flush(t, force=force)
        if had and not t.pending:
            self.sink.up()

    def _guard(self, rd: RunDir) -> None:
        """Flag a NaN/diverged loss at its step (status.json, MLflow tag); end the run if stop_on says so."""
        flag = self.guards.after_ingest(
            rd, kill=lambda st: executor_for(st).kill(st, grace_s=1.0), tag=lambda values: self.sink.tag(rd, values)
        )
        if flag is not None:
            log.warning("%s: %s", rd.name, flag.message)

    def _check_job(self, rd: RunDir, st: dict) -> None:
        """A Slurm run: alive while Slurm says so; cancel and hang go through scancel."""
        ex = self.slurm
        if ex is None or not self.jobs_known:
            return
        if ex.alive(st):
            if rd.cancel_file.exists() and not st.get("cancel_sent"):
                rd.update_status(cancel_sent=True)
                ex.kill(st)
            elif st.get("state") == "running" and st.get("started") and liveness.hung(rd, st):
                ex.kill(st)
            return
        exit_info, verdict = ex.outcome(rd)
        if verdict and verdict.pop("requeue", False):  # PREEMPTED, NODE_FAIL: the same run goes on, submitted again
            ex.resubmit(rd, verdict)
            return
        if verdict and verdict.get("reason"):  # Slurm ended it (TIMEOUT, NODE_FAIL, ...)
            rd.update_status(**verdict, exit_code=exit_info.get("exit_code"), signal=exit_info.get("signal"), ended=time.time())
            log.info("%s ended: %s %s", rd.name, verdict["state"], verdict["reason"])
            return
        if verdict:
            rd.update_status(**verdict)
        liveness.settle(rd, exit_info)

    def _read(self, t: Tracked, *, final: bool = False) -> list[ingest.Point]:
        """New points of a run; if reading fails half-way (a full disk), the offsets go back too,
        so the same lines are read again later instead of being skipped. ``final``: the job has
        exited (an unterminated last line counts)."""
        mark = t.mark()
        try:
            return ingest.read_points(t, lambda rec: self._on_header(t, rec), final=final)
        except OSError:
            t.restore(mark)
            raise

    def _on_header(self, t: Tracked, rec: dict) -> None:
        rd = t.rd
        rd.update_status(header={k: rec.get(k) for k in ("device", "gpu_name", "gpu_count", "world_size", "hostname", "versions")})
        rev = rd.spec().get("revision_info") or {}
        if rev and rd.settings().get("kind") != "command":
            from dstui.revisions.envs import ResolvedRevision, check_reported_version

            mismatch = check_reported_version(ResolvedRevision.from_dict(rev), rec)
            if mismatch:
                log.error("%s: %s", rd.name, mismatch)
                st = rd.update_status(reason=f"revision mismatch: {mismatch}", revision_mismatch=True)
                executor_for(st).kill(st, grace_s=1.0)
        self.sink.header(t, rec)

    def _finalize_run(self, t: Tracked) -> None:
        # drain whatever the job wrote last (reads are capped per call, so loop)
        while True:
            before = (t.metrics.offset, t.system.offset)
            t.pending.extend(self._read(t, final=True))
            self._flush(t, force=True)
            if t.pending:
                return  # MLflow is down: try again on the next pass
            if (t.metrics.offset, t.system.offset) == before:
                break
        try:  # the run's time breakdown into status.json, for the sink and `dstui status`
            phases.record(t.rd)
        except (TypeError, ValueError, KeyError) as e:  # odd phases/summary records: no breakdown, the run still ends
            log.warning("%s: no time breakdown (%s: %s)", t.rd.name, type(e).__name__, str(e)[:200])
        if not self.sink.finish_run(t):
            return
        t.finalized = True
        t.save()
