"""The batch supervisor: launches queued runs, follows them, feeds MLflow.

One supervisor per batch, in its own process session (``dstui supervise``),
holding ``supervisor.lock``. It does not depend on a terminal or on the TUI:
they only read the run folders. If it dies, the next ``dstui status`` or TUI
start takes over: runs keep going (they are in their own sessions), their exit
status is in ``exit.json`` (see :mod:`dstui.execute.wrap`), and ingestion resumes
from the byte offsets in each run's ``ingest.json``.

The work is split by responsibility; this module is only the loop that ties it:

- :mod:`~dstui.execute.control`: the batch lock, starting a supervisor, cancel;
- :mod:`~dstui.execute.executor`: starting / checking / killing a run's job
  (local process group today; other executors plug in there);
- :mod:`~dstui.execute.ingest`: reading new records of a run into points;
- :mod:`~dstui.execute.sink`: MLflow runs, sending points exactly once;
- :mod:`~dstui.execute.liveness`: cancel, hang and end checks, the final reason.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import time
from pathlib import Path

from dstui.core import phases, secrets
from dstui.core.errors import LockHeld
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import gpu_share, ingest, launch, liveness, prebuild, slurm, sysmetrics
from dstui.execute.control import (  # noqa: F401 - the supervisor's public face
    BatchLock,
    ensure_supervised,
    is_supervised,
    kick,
    request_cancel,
    spawn,
)
from dstui.execute.executor import KILL_GRACE_S, executor_for, group_alive, kill_group  # noqa: F401
from dstui.execute.guard_watch import BatchGuard
from dstui.execute.ingest import Tracked
from dstui.execute.sink import MlflowSink

log = logging.getLogger("dstui.execute.supervisor")

TROUBLE_WAIT_S = 5.0
LIVE_STATES = ("running", "starting")


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
        self.system_interval_s = system_interval_s
        self.info = batch.info()
        self.parallel = max(gpu_share.AUTO, int(self.info.get("parallel", 1)))
        self.lock = BatchLock(batch)
        self.sink = MlflowSink(batch, tracking_uri, flush_interval_s)
        self.tracked: dict[str, Tracked] = {}
        # Slurm jobs are followed batch-wide (one squeue a pass), so that executor lives here
        self.slurm = slurm.SlurmExecutor(self.info) if self.info.get("executor") == "slurm" else None
        if self.slurm is not None:
            self.parallel = self.slurm.max_active
        self._jobs_known = True
        self.guards = BatchGuard(batch)
        self._problem: str | None = None

    def run(self) -> int:
        self.lock.acquire()
        try:
            log.info("supervising batch %s (pid %d)", self.batch.id, os.getpid())
            self.sink.parent_run_id()
            if self.slurm is None:  # JIT ops built once, before any run's clock starts
                prebuild.before_first_run(self.batch, on_gpu=sysmetrics.gpu_count() > 0, log=log)
            while True:
                try:
                    self.step()
                    if self.done():
                        self.finalize_batch()
                        # a retry may have queued a run while we were finishing: look again
                        if not any(r.state == "queued" for r in self.batch.runs()):
                            return 0
                        self.batch.update_info(finalized=False)
                    if self._problem:
                        self._problem = None
                        self.batch.update_info(supervisor_problem=None)
                except OSError as e:
                    # a full disk (or a vanished folder) must not kill the supervisor: a dead one
                    # is restarted by the next `dstui` call and dies again, in a loop
                    self._trouble(e)
                    time.sleep(TROUBLE_WAIT_S)
                time.sleep(self.poll_s)
        finally:
            self.lock.release()

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
        runs = self.batch.runs()
        return all(r.state in FINAL_STATES for r in runs) and all(self._tracked(r).finalized for r in runs)

    def step(self) -> None:
        runs = self.batch.runs()
        if self.sink.store_vanished():
            self._resend_all(runs)
        if self.slurm is not None:
            self._refresh_jobs(runs)
        for rd in runs:
            if not rd.path.exists():
                continue
            if self._live(rd.status()) or rd.state in FINAL_STATES and not self._tracked(rd).finalized:
                self.follow(rd)
        active = [r for r in runs if self._live(r.status())]
        total_gpus = None
        for rd in runs:
            if rd.state == "queued" and not rd.status().get("job_id"):
                if rd.cancel_file.exists():
                    rd.update_status(state="killed", reason="cancelled before start", ended=time.time())
                    continue
                if self.slurm is not None:  # Slurm places the job: only the count is ours
                    if len(active) >= self.parallel:
                        break
                    self.launch(rd, None)
                    active.append(rd)
                    continue
                if total_gpus is None:
                    total_gpus = sysmetrics.gpu_count()
                go, gpu_slice = gpu_share.choose(
                    rd.spec().get("settings") or {},
                    parallel=self.parallel,
                    active=len(active),
                    busy_slices=[b.status().get("gpu_slice") for b in active],
                    total_gpus=total_gpus,
                )
                if not go:
                    break  # runs start in their batch order
                self.launch(rd, gpu_slice)
                active.append(rd)

    def _resend_all(self, runs: list[RunDir]) -> None:
        """The store was lost: every point, tag and artifact goes again, from the run folders."""
        for rd in runs:
            t = self._tracked(rd)
            t.rewind()
            t.save()
            rd.update_status(mlflow_run_id=None)

    def _live(self, st: dict) -> bool:
        """Started and not ended: a local process, or a submitted Slurm job (pending included)."""
        return st.get("state") in LIVE_STATES or self.slurm is not None and slurm.has_job(st)

    def _refresh_jobs(self, runs: list[RunDir]) -> None:
        try:
            changed = self.slurm.refresh(runs)  # type: ignore[union-attr]
            self._jobs_known = True
        except slurm.SlurmError as e:  # slurmctld busy or down: keep following files, judge no job
            log.warning("Slurm did not answer: %s", e)
            self._jobs_known = False
            return
        for rd in changed:  # Slurm's state and pending reason, visible in MLflow while it waits
            st = rd.status()
            self.sink.tag(rd, {"dstui.status": st.get("state"), "dstui.reason": st.get("reason") or "",
                               "dstui.slurm_job": st.get("job_id"), "dstui.slurm_state": st.get("slurm_state"),
                               "dstui.nodes": st.get("nodes") or ""})  # fmt: skip

    def _tracked(self, rd: RunDir) -> Tracked:
        t = self.tracked.get(rd.name)
        if t is None:
            t = Tracked.load(rd, ingest.metrics_format(rd))
            self.tracked[rd.name] = t
        return t

    # ---- launching ----

    def launch(self, rd: RunDir, gpu_slice: list[int] | None) -> None:
        if self.slurm is not None:
            self._submit(rd)
            return
        run = launch.load_runspec(rd)
        rev = rd.spec().get("revision_info") or {}
        executor = executor_for(rd.status())
        rd.update_status(state="starting")
        self.sink.child_run_id(rd)
        try:
            handle = executor.start(
                run,
                rd,
                python=rev.get("python"),
                gpu_slice=gpu_slice,
                # Bundled runners start in the run folder: `python -m` puts the cwd first on
                # sys.path, and a DeepSpeed clone there would shadow the revision's deepspeed.
                cwd=self.info.get("cwd") if run.settings.kind == "command" else None,
                revision=rev,
            )
        except OSError as e:
            rd.update_status(state="failed", reason=f"could not start: {e}", ended=time.time())
            return
        t = self._tracked(rd)
        t.proc = handle
        pid = rd.status().get("pid")
        t.tree = sysmetrics.ProcessTreeSampler(pid) if pid else None
        log.info("started %s (%s, pid %s)", rd.name, executor.name, pid)

    def _submit(self, rd: RunDir) -> None:
        self.sink.child_run_id(rd)
        try:
            self.slurm.submit(rd)  # type: ignore[union-attr]
        except (slurm.SlurmError, OSError) as e:
            rd.update_status(state="failed", reason=f"could not submit: {e}", ended=time.time())

    # ---- following ----

    def follow(self, rd: RunDir) -> None:
        t = self._tracked(rd)
        st = rd.status()
        live = self._live(st)
        if live and self.slurm is None:  # a Slurm job's processes are on its nodes
            ingest.sample_system(t, st, self.system_interval_s, time.time())
        t.pending.extend(self._read(t))
        self._guard(rd)
        if live and self.slurm is not None:
            self._check_job(rd, st)
        elif live:
            liveness.check(t, st, executor_for(st))
        self.sink.flush(t)
        if rd.state in FINAL_STATES and not t.finalized:
            self._finalize_run(t)

    def _guard(self, rd: RunDir) -> None:
        """Flag a NaN/diverged loss at its step (status.json, MLflow tag); end the run if stop_on says so."""
        flag = self.guards.after_ingest(
            rd, kill=lambda st: executor_for(st).kill(st, grace_s=1.0), tag=lambda tags: self.sink.tag(rd, tags)
        )
        if flag is not None:
            log.warning("%s: %s", rd.name, flag.message)

    def _check_job(self, rd: RunDir, st: dict) -> None:
        """A Slurm run: alive while Slurm says so; cancel and hang go through scancel."""
        ex = self.slurm
        if ex is None or not self._jobs_known:
            return
        if ex.alive(st):
            if rd.cancel_file.exists() and not st.get("cancel_sent"):
                rd.update_status(cancel_sent=True)
                ex.kill(st)
            elif st.get("state") == "running" and st.get("started") and liveness.hung(rd, st):
                ex.kill(st)
            return
        exit_info, verdict = ex.outcome(rd)
        if verdict and verdict.get("reason"):  # Slurm ended it (TIMEOUT, NODE_FAIL, ...)
            rd.update_status(**verdict, exit_code=exit_info.get("exit_code"), signal=exit_info.get("signal"), ended=time.time())
            log.info("%s ended: %s %s", rd.name, verdict["state"], verdict["reason"])
            return
        if verdict:
            rd.update_status(**verdict)
        liveness.settle(rd, exit_info)

    def _read(self, t: Tracked) -> list[ingest.Point]:
        """New points of a run; if reading fails half-way (a full disk), the offsets go back too,
        so the same lines are read again later instead of being skipped."""
        mark = t.mark()
        try:
            return ingest.read_points(t, lambda rec: self._on_header(t, rec))
        except OSError:
            t.restore(mark)
            raise

    def _on_header(self, t: Tracked, rec: dict) -> None:
        rd = t.rd
        rd.update_status(header={k: rec.get(k) for k in ("device", "gpu_name", "gpu_count", "world_size", "hostname", "versions")})
        rev = rd.spec().get("revision_info") or {}
        if rev and (rd.spec().get("settings") or {}).get("kind") != "command":
            from dstui.revisions.envs import ResolvedRevision, check_reported_version

            mismatch = check_reported_version(ResolvedRevision.from_dict(rev), rec)
            if mismatch:
                log.error("%s: %s", rd.name, mismatch)
                st = rd.update_status(reason=f"revision mismatch: {mismatch}", revision_mismatch=True)
                executor_for(st).kill(st, grace_s=1.0)
        self.sink.header(t, rec)

    # ---- finishing ----

    def _finalize_run(self, t: Tracked) -> None:
        # drain whatever the job wrote last (reads are capped per call, so loop)
        while True:
            before = (t.metrics.offset, t.system.offset)
            t.pending.extend(self._read(t))
            self.sink.flush(t, force=True)
            if t.pending:
                return  # MLflow is down: try again on the next pass
            if (t.metrics.offset, t.system.offset) == before:
                break
        phases.record(t.rd)  # the run's time breakdown into status.json, for the sink and `dstui status`
        if not self.sink.finish_run(t):
            return
        t.finalized = True
        t.save()
        st = t.rd.status()
        if st.get("requeue"):  # Slurm preempted it or lost a node: a fresh attempt, once by default
            from dstui.execute.batch import reset_run

            reset_run(t.rd)
            t.rd.update_status(requeues=int(st.get("requeues") or 0) + 1)
            self.tracked.pop(t.rd.name, None)
            log.info("%s: submitted again after %s", t.rd.name, st.get("slurm_state"))

    def finalize_batch(self) -> None:
        states = [r.state for r in self.batch.runs()]
        self.sink.finish_batch(states)
        self.batch.update_info(finalized=True, ended=time.time())
        log.info("batch %s finished: %s", self.batch.id, {s: states.count(s) for s in set(states)})


def main(batch_path: str) -> int:
    # An unreachable tracking server must not stall following the runs: fail fast,
    # keep the metrics on disk, retry on a later pass.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    secrets.mask_output()  # supervisor.log: no credentials, no hidden env value, tracebacks included
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    batch = BatchDir(Path(batch_path).resolve())
    try:
        return Supervisor(batch).run()
    except LockHeld as e:
        print(f"dstui: {e}", file=sys.stderr)
        return 3
