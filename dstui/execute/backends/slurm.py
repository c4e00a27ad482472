"""The Slurm backend: each run of a batch is its own Slurm job.

The supervisor stays on the submitting node. It submits a run's job script
(:mod:`~dstui.execute.backends.slurm_script`), follows the run folder as for a
local run (the folder lives on the shared filesystem), and follows Slurm's view
of the batch's jobs with one ``squeue`` per pass (:meth:`SlurmBackend.refresh`).
A job's end comes from Slurm (its final state) plus ``exit.json`` written by the
job's wrapper; Slurm's own verdicts (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL,
PREEMPTED, ...) become the reason. The job's system readings come from a
sampler on each of its nodes (:mod:`dstui.execute.injob.node_sampler`), merged
into the run's ``system.jsonl`` here (:mod:`~dstui.execute.backends.slurm_nodes`).
Before anything is created, :func:`preflight` asks Slurm what it would refuse.

A requeued job (``scontrol requeue``, a node failure or preemption with
requeue: the job goes back to PENDING after it ran, same job id) and a job dstui
submits again itself after PREEMPTED / NODE_FAIL (a new job id) are the same run
going on: the same run folder, the same MLflow run, a new attempt in its metrics
file (:mod:`dstui.core.attempt_steps`); while it waits its reason says
``requeued, attempt N``.

Status fields it adds: ``executor`` ("slurm"), ``job_id``, ``slurm_state``,
``nodes``, ``requeue_waits`` (back in the queue after it ran), ``resubmits``
(dstui's own submissions again); ``requeues`` and ``repeated_steps`` come from
the metrics (:mod:`dstui.execute.ingest`).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dstui.core import run_status
from dstui.core.rundir import ACTIVE_STATES, LIVE_STATES, BatchDir, RunDir
from dstui.execute import launch, liveness
from dstui.execute.backends import OPTIONS, slurm_cli, slurm_nodes, slurm_script
from dstui.execute.backends.base import Preview, Starter
from dstui.execute.backends.slurm_cli import JobInfo, SlurmError
from dstui.execute.backends.slurm_script import SCRIPT_NAME, job_script
from dstui.execute.ingest import Tracked
from dstui.spec.experiment import ExperimentSpec, RunSpec, SlurmOptions
from dstui.tracking import tags as tag_keys

log = logging.getLogger("dstui.execute.slurm")

# Slurm's answers are reused this long: one squeue a supervisor pass serves every run of the batch
FRESH_S = 2.0


def options_of(info: dict[str, Any]) -> SlurmOptions:
    """The batch's Slurm options from its batch.json (``slurm``: batches from before the backends)."""
    return SlurmOptions.model_validate(info.get(OPTIONS) or info.get("slurm") or {})


def script_for(rd: RunDir, info: dict[str, Any], *, port: int) -> tuple[str, list[str], RunSpec, dict]:
    """Job script text, each rank's argv, the run and its revision, for a prepared run folder."""
    run = launch.load_runspec(rd)
    rev = rd.spec().get("revision_info") or {}
    cwd = info.get("cwd") if run.settings.kind == "command" else None
    text = job_script(run, rd, options_of(info), port=port, python=rev.get("python"), revision=rev, cwd=cwd,
                      batch_id=info.get("id", ""))  # fmt: skip
    return text, slurm_script.rank_argv(run, rd, python=rev.get("python") or sys.executable, port=port), run, rev


def has_job(st: dict[str, Any]) -> bool:
    """A run that was submitted and has not ended: it counts against ``max_jobs``."""
    return bool(st.get("job_id")) and st.get("state") in ACTIVE_STATES


def job_tags(st: dict[str, Any]) -> dict[str, Any]:
    """A Slurm run's job id, Slurm's state of it and its nodes, from status.json; how often it was requeued."""
    tags = {tag_keys.SLURM_JOB: st.get("job_id"), tag_keys.SLURM_STATE: st.get("slurm_state"), tag_keys.NODES: st.get("nodes") or ""}
    if st.get("requeues"):  # the same MLflow run across its attempts (dstui.core.attempt_steps)
        tags.update({tag_keys.REQUEUES: st["requeues"], tag_keys.REPEATED_STEPS: st.get("repeated_steps") or 0})
    return tags


