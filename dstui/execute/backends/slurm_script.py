"""The Slurm job script of one run: sbatch options from the spec, ranks through srun.

A run becomes one job: ``nodes`` nodes with ``gpus`` tasks each (one task per
rank), started by ``srun`` inside the batch script. The script is written to
the run folder (``job.sh``) before it is submitted, so what ran can be read
and re-submitted by hand. Every value from the spec is shell-quoted; sbatch
option values must not hold a line break (it would end the ``#SBATCH`` line
and start a shell command).
"""

from __future__ import annotations

import shlex
import sys

from dstui.core import secrets
from dstui.core.credential_text import strip_credentials
from dstui.core.errors import SpecError
from dstui.core.rundir import RunDir
from dstui.execute import launch
from dstui.spec.experiment import RunSpec, SlurmOptions

SCRIPT_NAME = "job.sh"
NODE_SAMPLE_INTERVAL_S = 2.0  # as the supervisor samples a local run (Supervisor.system_interval_s)


def sbatch_options(run: RunSpec, rd: RunDir, opts: SlurmOptions, *, cwd: str) -> list[str]:
    """The ``#SBATCH`` options of a run's job, in the order they are written."""
    s = run.settings
    out = [
        f"--job-name=dstui-{rd.name}",
        f"--output={rd.log_file}",
        "--open-mode=append",
        f"--chdir={cwd}",
        f"--nodes={s.nodes}",
        f"--ntasks-per-node={s.gpus}",
        f"--cpus-per-task={opts.cpus_per_task}",
        # requeue > 0: Slurm may put the job back in the queue (scontrol requeue, a node failure, preemption
        # with PreemptMode=REQUEUE); it starts again in the same run folder and MLflow run (dstui.core.attempt_steps)
        "--requeue" if opts.requeue else "--no-requeue",
    ]
    if opts.gpus_per_node:
        out.append(f"--gpus-per-node={opts.gpus_per_node}")
    for flag, value in (("mem", opts.mem), ("time", opts.time_limit), ("partition", opts.partition), ("account", opts.account)):
        if value:
            out.append(f"--{flag}={value}")
    out += list(opts.extra_sbatch)
    for o in out:
        if "\n" in o or "\r" in o or not o.startswith("-"):
            raise SpecError(f"sbatch option {o!r} must be one '--name=value' without a line break", field="slurm")
    return out


def rank_argv(run: RunSpec, rd: RunDir, *, python: str, port: int) -> list[str]:
    """What each rank runs: a bundled runner directly (no deepspeed launcher: srun is the launcher)."""
    if run.settings.kind == "command":
        return launch.build_argv(run, rd, python=python, port=port)
    return [python, "-u", *launch.script_args(run, rd)]


def hidden_argv(run: RunSpec, argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv job.sh holds, and the values it leaves to sbatch's environment.

    job.sh lies in the run folder (an MLflow artifact): an element that would be
    shown masked (a secret flag's value, a token shape, a hidden env value)
    becomes ``{env:DSTUI_ARGV_<i>}``, which each rank resolves
    (dstui.execute.injob.slurm_rank) from the environment sbatch hands the job.
    """
    shown = launch.shown_command(run, argv)
    out: list[str] = []
    values: dict[str, str] = {}
    for i, (real, seen) in enumerate(zip(argv, shown, strict=True)):
        if real == seen:
            out.append(real)
        else:
            values[f"DSTUI_ARGV_{i}"] = real
            out.append(f"{{env:DSTUI_ARGV_{i}}}")
    return out, values


def attempt_line(run: RunSpec, rd: RunDir) -> str:
    """The job script's line that opens an attempt in the run's metrics source, before any rank starts.

    Every start of the job writes one (a requeued job starts again from the top of its
    script), so the supervisor knows where an attempt begins even if it never saw the job
    pending in between. A line the previous attempt's ranks left unfinished when they were
    killed is ended first, so it stays a bad line of its own instead of swallowing this one.
    """
    # the shell fills in the job id, Slurm's restart count, the node and the time
    rec = '{"type": "attempt", "job_id": "$SLURM_JOB_ID", "restarts": ${SLURM_RESTART_COUNT:-0}, "node": "$(hostname)", "time": $(date +%s)}'
    quoted = '"' + rec.replace('"', '\\"') + '"'
    if run.settings.metrics_format != "jsonl":  # seed format: the job's output is the metrics source
        return f"printf '%s\\n' {quoted}"
    m = shlex.quote(str(rd.metrics_file))
    return f'{{ if [ -s {m} ] && [ -n "$(tail -c 1 {m})" ]; then echo; fi; printf \'%s\\n\' {quoted}; }} >> {m}'


def job_script(
    run: RunSpec,
    rd: RunDir,
    opts: SlurmOptions,
    *,
    port: int,
    python: str | None = None,
    revision: dict | None = None,
    cwd: str | None = None,
    batch_id: str = "",
) -> str:
    """The whole job script. ``python`` runs the ranks (a revision's env); dstui's own runs the helpers."""
    python = python or sys.executable
    argv, _ = hidden_argv(run, rank_argv(run, rd, python=python, port=port))
    env = launch.build_env(run, rd, base={}, revision=revision)
    # hidden env values are not written into the run folder (it becomes an MLflow artifact):
    # they reach the job through sbatch's environment (--export=ALL, Slurm's default)
    hidden = secrets.hidden_names(run.settings.env, run.settings.env_visible)
    exports = [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())
               if k not in hidden and strip_credentials(v) == v]  # fmt: skip
    me = shlex.quote(sys.executable)
    lines = [
        "#!/bin/bash",
        f"# dstui: run {rd.name}{' of batch ' + batch_id if batch_id else ''}, key {run.key}. Written by dstui; submit with sbatch.",
        *(f"#SBATCH {o}" for o in sbatch_options(run, rd, opts, cwd=cwd or str(rd.path))),
        "",
        *exports,
        "# rendezvous: rank 0 lives on the job's first node",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export MASTER_ADDR MASTER_PORT={port}",
        'echo "dstui: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"',
        "# each start of the job (a requeue starts it again) opens an attempt in the metrics: no step is sent twice",
        attempt_line(run, rd),
        f'[ -z "$SLURM_RESTART_COUNT" ] || rm -f {shlex.quote(str(rd.exit_file))}  # the previous attempt\'s exit status',
        "# one system sampler per node (not per rank), beside the ranks: readings into the run folder's nodes/",
        f"srun --overlap --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=0 {me} -m dstui.execute.injob.node_sampler"
        f" {shlex.quote(str(rd.path))} --interval {NODE_SAMPLE_INTERVAL_S:g} >/dev/null 2>&1 &",
        "# dstui.execute.injob.wrap records the exit status in exit.json; srun starts one task per rank",
        f"exec {me} -m dstui.execute.injob.wrap {shlex.quote(str(rd.path))} -- \\",
        f"  srun --kill-on-bad-exit=1 --ntasks-per-node={run.settings.gpus} --cpus-per-task={opts.cpus_per_task} {me} -m dstui.execute.injob.slurm_rank -- \\",
        "  " + shlex.join(argv),
        "",
    ]
    return "\n".join(lines)
