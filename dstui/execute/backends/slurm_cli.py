"""Slurm's command-line tools, wrapped: sbatch, squeue, scontrol, scancel.

dstui talks to Slurm only through the commands every user has (no REST API,
no accounting database: ``sacct`` needs slurmdbd, which many small clusters
and this test setup lack). Every failure becomes a :class:`SlurmError` whose
message is Slurm's own error line, so the user sees one clear line.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dstui.core.errors import DstuiError

TIMEOUT_S = 60.0

# Slurm job state -> dstui run state. Final Slurm states that are not a clean exit
# carry Slurm's state as the reason (TIMEOUT, OUT_OF_MEMORY, ...).
STATE_MAP = {
    "PENDING": "queued",
    "REQUEUED": "queued",
    "REQUEUE_HOLD": "queued",
    "REQUEUE_FED": "queued",
    "RESV_DEL_HOLD": "queued",
    "CONFIGURING": "starting",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "RESIZING": "running",
    "COMPLETED": "done",
    "FAILED": "failed",
    "CANCELLED": "killed",
    "TIMEOUT": "failed",
    "OUT_OF_MEMORY": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "PREEMPTED": "failed",
    "SPECIAL_EXIT": "failed",
    "REVOKED": "killed",
}
FINAL = frozenset(s for s, d in STATE_MAP.items() if d in ("done", "failed", "killed"))
# the job died of the machine, not of the run: worth submitting again (issue 13: once by default)
REQUEUE_ON = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
REASONS = {
    "TIMEOUT": "Slurm: TIMEOUT (time limit reached)",
    "OUT_OF_MEMORY": "Slurm: OUT_OF_MEMORY (over the job's memory)",
    "NODE_FAIL": "Slurm: NODE_FAIL (a node of the job failed)",
    "BOOT_FAIL": "Slurm: BOOT_FAIL (a node did not boot)",
    "PREEMPTED": "Slurm: PREEMPTED",
    "DEADLINE": "Slurm: DEADLINE (could not finish before its deadline)",
    "CANCELLED": "Slurm: CANCELLED (scancel outside dstui, or by an admin)",
}


# what slurmstepd writes into the job's output when it kills a step over the job's memory
# (JobAcctGatherParams=OverMemoryKill, clusters without cgroup memory limits; the job ends FAILED)
OVER_MEMORY_LINES = ("Exceeded job memory limit", "Exceeded step memory limit")


def killed_over_memory(log_tail: str) -> bool:
    """Whether slurmstepd killed a step of this job for its memory (read from the job's output)."""
    return any("slurmstepd" in line and any(m in line for m in OVER_MEMORY_LINES) for line in log_tail.splitlines())


class SlurmError(DstuiError):
    """Slurm refused or could not be reached; the message is one line."""


@dataclass(frozen=True)
class JobInfo:
    """Slurm's view of one job."""

    job_id: str
    state: str  # Slurm's state name, e.g. PENDING, RUNNING, TIMEOUT
    reason: str  # Slurm's reason, e.g. Resources, Priority, None
    nodes: str  # node list, compressed (node[01-04]); empty while pending

    @property
    def final(self) -> bool:
        return self.state in FINAL

    @property
    def dstui_state(self) -> str:
        return STATE_MAP.get(self.state, "running")

    def describe(self) -> str:
        """The line shown as the run's reason while it waits or after Slurm ended it."""
        if self.state == "PENDING":
            return f"Slurm: PENDING ({self.reason})" if self.reason and self.reason != "None" else "Slurm: PENDING"
        return REASONS.get(self.state, f"Slurm: {self.state}")


def _run(argv: list[str], *, env: Mapping[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=dict(env) if env is not None else None
        )
    except FileNotFoundError:
        raise SlurmError(
            f"Slurm is not installed here: no '{argv[0]}' on PATH (install Slurm's client tools, or use --executor local)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"'{argv[0]}' did not answer within {TIMEOUT_S:.0f} s (is slurmctld up?)") from None
    if check and proc.returncode != 0:
        raise SlurmError(f"{argv[0]}: {error_line(proc.stderr or proc.stdout)}")
    return proc


def error_line(text: str) -> str:
    """Slurm's most telling error line: the last 'error:' line, without the tool's prefix."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    line = (errors or lines or ["failed without a message"])[-1]
    return re.sub(r"^\w+: error: ", "", line)


def submit(script: Path, *, env: Mapping[str, str] | None = None, test_only: bool = False) -> str:
    """sbatch a job script; returns the job id (with ``test_only``: checks, submits nothing)."""
    argv = ["sbatch", "--parsable", str(script)]
    if test_only:
        argv.insert(1, "--test-only")
    proc = _run(argv, env=env)
    if test_only:
        return ""
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch: unexpected answer {proc.stdout.strip()!r}")
    return job_id


def jobs(job_ids: Iterable[str]) -> dict[str, JobInfo]:
    """Slurm's view of these jobs; a job Slurm no longer knows is missing from the answer.

    ``squeue -t all`` lists finished jobs too, for ``MinJobAge`` seconds after they end.
    """
    ids = sorted({j for j in job_ids if j}, key=int)
    if not ids:
        return {}
    proc = _run(["squeue", "--noheader", "--states=all", "--jobs=" + ",".join(ids), "--format=%i|%T|%r|%N"], check=False)
    if proc.returncode != 0:
        if "invalid job id" not in proc.stderr.lower():
            raise SlurmError(f"squeue: {error_line(proc.stderr)}")
        if len(ids) == 1:
            return {}
        # some job is already forgotten: squeue rejects the whole list, so ask one by one
        out: dict[str, JobInfo] = {}
        for j in ids:
            out.update(jobs([j]))
        return out
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] in ids:
            out[parts[0]] = JobInfo(parts[0], parts[1].split()[0], parts[2], parts[3])
    return out


def show_job(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (empty when Slurm forgot the job)."""
    proc = _run(["scontrol", "--oneliner", "show", "job", job_id], check=False)
    if proc.returncode != 0:
        return {}
    fields: dict[str, str] = {}
    for token in proc.stdout.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def cancel(job_id: str) -> None:
    """scancel; a job that already ended is not an error."""
    proc = _run(["scancel", job_id], check=False)
    if proc.returncode != 0 and "already completing or completed" not in proc.stderr and "Invalid job id" not in proc.stderr:
        raise SlurmError(f"scancel: {error_line(proc.stderr)}")


def check_partition(name: str) -> None:
    """A clear error for a partition Slurm does not have (before anything is submitted)."""
    proc = _run(["scontrol", "--oneliner", "show", "partition", name], check=False)
    if proc.returncode != 0 or f"PartitionName={name}" not in proc.stdout:
        known = _run(["sinfo", "--noheader", "--format=%R"], check=False).stdout.split()
        hint = f"; partitions: {', '.join(sorted(set(known)))}" if known else ""
        raise SlurmError(f"unknown Slurm partition '{name}'{hint}")


def available() -> str | None:
    """None when sbatch can be found, else the one-line reason."""
    from shutil import which

    missing = [t for t in ("sbatch", "squeue", "scontrol", "scancel", "srun") if which(t, path=os.environ.get("PATH")) is None]
    if missing:
        return f"Slurm is not installed here: no {', '.join(missing)} on PATH (install Slurm's client tools, or use --executor local)"
    return None