class SlurmBackend:
    """Submits, follows and cancels Slurm jobs; :class:`~dstui.execute.backends.base.Backend` for ``"slurm"``.

    The supervisor holds one per Slurm batch (``info`` = batch.json) and refreshes
    every job of the batch with one squeue a pass; the shared instance
    (:func:`dstui.execute.backends.get`) answers ``dstui cancel`` and ``--resume``
    from a run's status alone.
    """

    name = "slurm"
    finishing_poll_s: float | None = None  # a pass asks squeue: not ten times a second
    shown_fields = (("job", "job_id", 7), ("nodes", "nodes", 4))

    def __init__(self, info: dict[str, Any] | None = None) -> None:
        self.info = info or {}
        self.opts = options_of(self.info)
        self._jobs: dict[str, JobInfo] = {}
        self._asked: dict[str, float] = {}  # job id -> when squeue answered (absent from the answer = forgotten)
        self.jobs_known = True  # False for a pass in which Slurm did not answer: no job is judged then

    @property
    def max_active(self) -> int:
        return self.opts.max_jobs or 1_000_000

    # ---- before a batch exists ----

    def capacity(self) -> None:
        """Slurm places the jobs: this machine is not what they get; sbatch --test-only judges them (preflight)."""
        return None

    def preflight(self, plan: Any) -> None:
        preflight(plan.runs, plan.spec.slurm, plan.revisions)

    def preview(self, plan: Any, run: RunSpec, rd: RunDir) -> Preview:
        """The job script as it would be written to the run folder, and what each rank runs."""
        rev = plan.revisions.get(run.revision) or {}
        cwd = None if run.settings.kind != "command" else os.getcwd()
        text = job_script(run, rd, plan.spec.slurm, port=29500, python=rev.get("python"), revision=rev, cwd=cwd)
        command = slurm_script.rank_argv(run, rd, python=rev.get("python") or sys.executable, port=29500)
        return Preview(launch.shown_command(run, command), f"# ---- {rd.path / SCRIPT_NAME}\n{text}")

    def batch_options(self, spec: ExperimentSpec) -> dict[str, Any]:
        return spec.slurm.model_dump(mode="json")

    def launch_notes(self, batch: BatchDir) -> list[str]:
        return []

    # ---- the supervisor of one batch ----

    def before_first_run(self, batch: BatchDir, log: logging.Logger) -> None:
        """Nothing: ops are built on the job's nodes, by its ranks."""

    def start_queued(self, batch: BatchDir, queued: list[RunDir], active: list[RunDir], start: Starter) -> None:
        """Slurm places each job: only how many are pending or running at once is ours (``max_jobs``)."""
        for rd in queued:
            if len(active) >= self.max_active:
                break
            start(rd, None)
            active.append(rd)

    def start(self, rd: RunDir, t: Tracked, slot: Any) -> bool:
        rd.update_status(starting=time.time())
        try:
            self.submit(rd)
        except (SlurmError, OSError) as e:
            run_status.ended(rd, run_status.FAILED, f"could not submit: {e}")
            return False
        return True

    def submit(self, rd: RunDir) -> str:
        """Write job.sh into the run folder and sbatch it; the run stays 'queued' until Slurm runs it."""
        port = launch.free_port()
        text, argv, run, rev = script_for(rd, self.info or rd.batch.info(), port=port)
        launch.check_real_env(run, rd)
        script = rd.path / SCRIPT_NAME
        script.write_text(text)
        _, argv_values = slurm_script.hidden_argv(run, argv)  # job.sh names them; sbatch's environment holds them
        argv = launch.shown_command(run, argv)
        rd.cmd_file.write_text(shlex.join(argv) + "\n")
        rd.exit_file.unlink(missing_ok=True)
        env = {**os.environ, **launch.build_env(run, rd, revision=rev), **argv_values}
        job_id = slurm_cli.submit(script, env=env)
        st = rd.status()
        run_status.waiting(
            rd, waiting_again(st, "Slurm: PENDING") if st.get("requeue_waits") else "Slurm: PENDING",
            executor=self.name, job_id=job_id, slurm_state="PENDING", submitted=time.time(), argv=argv, master_port=port,
        )  # fmt: skip
        log.info("submitted %s as Slurm job %s", rd.name, job_id)
        return job_id

    def refresh(self, runs: list[RunDir]) -> list[RunDir]:
        """One squeue for every submitted, unfinished run; their statuses follow Slurm's view.

        Returns the runs whose Slurm state, reason or nodes changed. When Slurm does
        not answer (slurmctld busy or down) the files are still followed, but no job
        is judged this pass.
        """
        followed = [(rd, st) for rd in runs if has_job(st := rd.status())]
        try:
            answer = self._ask([st["job_id"] for _, st in followed])
            self.jobs_known = True
        except SlurmError as e:
            log.warning("Slurm did not answer: %s", e)
            self.jobs_known = False
            return []
        changed = []
        for rd, st in followed:
            job = answer.get(st["job_id"])
            if job is None or job.final:
                continue  # the end is settled by follow_job
            fields = job_fields(st, job)
            if any(st.get(k) != v for k, v in fields.items()):
                run_status.moved_by_scheduler(rd, **fields)
                changed.append(rd)
        return changed

    def _ask(self, ids: list[str]) -> dict[str, JobInfo]:
        answer = slurm_cli.jobs(ids)
        now = time.time()
        self._jobs.update(answer)
        self._asked.update(dict.fromkeys(ids, now))
        return answer

    def live(self, st: dict[str, Any]) -> bool:
        """Started and not ended, or a submitted job (pending included)."""
        return st.get("state") in LIVE_STATES or has_job(st)

    def readings(self, t: Tracked, st: dict[str, Any], *, live: bool, interval_s: float) -> None:
        """A job's processes are on its nodes, where a sampler per node wrote them (dstui.execute.injob.node_sampler)."""
        slurm_nodes.merge(t.rd.path, t.rd.system_file)

    def follow_job(self, t: Tracked, st: dict[str, Any]) -> None:
        """Alive while Slurm says so; cancel and hang go through scancel; the end is Slurm's verdict or the exit code."""
        rd = t.rd
        if not self.jobs_known:
            return
        if self.alive(st):
            if rd.cancel_file.exists() and not st.get("cancel_sent"):
                rd.update_status(cancel_sent=True)
                self.cancel(st)
            elif st.get("state") == "running" and st.get("started") and liveness.hung(rd, st):
                self.cancel(st)
            return
        exit_info, verdict = self.outcome(rd)
        if verdict and verdict.pop("requeue", False):  # PREEMPTED, NODE_FAIL: the same run goes on, submitted again
            self.resubmit(rd, verdict)
            return
        if verdict and verdict.get("reason"):  # Slurm ended it (TIMEOUT, NODE_FAIL, ...)
            state, reason = verdict.pop("state"), verdict.pop("reason")
            run_status.ended(rd, state, reason, **verdict, exit_code=exit_info.get("exit_code"), signal=exit_info.get("signal"))
            log.info("%s ended: %s %s", rd.name, state, reason)
            return
        if verdict:
            rd.update_status(**verdict)
        liveness.settle(rd, exit_info)

    def tags(self, st: dict[str, Any]) -> dict[str, Any]:
        return job_tags(st) if st.get("job_id") else {}

    # ---- a run's job, from its status alone ----

    def alive(self, st: dict[str, Any]) -> bool:
        """False once Slurm reports a final state or has forgotten the job."""
        job_id = st.get("job_id")
        if not job_id:
            return False
        if time.time() - self._asked.get(job_id, 0.0) > FRESH_S:
            self._ask([job_id])
        job = self._jobs.get(job_id)
        return job is not None and not job.final

    def cancel(self, st: dict[str, Any], *, grace_s: float = 0.0) -> None:
        """scancel: Slurm signals every task and kills what is left after its KillWait."""
        if st.get("job_id"):
            slurm_cli.cancel(st["job_id"])

    # ---- how a job ended ----

    def resubmit(self, rd: RunDir, verdict: dict[str, Any]) -> None:
        """Slurm ended the job for the machine's sake (PREEMPTED, NODE_FAIL): the run goes on as its next attempt.

        Not ended, not a new attempt folder, not a new MLflow run: the run is queued
        without a job, so the supervisor's next pass submits it again (a new job id)
        into the same folder; its new attempt is told apart in the metrics.
        """
        st = {**rd.status(), "requeue_cause": verdict.get("reason")}
        run_status.waiting(
            rd, waiting_again(st, "submitted again"), job_id=None, slurm_state=verdict.get("slurm_state"),
            nodes=verdict.get("nodes"), resubmits=int(st.get("resubmits") or 0) + 1, requeue_waits=True,
            requeue_cause=st["requeue_cause"],
        )  # fmt: skip
        log.info("%s: %s; submitted again", rd.name, verdict.get("reason"))

    def outcome(self, rd: RunDir) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """How an ended job ended: (exit info, Slurm's verdict as status fields or None).

        The verdict is set when Slurm ended the job itself (time limit, memory,
        node failure, preemption, an outside scancel); otherwise the exit code
        decides, as for a local run.
        """
        st = rd.status()
        job = self._jobs.get(st.get("job_id") or "")
        exit_info = _read_exit(rd)
        if not exit_info and st.get("job_id"):
            code, _, sig = (slurm_cli.show_job(st["job_id"]).get("ExitCode") or ":").partition(":")
            if code.isdigit():
                exit_info = {"exit_code": int(code), "signal": int(sig) if sig.isdigit() and int(sig) else None}
        if job is None:
            return exit_info, None
        fields: dict[str, Any] = {"slurm_state": job.state, "nodes": job.nodes or st.get("nodes")}
        if job.state in ("FAILED", "CANCELLED") and slurm_cli.killed_over_memory(rd.log_tail(16384)):
            # memory enforced by job accounting (no cgroups): Slurm says FAILED, its step said why
            fields.update(state="failed", reason=slurm_cli.REASONS["OUT_OF_MEMORY"])
            return exit_info, fields
        if job.state in slurm_cli.REASONS and not (job.state == "CANCELLED" and rd.cancel_file.exists()):
            fields.update(state=job.dstui_state, reason=job.describe())
            resubmits = int(st.get("resubmits") or 0)
            if job.state in slurm_cli.REQUEUE_ON and resubmits < self.opts.requeue:
                fields["requeue"] = True  # submitted again (follow_job -> resubmit)
            return exit_info, fields
        return exit_info, (fields if fields["nodes"] else None)


