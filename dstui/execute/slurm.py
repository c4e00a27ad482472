"""The Slurm executor: each run of a batch is its own Slurm job.

The supervisor stays on the submitting node. It submits a run's job script
(:mod:`dstui.execute.slurm_script`), follows the run folder as for a local run
(the folder lives on the shared filesystem), and follows Slurm's view of the
job with one ``squeue`` per pass over the batch. A job's end comes from Slurm
(its final state) plus ``exit.json`` written by the job's wrapper; Slurm's own
verdicts (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, ...) become the reason.

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
import time
from pathlib import Path
from typing import Any

from dstui.core.rundir import ACTIVE_STATES, RunDir
from dstui.execute import launch, slurm_cli, slurm_script
from dstui.execute.slurm_cli import JobInfo, SlurmError
from dstui.execute.slurm_script import SCRIPT_NAME, job_script
from dstui.spec.models import RunSpec, SlurmOptions

log = logging.getLogger("dstui.execute.slurm")


def script_for(rd: RunDir, info: dict[str, Any], *, port: int) -> tuple[str, list[str], RunSpec, dict]:
    """Job script text, each rank's argv, the run and its revision, for a prepared run folder."""
    run = launch.load_runspec(rd)
    rev = rd.spec().get("revision_info") or {}
    opts = SlurmOptions.model_validate(info.get("slurm") or {})
    cwd = info.get("cwd") if run.settings.kind == "command" else None
    text = job_script(run, rd, opts, port=port, python=rev.get("python"), revision=rev, cwd=cwd, batch_id=info.get("id", ""))
    from dstui.execute.slurm_script import rank_argv

    return text, rank_argv(run, rd, python=rev.get("python") or sys.executable, port=port), run, rev


def has_job(st: dict[str, Any]) -> bool:
    """A run that was submitted and has not ended: it counts against ``max_jobs``."""
    return bool(st.get("job_id")) and st.get("state") in ACTIVE_STATES


# Slurm's answers are reused this long: one squeue a supervisor pass serves every run of the batch
FRESH_S = 2.0


