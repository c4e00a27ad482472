"""The Slurm executor against a real single-host cluster.

The cluster (slurmctld + slurmd + munged from Debian's packages, 2 CPUs) is
started once per session by :func:`cluster_fixtures.slurm_cluster_fixture`;
tests that need it skip, with the reason printed, when the packages are
missing. Most runs are the scriptable fake runner (cheap on 2 cores); one is
the real CPU smoke condition, compared step by step with the local executor.
Tables without a cluster: tests/unit/test_slurm_units.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from cluster_fixtures import SlurmCluster, slurm_cluster_fixture  # noqa: F401 - the `slurm_cluster` fixture
from helpers import SPECS, dstui, mlflow_client
from test_reliability import (
    finalized,
    history,
    jsonl_steps,
    only_batch,
    spec_file,
    supervisor_pid,
    wait_for,
)

from dstui.core.rundir import RunDir, list_batches
from dstui.execute.backends import for_status, slurm_cli
from dstui.execute.backends.slurm_cli import JobInfo
from dstui.execute.batch_lock import is_supervised

# one xdist worker runs the module in order: one Slurm cluster (a session fixture) for the module; a blocker job holds its node
pytestmark = pytest.mark.xdist_group("slurm")


def fake_spec(home: Path, name: str, conditions: list[dict], slurm: dict | None = None, **settings) -> Path:
    """A Slurm spec of fake-runner runs (one rank each)."""
    path = spec_file(home, name, conditions, gpus=1, **settings)
    data = yaml.safe_load(path.read_text())
    data.update(executor="slurm", slurm=slurm or {})
    path.write_text(yaml.safe_dump(data))
    return path


def test_slurm_not_installed_is_one_line(home: Path) -> None:
    spec = fake_spec(home, "nosl", [{"name": "a"}])
    bare = Path(sys.executable).parent  # python is there; Slurm's tools are not
    proc = dstui("run", str(spec), env={"PATH": str(bare)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "Slurm is not installed here" in proc.stderr
    assert not list_batches(home / "runs")


def blocker(cluster: SlurmCluster) -> str:
    """A plain job holding both CPUs of the node, so the next job waits."""
    out = subprocess.run(["sbatch", "--parsable", "-c", "2", "-J", "blocker", "-o", "/dev/null", "--wrap", "sleep 600"],
                         capture_output=True, text=True, check=True, env={**os.environ, **cluster.env})  # fmt: skip
    job = out.stdout.strip()
    wait_for(lambda: slurm_cli.jobs([job]).get(job, JobInfo(job, "?", "", "")).state == "RUNNING", 30, what="blocker running")
    return job


def processes_of(rd: RunDir) -> list[psutil.Process]:
    """Live processes whose command line names the run's folder (its ranks)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(str(rd.path) in a for a in p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.mark.e2e
def test_pending_reason_then_cancel_and_timeout(home: Path, slurm_cluster: SlurmCluster) -> None:
    """Behind a full node both runs wait with Slurm's reason; then one is cancelled, one times out."""
    slow = ["--steps", "1000", "--interval", "0.5"]
    spec = fake_spec(home, "waits", [{"name": "cancelme", "args": slow}, {"name": "overtime", "args": slow}], slurm={"time_limit": "1m"})
    hold = blocker(slurm_cluster)
    try:
        dstui("run", "--detach", str(spec), check=True)
        b = only_batch(home)
        wait_for(lambda: len(b.runs()) == 2 and all(rd.status().get("job_id") for rd in b.runs()), 60, what="both submitted")
        cancel_rd, over_rd = b.runs()
        # the first waits for the node; the second, behind it in the queue, for its turn
        wait_for(lambda: cancel_rd.status().get("reason") == "Slurm: PENDING (Resources)", 30, what="Slurm's pending reason")
        assert over_rd.status().get("reason") in ("Slurm: PENDING (Resources)", "Slurm: PENDING (Priority)")
        assert all(rd.state == "queued" and rd.status().get("job_id") for rd in b.runs())
        assert "Resources" in dstui("status", b.id, check=True).stdout
        client = mlflow_client()
        rid = wait_for(lambda: cancel_rd.status().get("mlflow_run_id"), 30, what="child run")
        wait_for(lambda: client.get_run(rid).data.tags.get("dstui.reason") == "Slurm: PENDING (Resources)", 30, what="reason in MLflow")
    finally:
        slurm_cli.cancel(hold)
    wait_for(lambda: (cancel_rd.status().get("steps_done") or 0) >= 2, 60, what="cancelme running")
    assert cancel_rd.status().get("nodes") == slurm_cluster.node
    assert processes_of(cancel_rd)
    dstui("cancel", f"{b.id}/{cancel_rd.name}", check=True)
    wait_for(lambda: cancel_rd.state == "killed", 60, what="cancelled run settled")
    st = cancel_rd.status()
    assert st["reason"] == "cancelled" and st["slurm_state"] == "CANCELLED"
    wait_for(lambda: not processes_of(cancel_rd), 20, what="the cancelled job's processes gone")
    # the other one runs into its 1-minute limit (Slurm checks limits every ~30 s)
    wait_for(lambda: over_rd.state == "failed", 150, every=1, what="time limit")
    st = over_rd.status()
    assert st["slurm_state"] == "TIMEOUT" and st["reason"] == "Slurm: TIMEOUT (time limit reached)"
    assert not processes_of(over_rd)
    wait_for(lambda: finalized(b), 60, what="batch finalized")
    tags = client.get_run(over_rd.status()["mlflow_run_id"]).data.tags
    assert tags["dstui.reason"] == "Slurm: TIMEOUT (time limit reached)" and tags["dstui.slurm_state"] == "TIMEOUT"