def job_fields(st: dict[str, Any], job: JobInfo) -> dict[str, Any]:
    """The status fields of a submitted run that Slurm's view of its unfinished job decides."""
    fields: dict[str, Any] = {"slurm_state": job.state, "nodes": job.nodes or st.get("nodes")}
    state = job.dstui_state
    fields["state"] = state
    if state == "queued":
        fields["reason"] = job.describe()
        if st.get("started") and (st.get("state") != "queued" or st.get("requeue_waits")):
            # it ran and is back in the queue: Slurm requeued it; it goes on as the next attempt
            fields.update(requeue_waits=True, reason=waiting_again(st, job.describe()))
    elif st.get("state") == "queued" and st.get("started"):
        # a requeued job runs again: the stall clock starts afresh, the run's start stays the first
        fields.update(requeue_waits=False, requeue_cause=None, reason=None, last_step_at=time.time(),
                      last_step_time=None, restarted=time.time())  # fmt: skip
    elif st.get("state") == "queued":
        fields.update(started=time.time(), reason=None)
    return fields


def waiting_again(st: dict[str, Any], now: str) -> str:
    """The reason of a run back in the queue after it ran: the attempt that waits, why, and what Slurm says now."""
    cause = st.get("requeue_cause")
    return f"requeued, attempt {int(st.get('requeues') or 0) + 2}{f' (after {cause})' if cause else ''}: {now}"


