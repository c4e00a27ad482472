"""Following the runs of a batch: new records in, guard and liveness checks, MLflow out, the end.

One pass over a run (:meth:`RunFollower.follow`): its system readings (the
backend's: sampled here, or merged from the job's nodes), its new records
(:mod:`~dstui.execute.ingest`), the live guard's judgement of the new losses,
one look at its job through the batch's backend (cancel, stall, end:
:mod:`~dstui.execute.backends`), the points sent (:mod:`~dstui.execute.sink`)
and, once it ended, drained and finalized. The supervisor's loop decides which runs
to follow and when; this module is what following one means.
"""

from __future__ import annotations

import logging

from dstui.core import phases
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import backends, ingest
from dstui.execute.backends.base import Backend
from dstui.execute.guard_watch import BatchGuard
from dstui.execute.ingest import Tracked
from dstui.execute.sink import MlflowSink
from dstui.tracking import tags as tag_keys

log = logging.getLogger("dstui.execute.supervisor")


class RunFollower:
    """Per-run ingestion state of one batch and the pass that moves each run forward."""

    def __init__(self, batch: BatchDir, sink: MlflowSink, backend: Backend | None, system_interval_s: float) -> None:
        self.batch = batch
        self.sink = sink
        # None: the batch's own (batch.json's executor); one per batch, e.g. Slurm's one squeue a pass
        self.backend = backend if backend is not None else backends.for_batch(batch.info())
        self.system_interval_s = system_interval_s
        self.tracked: dict[str, Tracked] = {}
        self.attempts: dict[str, int] = {}  # the attempt each Tracked belongs to
        self.guards = BatchGuard(batch)
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
        """Started and not ended: a process here, or a job the backend follows (a pending one included)."""
        return self.backend.live(st)

    def resend_all(self, runs: list[RunDir]) -> None:
        """The store was lost: every point, tag and artifact goes again, from the run folders."""
        for rd in runs:
            t = self.tracked_of(rd)
            t.rewind()
            t.save()
            rd.update_status(mlflow_run_id=None)

    def refresh_jobs(self, runs: list[RunDir]) -> None:
        """The backend's view of the batch's jobs, once a pass; a changed state or pending reason goes to MLflow."""
        for rd in self.backend.refresh(runs):  # visible in MLflow while it waits
            st = rd.status()
            tags = {tag_keys.STATUS: st.get("state"), tag_keys.REASON: st.get("reason") or "", **self.backend.tags(st)}
            self.sink.tag(rd, tags)

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
        self.backend.readings(t, st, live=live, interval_s=self.system_interval_s)
        bad_before = t.metrics.bad_lines
        t.pending.extend(self._read(t))
        if t.metrics.bad_lines != bad_before:
            self._bad_lines(t, bad_before)
        self._refused_files(t)
        self._guard(rd)
        if live:
            self.backend.follow_job(t, st)
        self._flush(t)
        if rd.state in FINAL_STATES and not t.finalized:
            self._finalize_run(t)

    def _bad_lines(self, t: Tracked, before: int) -> None:
        """New bad lines: one log line when the first appears, the count live on the MLflow run."""
        if before == 0:
            log.warning("%s: bad metric line(s) left out (first: %s)", t.rd.name, t.metrics.first_bad)
        self.sink.tag(t.rd, {tag_keys.BAD_METRIC_LINES: t.metrics.bad_lines, tag_keys.FIRST_BAD_LINE: t.metrics.first_bad})

    def _refused_files(self, t: Tracked) -> None:
        """A run's file that is a link, FIFO or device in its folder: named once (log, status.json, MLflow
        tag), never read; a problem of this run alone (dstui.core.run_files)."""
        for f in (t.metrics, t.system):
            if f.refused and t.rd.note_file_problem(f.refused):
                log.warning("%s: %s", t.rd.name, f.refused)
                problems = t.rd.status().get("file_problems") or {}
                self.sink.tag(t.rd, {tag_keys.FILE_PROBLEMS: "; ".join(str(v) for v in problems.values())})

    def _flush(self, t: Tracked, *, force: bool = False) -> None:
        """Send the run's pending points; points that went through end an episode of store trouble."""
        had = bool(t.pending)
        self.sink.flush(t, force=force)
        if had and not t.pending:
            self.sink.up()

    def _guard(self, rd: RunDir) -> None:
        """Flag a NaN/diverged loss at its step (status.json, MLflow tag); end the run if stop_on says so."""
        flag = self.guards.after_ingest(
            rd, kill=lambda st: self.backend.cancel(st, grace_s=1.0), tag=lambda values: self.sink.tag(rd, values)
        )
        if flag is not None:
            log.warning("%s: %s", rd.name, flag.message)

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
            from dstui.revisions.resolved import ResolvedRevision, check_reported_version

            mismatch = check_reported_version(ResolvedRevision.from_dict(rev), rec)
            if mismatch:
                log.error("%s: %s", rd.name, mismatch)
                st = rd.update_status(reason=f"revision mismatch: {mismatch}", revision_mismatch=True)
                self.backend.cancel(st, grace_s=1.0)
        self.sink.header(t, rec)

    def _drained(self, t: Tracked) -> bool:
        """Whatever the job wrote last read and sent (reads are capped per call, so loop); False: MLflow is down."""
        while True:
            before = (t.metrics.offset, t.system.offset)
            t.pending.extend(self._read(t, final=True))
            self._flush(t, force=True)
            if t.pending:
                return False
            if (t.metrics.offset, t.system.offset) == before:
                return True

    def _finalize_run(self, t: Tracked) -> None:
        if not self._drained(t):
            return  # try again on the next pass
        # the backend's look at the ended run again, now that its last step is in status.json: the end
        # may have been seen (follow_job) before the last lines were read, and what it settled then
        # (the overlap's timeline) would stop short of the last step; a last merge of what the job's
        # nodes sampled (Slurm) is read by a second drain
        self.backend.readings(t, t.rd.status(), live=False, interval_s=self.system_interval_s)
        if not self._drained(t):
            return
        try:  # the run's time breakdown into status.json, for the sink and `dstui status`
            phases.record(t.rd)
        except (TypeError, ValueError, KeyError) as e:  # odd phases/summary records: no breakdown, the run still ends
            log.warning("%s: no time breakdown (%s: %s)", t.rd.name, type(e).__name__, str(e)[:200])
        if not self.sink.finish_run(t, self.backend.tags(t.rd.status())):
            return
        t.finalized = True
        t.save()