@pytest.mark.e2e
def test_supervisor_kill9_takeover_every_step_once_then_retry(home: Path, slurm_cluster: SlurmCluster) -> None:
    steps = 40
    # the first run holds before its last step until the takeover was seen: timed (10 s), it could
    # end during `dstui status` under load, and its job's wrapper then started a supervisor itself
    release = home / "release"
    args = ["--steps", str(steps), "--interval", "0.25", "--hold-after", str(steps - 1), "--hold-until", str(release)]
    spec = fake_spec(home, "sl-kill", [{"name": "first", "args": args}, {"name": "second", "args": args}], slurm={"max_jobs": 1}, steps=steps)
    client = mlflow_client()
    client.search_experiments()
    dstui("run", "--detach", str(spec), check=True)
    b = only_batch(home)
    first, second = wait_for(lambda: len(b.runs()) == 2 and b.runs(), what="run folders")
    wait_for(lambda: (first.status().get("steps_done") or 0) >= 5, 90, what="first run streaming")
    assert second.state == "queued" and not second.status().get("job_id")  # max_jobs: 1
    started_before = b.log_file.read_text().count("supervising batch")
    os.kill(supervisor_pid(b), signal.SIGKILL)
    wait_for(lambda: not is_supervised(b), what="lock released")
    st = first.status()  # unsupervised, the job goes on; the registered executor sees it from its status alone
    assert for_status(st).name == "slurm" and for_status(st).alive(st)
    out = dstui("status", check=True).stdout
    # taken over once: by `dstui status`, or already by the batch's standby, which starts a supervisor the
    # moment the lock is free (dstui/execute/injob/standby.py; here it often came first: 'took over' unsaid)
    wait_for(lambda: is_supervised(b), what="a supervisor again")
    log = b.log_file.read_text()
    assert log.count("supervising batch") == started_before + 1, log
    assert "took over" in out or "the batch has no supervisor; starting one" in log, (out, log)
    release.touch()
    wait_for(lambda: finalized(b), 180, what="batch finalized")
    for rd in (first, second):
        assert rd.state == "done", rd.status()
        hist = history(client, rd.status()["mlflow_run_id"])
        assert hist == jsonl_steps(rd)
        assert [s for s, _ in hist] == list(range(1, steps + 1))  # none lost, none twice
    assert first.status()["job_id"] != second.status()["job_id"]
    old_job = second.status()["job_id"]
    dstui("retry", f"{b.id}/{second.name}", "--force", check=True)
    wait_for(lambda: second.state == "done" and finalized(b), 120, what="retried run done")
    assert second.status()["job_id"] != old_job and second.status()["attempt"] == 2


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--partition", "nope"], "unknown Slurm partition 'nope'; partitions: debug, short"),
        (["--partition", "short", "--time-limit", "5m"], "sbatch: allocation failure: Requested time limit is invalid"),
    ],
)
def test_bad_slurm_input_is_one_line_and_submits_nothing(home: Path, slurm_cluster: SlurmCluster, flags: list[str], message: str) -> None:
    spec = fake_spec(home, "bad", [{"name": "a"}, {"name": "b"}])
    before = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True, check=True).stdout.split()
    proc = dstui("run", str(spec), *flags)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr, proc.stderr
    assert not list_batches(home / "runs")
    after = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True, check=True).stdout.split()
    assert after == before


def smoke_spec(home: Path, executor: str) -> Path:
    """The shipped smoke spec's ZeRO-1 condition, as it is, on ``executor``."""
    data = yaml.safe_load((SPECS / "smoke.yaml").read_text())
    data["name"] = f"smoke-{executor}"
    data["axes"] = {"zero_stage": [1]}
    data.pop("baseline")  # one condition ('base'): smoke's z0 is not among them
    data["executor"] = executor
    p = home / f"smoke-{executor}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.e2e
@pytest.mark.timeout(1800)  # may wait for the shared smoke batch, which another worker runs
def test_smoke_through_slurm_equals_local(home: Path, slurm_cluster: SlurmCluster, smoke_batch: dict) -> None:
    """The CPU smoke condition (2 gloo ranks) as a Slurm job: same losses as the local executor, step by step.

    The local side is z1 of the session's smoke batch (conftest's ``smoke_batch``, the local
    executor): the same spec and condition, so not launched a second time here.
    """
    histories = {}
    out = dstui("run", "--quiet", str(smoke_spec(home, "slurm")), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = "tags.`dstui.role` = 'run'"
    for executor, uri, experiment, which in (
        ("slurm", os.environ["MLFLOW_TRACKING_URI"], "smoke-slurm", runs),  # its one run
        ("local", smoke_batch["uri"], "smoke", runs + " and tags.`dstui.condition` = 'z1'"),
    ):
        client = mlflow_client(uri)
        exp = client.get_experiment_by_name(experiment)
        (child,) = client.search_runs([exp.experiment_id], which)
        assert child.info.status == "FINISHED"
        histories[executor] = history(client, child.info.run_id)
        if executor == "slurm":
            rd = RunDir(Path(child.data.tags["dstui.run_dir"].split("#")[0]))
            assert (rd.path / "job.sh").is_file() and rd.status()["slurm_state"] == "COMPLETED"
            assert child.data.tags["dstui.slurm_job"] == rd.status()["job_id"]
            assert "world_size" in child.data.params and child.data.params["world_size"] == "2"
    steps = yaml.safe_load((SPECS / "smoke.yaml").read_text())["settings"]["steps"]
    assert [s for s, _ in histories["slurm"]] == list(range(1, steps + 1))
    assert histories["slurm"] == histories["local"]