def _read_exit(rd: RunDir) -> dict[str, Any]:
    try:
        return json.loads(Path(rd.exit_file).read_text())
    except (OSError, ValueError):
        return {}


def preflight(runs: list[RunSpec], opts: SlurmOptions, revisions: dict[str, dict]) -> None:
    """Everything Slurm would refuse, found before any folder exists or any job is submitted.

    Slurm installed, the partition known, and ``sbatch --test-only`` accepting
    a job script of every distinct shape (nodes, ranks, options) in the batch.
    """
    why = slurm_cli.available()
    if why:
        raise SlurmError(why)
    if opts.partition:
        slurm_cli.check_partition(opts.partition)
    with tempfile.TemporaryDirectory(prefix="dstui-sbatch-") as tmp:
        seen: set[tuple[str, ...]] = set()
        for run in runs:
            rd = RunDir(Path(tmp) / run.name)
            shape = tuple(o for o in slurm_script.sbatch_options(run, rd, opts, cwd=tmp)
                          if not o.startswith(("--job-name", "--output")))  # fmt: skip
            if shape in seen:
                continue
            seen.add(shape)
            rev = revisions.get(run.revision) or {}
            script = Path(tmp) / f"{run.name}.sh"
            script.write_text(job_script(run, rd, opts, port=29500, python=rev.get("python"), revision=rev, cwd=tmp))
            try:
                slurm_cli.submit(script, test_only=True)
            except SlurmError as e:
                raise SlurmError(f"run {run.name}: {e}") from None