class SlurmExecutor:
    """Submits, follows and cancels Slurm jobs; :class:`dstui.execute.executor.Executor` for ``"slurm"``.

    The supervisor holds one per Slurm batch (``info`` = batch.json) and refreshes
    every job of the batch with one squeue a pass; the registered instance
    (``executor_for``) answers ``dstui cancel`` and ``--resume`` from a run's
    status alone.
    """

    name = "slurm"

    def __init__(self, info: dict[str, Any] | None = None) -> None:
        self.info = info or {}
        self.opts = SlurmOptions.model_validate(self.info.get("slurm") or {})
        self._jobs: dict[str, JobInfo] = {}
        self._asked: dict[str, float] = {}  # job id -> when squeue answered (absent from the answer = forgotten)

    @property
    def max_active(self) -> int:
        return self.opts.max_jobs or 1_000_000

    def start(self, run: RunSpec, rd: RunDir, **_ignored: Any) -> str:
        """Executor protocol: submit (python, cwd and revision come from the run folder and batch.json)."""
        return self.submit(rd)

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
        rd.update_status(
            executor="slurm", job_id=job_id, slurm_state="PENDING", state="queued",
            reason=waiting_again(st, "Slurm: PENDING") if st.get("requeue_waits") else "Slurm: PENDING",
            submitted=time.time(), argv=argv, master_port=port,
        )  # fmt: skip
        log.info("submitted %s as Slurm job %s", rd.name, job_id)
        return job_id

    def refresh(self, runs: list[RunDir]) -> list[RunDir]:
        """One squeue for every submitted, unfinished run; their statuses follow Slurm's view.

        Returns the runs whose Slurm state, reason or nodes changed.
        """
        changed = []
        followed = {rd.name: (rd, st) for rd in runs if has_job(st := rd.status())}
        ids = [st["job_id"] for _, st in followed.values()]
        answer = self._ask(ids)
        for rd, st in followed.values():
            job = answer.get(st["job_id"])
            if job is None or job.final:
                continue  # the end is settled by check()
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
            if any(st.get(k) != v for k, v in fields.items()):
                rd.update_status(**fields)
                changed.append(rd)
        return changed

    def _ask(self, ids: list[str]) -> dict[str, JobInfo]:
        answer = slurm_cli.jobs(ids)
        now = time.time()
        self._jobs.update(answer)
        self._asked.update(dict.fromkeys(ids, now))
        return answer

    # -- Executor protocol: per run, from its status.json --

    def alive(self, st: dict[str, Any]) -> bool:
        """False once Slurm reports a final state or has forgotten the job."""
        job_id = st.get("job_id")
        if not job_id:
            return False
        if time.time() - self._asked.get(job_id, 0.0) > FRESH_S:
            self._ask([job_id])
        job = self._jobs.get(job_id)
        return job is not None and not job.final

    def ended(self, rd: RunDir, st: dict[str, Any], handle: Any = None) -> bool:
        return not self.alive(st)

    def kill(self, st: dict[str, Any], grace_s: float = 0.0) -> None:
        """scancel: Slurm signals every task and kills what is left after its KillWait."""
        if st.get("job_id"):
            slurm_cli.cancel(st["job_id"])

    def resubmit(self, rd: RunDir, verdict: dict[str, Any]) -> None:
        """Slurm ended the job for the machine's sake (PREEMPTED, NODE_FAIL): the run goes on as its next attempt.

        Not ended, not a new attempt folder, not a new MLflow run: the run is queued
        without a job, so the supervisor's next pass submits it again (a new job id)
        into the same folder; its new attempt is told apart in the metrics.
        """
        st = {**rd.status(), "requeue_cause": verdict.get("reason")}
        rd.update_status(
            state="queued", job_id=None, slurm_state=verdict.get("slurm_state"), nodes=verdict.get("nodes"),
            resubmits=int(st.get("resubmits") or 0) + 1, requeue_waits=True, requeue_cause=st["requeue_cause"],
            reason=waiting_again(st, "submitted again"),
        )  # fmt: skip
        log.info("%s: %s; submitted again", rd.name, verdict.get("reason"))

    def reap(self, handle: Any) -> None:
        """Nothing to collect here: the job's processes are Slurm's."""

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
                fields["requeue"] = True  # submitted again (follow.RunFollower._check_job -> resubmit)
            return exit_info, fields
        return exit_info, (fields if fields["nodes"] else None)


def waiting_again(st: dict[str, Any], now: str) -> str:
    """The reason of a run back in the queue after it ran: the attempt that waits, why, and what Slurm says now."""
    cause = st.get("requeue_cause")
    return f"requeued, attempt {int(st.get('requeues') or 0) + 2}{f' (after {cause})' if cause else ''}: {now}"


def _read_exit(rd: RunDir) -> dict[str, Any]:
    try:
        return json.loads(Path(rd.exit_file).read_text())
    except (OSError, ValueError):
        return {}


def cancel_now(rd: RunDir) -> bool:
    """`dstui cancel` of a submitted run: scancel at once. True if the run had a job."""
    st = rd.status()
    if st.get("executor") != "slurm" or not has_job(st):
        return False
    try:
        slurm_cli.cancel(st["job_id"])
    except SlurmError as e:
        log.warning("%s: %s", rd.name, e)
    return True


def preflight(runs: list[RunSpec], opts: SlurmOptions, revisions: dict[str, dict]) -> None:
    """Everything Slurm would refuse, found before any folder exists or any job is submitted.

    Slurm installed, the partition known, and ``sbatch --test-only`` accepting
    a job script of every distinct shape (nodes, ranks, options) in the batch.
    """
    import tempfile

    from dstui.execute.slurm_script import sbatch_options

    why = slurm_cli.available()
    if why:
        raise SlurmError(why)
    if opts.partition:
        slurm_cli.check_partition(opts.partition)
    with tempfile.TemporaryDirectory(prefix="dstui-sbatch-") as tmp:
        seen: set[tuple[str, ...]] = set()
        for run in runs:
            rd = RunDir(Path(tmp) / run.name)
            shape = tuple(o for o in sbatch_options(run, rd, opts, cwd=tmp) if not o.startswith(("--job-name", "--output")))
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
