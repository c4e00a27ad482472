"""The Slurm executor without a cluster: state mapping, time limits, rank variables, job scripts.

The same code against a real single-host cluster: tests/e2e/test_slurm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dstui.core.errors import SpecError
from dstui.core.rundir import RunDir
from dstui.execute.backends import slurm_cli
from dstui.execute.backends.slurm_cli import JobInfo
from dstui.execute.backends.slurm_script import job_script
from dstui.execute.injob.slurm_rank import rank_env
from dstui.spec.expand import expand
from dstui.spec.experiment import RunSpec, SlurmOptions
from dstui.spec.loading import parse_spec
from dstui.spec.settings import Settings


@pytest.mark.parametrize(
    ("state", "reason", "dstui_state", "shown"),
    [
        ("PENDING", "Resources", "queued", "Slurm: PENDING (Resources)"),
        ("PENDING", "None", "queued", "Slurm: PENDING"),
        ("RUNNING", "None", "running", "Slurm: RUNNING"),
        ("COMPLETING", "None", "running", "Slurm: COMPLETING"),
        ("COMPLETED", "None", "done", "Slurm: COMPLETED"),
        ("FAILED", "NonZeroExitCode", "failed", "Slurm: FAILED"),
        ("CANCELLED", "None", "killed", "Slurm: CANCELLED (scancel outside dstui, or by an admin)"),
        ("TIMEOUT", "TimeLimit", "failed", "Slurm: TIMEOUT (time limit reached)"),
        ("OUT_OF_MEMORY", "OutOfMemory", "failed", "Slurm: OUT_OF_MEMORY (over the job's memory)"),
        ("NODE_FAIL", "NodeDown", "failed", "Slurm: NODE_FAIL (a node of the job failed)"),
        ("PREEMPTED", "None", "failed", "Slurm: PREEMPTED"),
    ],
)
def test_state_mapping(state: str, reason: str, dstui_state: str, shown: str) -> None:
    job = JobInfo("7", state, reason, "")
    assert job.dstui_state == dstui_state
    assert job.describe() == shown
    assert job.final == (dstui_state in ("done", "failed", "killed"))
    assert (state in slurm_cli.REQUEUE_ON) == (state in ("PREEMPTED", "NODE_FAIL"))


@pytest.mark.parametrize(
    ("given", "slurm"),
    [("30m", "00:30:00"), ("2h", "02:00:00"), ("90", "01:30:00"), ("45s", "00:01:00"), ("1-12:00:00", "1-12:00:00"), ("10:00", "00:10:00")],
)
def test_time_limit_normalised(given: str, slurm: str) -> None:
    assert SlurmOptions(time_limit=given).time_limit == slurm


@pytest.mark.parametrize("bad", ["soon", "0", "1:xx", "-5m"])
def test_time_limit_refused(bad: str) -> None:
    with pytest.raises(SpecError, match="time_limit"):
        parse_spec({"name": "x", "executor": "slurm", "slurm": {"time_limit": bad}})


def test_rank_env_from_slurm_task_variables() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_NODEID": "1"}
    assert rank_env(env) == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_SIZE": "4", "CROSS_RANK": "1", "CROSS_SIZE": "2"}


def test_two_node_job_script(tmp_path: Path) -> None:
    spec = parse_spec({"name": "big", "executor": "slurm", "settings": {"nodes": 2, "gpus": 4}})
    run = RunSpec(experiment="big", condition="base", settings=Settings.model_validate(spec.settings))
    opts = SlurmOptions(partition="gpu", account="team", time_limit="2h", gpus_per_node=4, cpus_per_task=8, mem="200G",
                        extra_sbatch=["--qos=high", "--exclusive"])  # fmt: skip
    rd = RunDir(tmp_path / "base-r0")
    text = job_script(run, rd, opts, port=29611, python="/envs/ds/bin/python")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --mem=200G", "#SBATCH --time=02:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=team",
                 "#SBATCH --qos=high", "#SBATCH --exclusive", f"#SBATCH --output={rd.log_file}", "export MASTER_ADDR MASTER_PORT=29611"):  # fmt: skip
        assert line in text.splitlines(), line
    assert "srun --kill-on-bad-exit=1 --ntasks-per-node=4 --cpus-per-task=8" in text
    assert "/envs/ds/bin/python -u " in text and "deepspeed.launcher" not in text  # srun is the launcher
    # one system sampler per node, beside the ranks, started before them
    (sampler,) = [ln for ln in text.splitlines() if "dstui.execute.injob.node_sampler" in ln]
    assert sampler.startswith("srun --overlap --ntasks-per-node=1 ") and sampler.endswith("&")
    assert text.index("node_sampler") < text.index("dstui.execute.injob.slurm_rank")


def test_over_memory_is_read_from_slurmstepd_lines() -> None:
    from dstui.execute.backends.slurm_cli import killed_over_memory

    log = "step 3 loss 1.2\nslurmstepd-node1: error: Exceeded job memory limit\nsrun: error: node1: task 0: Killed\n"
    assert killed_over_memory(log)
    assert not killed_over_memory("my program printed: Exceeded job memory limit\n")  # not slurmstepd's line
    assert not killed_over_memory("slurmstepd-node1: error: *** JOB 4 ON node1 CANCELLED ***\n")


def test_job_script_keeps_secrets_out_and_refuses_line_breaks(tmp_path: Path) -> None:
    s = Settings(env={"HF_TOKEN": "hunter2", "NCCL_DEBUG": "INFO"})
    run = RunSpec(experiment="x", condition="c", settings=s)
    text = job_script(run, RunDir(tmp_path / "c-r0"), SlurmOptions(), port=1234)
    assert "hunter2" not in text and "export NCCL_DEBUG=INFO" in text
    with pytest.raises(SpecError, match="line break"):
        job_script(run, RunDir(tmp_path / "c-r0"), SlurmOptions(partition="a\nrm -rf /"), port=1234)


def test_multi_node_needs_a_hostfile_only_locally() -> None:
    assert expand(parse_spec({"name": "x", "executor": "slurm", "settings": {"nodes": 2}}))[0].settings.nodes == 2
    with pytest.raises(SpecError, match="hostfile"):
        expand(parse_spec({"name": "x", "settings": {"nodes": 2}}))
