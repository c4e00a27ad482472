"""Multi-node runs through Slurm on a real two-node cluster on this machine.

The cluster (:class:`cluster_fixtures.NamespaceCluster`) is slurmctld plus two
slurmds, ``node1`` and ``node2``, each in its own network namespace with its own
hostname and address; ranks of a 2-node job run in different network stacks and
reach each other over the addresses Slurm gives them (gloo on CPU). One cluster
serves the module (a module fixture; the xdist group keeps the module on one
worker). Tests skip, saying why, when not root or Slurm is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from cluster_fixtures import NamespaceCluster, netns_cluster_fixture, netns_cluster_missing, skip_if  # noqa: F401
from helpers import SPECS, dstui, mlflow_client
from test_reliability import history

from dstui.core.rundir import RunDir, list_batches

pytestmark = pytest.mark.xdist_group("slurm-nodes")


def test_namespace_cluster_runs_on_two_hosts_and_leaves_nothing() -> None:
    """Its own cluster: a 2-node srun sees two hostnames and two addresses; stop() leaves no daemon, namespace or link."""
    skip_if("multi-node slurm", netns_cluster_missing())
    cluster = NamespaceCluster(Path(tempfile.mkdtemp(prefix="dstui-nodes-")))
    try:
        cluster.start()
        out = subprocess.run(
            ["srun", "-N2", "--ntasks-per-node=1", "sh", "-c", 'echo "$(hostname) $(hostname -I)"'],
            capture_output=True, text=True, timeout=60, env={**os.environ, **cluster.env}, check=True,
        )  # fmt: skip
        seen = dict(line.split() for line in out.stdout.splitlines())
        assert seen == cluster.addrs  # {'node1': '10.x.y.2', 'node2': '10.x.y.3'}: two network stacks
        assert cluster.leftovers() != []  # the check sees a running cluster
    finally:
        cluster.stop()
    assert cluster.leftovers() == []


def nodes_spec(home: Path, name: str, base: str, conditions: list[dict], **settings) -> Path:
    """A shipped spec on the namespace cluster, few steps, with ``conditions`` instead of its axes."""
    data = yaml.safe_load((SPECS / base).read_text())
    data["name"] = name
    data.pop("axes", None)
    data.pop("baseline", None)
    data["settings"].update(settings)
    data["conditions"] = conditions
    data["executor"] = "slurm"
    p = home / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def placements(rd: RunDir) -> dict[int, dict]:
    """rank -> where it ran, as each rank recorded it (dstui.execute.injob.slurm_rank)."""
    return {int(p.stem): json.loads(p.read_text()) for p in (rd.path / "ranks").glob("*.json")}


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_two_nodes_four_ranks_equal_one_node(home: Path, netns_cluster: NamespaceCluster) -> None:
    """nodes: 2, gpus: 2 (4 gloo ranks over two hosts) gives the losses of nodes: 1, gpus: 4, step by step."""
    steps = 3
    spec = nodes_spec(home, "two-nodes", "smoke.yaml", [
        {"name": "n1", "nodes": 1, "gpus": 4, "zero_stage": 1},
        {"name": "n2", "nodes": 2, "gpus": 2, "zero_stage": 1},
    ], steps=steps, warmup_steps=1)  # fmt: skip
    out = dstui("run", "--quiet", str(spec), timeout=800)
    assert out.returncode == 0, out.stdout + out.stderr
    (b,) = list_batches(home / "runs")
    runs = {rd.name.split("-")[0]: rd for rd in b.runs()}
    client = mlflow_client()
    hist = {}
    for name, rd in runs.items():
        st = rd.status()
        assert st["state"] == "done" and st["slurm_state"] == "COMPLETED", st
        hist[name] = history(client, st["mlflow_run_id"])
        assert [s for s, _ in hist[name]] == list(range(1, steps + 1))
        assert client.get_run(st["mlflow_run_id"]).data.params["world_size"] == "4"
    two = placements(runs["n2"])
    assert sorted(two) == [0, 1, 2, 3]
    assert {r["hostname"] for r in two.values()} == {"node1", "node2"}
    assert {r["hostname"] for r in placements(runs["n1"]).values()} in ({"node1"}, {"node2"})
    assert runs["n2"].status()["nodes"] == "node[1-2]"
    # rendezvous from Slurm's node list: rank 0 on the job's first node, MASTER_ADDR is its name
    assert two[0]["hostname"] == "node1"
    assert "master node1:" in runs["n2"].log_file.read_text()
    assert hist["n2"] == hist["n1"]
    # system readings of every node of the job: one sampler per node, merged into system.jsonl, in MLflow by node
    assert sorted(p.name for p in (runs["n2"].path / "nodes").glob("*.jsonl")) == ["node1.jsonl", "node2.jsonl"]
    assert len(list((runs["n1"].path / "nodes").glob("*.jsonl"))) == 1
    system = [json.loads(line) for line in runs["n2"].system_file.read_text().splitlines()]
    assert {r["node"] for r in system} == {"node1", "node2"}
    for node in ("node1", "node2"):  # each sampler sees its own node's 2 ranks
        assert any(r.get("job_processes", 0) >= 2 for r in system if r["node"] == node)
    keys = client.get_run(runs["n2"].status()["mlflow_run_id"]).data.metrics
    for node in ("node1", "node2"):
        assert [k for k in keys if k.startswith(f"system/{node}/") and "cpu" in k], sorted(keys)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_verify_batch_on_two_nodes_passes(home: Path, netns_cluster: NamespaceCluster) -> None:
    """A `kind: verify` run (ZeRO-1 against plain PyTorch, exact parity) as 4 ranks over two hosts: PASS."""
    spec = nodes_spec(home, "verify-nodes", "verify_zero.yaml", [{"name": "z1", "zero_stage": 1, "nodes": 2, "gpus": 2}], steps=2)
    out = dstui("run", "--quiet", str(spec), timeout=800)
    assert out.returncode == 0, out.stdout + out.stderr
    (b,) = list_batches(home / "runs")
    (rd,) = b.runs()
    st = rd.status()
    assert st["state"] == "done" and st["slurm_state"] == "COMPLETED", st
    records = [json.loads(line) for line in rd.metrics_file.read_text().splitlines()]
    (summary,) = [r for r in records if r.get("type") == "summary" and "verdict" in r]
    (header,) = [r for r in records if r.get("type") == "header"]
    assert summary["verdict"] == "PASS" and header["world_size"] == 4
    assert {r["hostname"] for r in placements(rd).values()} == {"node1", "node2"}
    assert "PASS" in rd.log_file.read_text()


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_preempted_run_says_so(home: Path, netns_cluster: NamespaceCluster) -> None:
    """A job of the 'urgent' partition (higher PriorityTier) takes the run's node: the run ends `Slurm: PREEMPTED`."""
    from test_reliability import spec_file, wait_for

    spec = spec_file(home, "preempt", [{"name": "low", "args": ["--steps", "1000", "--interval", "0.5"]}], gpus=1)
    data = yaml.safe_load(spec.read_text())
    data.update(executor="slurm", slurm={"requeue": 0, "extra_sbatch": ["--exclusive"]})
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True)
    b = wait_for(lambda: (list_batches(home / "runs") or [None])[0], what="a batch")
    rd = wait_for(lambda: (b.runs() or [None])[0], 60, what="run folder")
    wait_for(lambda: (rd.status().get("steps_done") or 0) >= 2, 120, what="running")
    env = {**os.environ, **netns_cluster.env}
    urgent = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-w", rd.status()["nodes"], "-o", "/dev/null",
                             "--wrap", "sleep 5"], capture_output=True, text=True, check=True, env=env).stdout.strip()  # fmt: skip
    try:
        wait_for(lambda: rd.state == "failed", 90, every=1, what="preempted")
    finally:
        subprocess.run(["scancel", urgent], env=env, check=False)
    st = rd.status()
    assert (st["slurm_state"], st["reason"]) == ("PREEMPTED", "Slurm: PREEMPTED")
    wait_for(lambda: b.info().get("finalized"), 60, what="batch finalized")
    assert mlflow_client().get_run(st["mlflow_run_id"]).data.tags["dstui.reason"] == "Slurm: PREEMPTED"


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_scheduler_outcomes_are_their_own_reasons(home: Path, netns_cluster: NamespaceCluster) -> None:
    """One batch (1-minute limit, 300 MiB), four fates caused on the cluster: scancel from outside dstui, the
    node's slurmd killed (NODE_FAIL), the time limit (TIMEOUT), a step over the job's memory (killed by Slurm's
    OverMemoryKill; the job ends FAILED); each run's reason says which."""
    from test_reliability import spec_file, wait_for

    slow = ["--steps", "1000", "--interval", "0.5"]
    spec = spec_file(home, "fates", [{"name": f, "args": slow} for f in ("outside", "nodefail", "overtime")], gpus=1)
    data = yaml.safe_load(spec.read_text())
    hog = "a = bytearray(600 << 20); a[::4096] = b'x' * len(a[::4096]); import time; time.sleep(60)"
    data["conditions"].append({"name": "oom", "command": [sys.executable, "-c", hog]})  # 600 MiB in a 300 MiB job
    # --exclusive: a node per job, so the node killed below holds only 'nodefail'; 'overtime' and 'oom' wait for nodes
    data.update(executor="slurm", slurm={"time_limit": "1m", "requeue": 0, "mem": "300M", "extra_sbatch": ["--exclusive"]})
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True)
    b = wait_for(lambda: (list_batches(home / "runs") or [None])[0], what="a batch")
    runs = wait_for(lambda: len(b.runs()) == 4 and {rd.name.split("-")[0]: rd for rd in b.runs()}, 60, what="run folders")
    first = (runs["outside"], runs["nodefail"])
    wait_for(lambda: all((rd.status().get("steps_done") or 0) >= 2 for rd in first), 120, what="two running")
    assert runs["overtime"].status().get("reason", "").startswith("Slurm: PENDING")
    subprocess.run(["scancel", runs["outside"].status()["job_id"]], check=True, env={**os.environ, **netns_cluster.env})
    node = runs["nodefail"].status()["nodes"]
    assert node in netns_cluster.node_names
    netns_cluster.kill_node(node)  # slurmd and the job's processes on it: the node is gone
    try:
        wait_for(lambda: runs["nodefail"].state == "failed", 120, every=1, what="NODE_FAIL")
    finally:
        netns_cluster.start_node(node)  # back for the next tests (ReturnToService=2)
    wait_for(lambda: all(rd.state in ("failed", "killed") for rd in runs.values()), 150, every=1, what="all ended")
    got = {n: (rd.status()["slurm_state"], rd.status()["reason"]) for n, rd in runs.items()}
    assert got == {
        "outside": ("CANCELLED", "Slurm: CANCELLED (scancel outside dstui, or by an admin)"),
        "nodefail": ("NODE_FAIL", "Slurm: NODE_FAIL (a node of the job failed)"),
        "overtime": ("TIMEOUT", "Slurm: TIMEOUT (time limit reached)"),
        "oom": ("FAILED", "Slurm: OUT_OF_MEMORY (over the job's memory)"),
    }
    assert runs["outside"].state == "killed"
    wait_for(lambda: b.info().get("finalized"), 60, what="batch finalized")
    client = mlflow_client()
    for name, rd in runs.items():
        assert client.get_run(rd.status()["mlflow_run_id"]).data.tags["dstui.reason"] == got[name][1]
    wait_for(lambda: netns_cluster._node_idle(), 60, what="the killed node back")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_requeued_run_goes_on_in_its_folder_and_mlflow_run_each_step_once(home: Path, netns_cluster: NamespaceCluster) -> None:
    """`scontrol requeue` of a running job of the bundled runner: Slurm kills it and queues it again under the
    same job id; it trains again from step 1 in the same run folder. One MLflow run holds every step once (the
    first attempt's steps, then the second's beyond them), the metrics file keeps both attempts, the run is done."""
    from test_reliability import wait_for

    from dstui.core.record_file import read_records

    steps = 1000  # ~10 ms a step here: seconds of training to catch it in
    spec = nodes_spec(home, "requeue", "smoke.yaml", [{"name": "rq", "zero_stage": 1, "gpus": 1}], steps=steps, warmup_steps=1)
    data = yaml.safe_load(spec.read_text())
    data["slurm"] = {"mem": "6000M"}  # one rank, one CPU: more than DefMemPerCPU, for a first build of DeepSpeed's CPU comm op
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True)
    b = wait_for(lambda: (list_batches(home / "runs") or [None])[0], what="a batch")
    rd = wait_for(lambda: (b.runs() or [None])[0], 60, what="run folder")
    wait_for(lambda: (rd.status().get("steps_done") or 0) >= 3, 300, every=0.1, what="steps logged")
    job, rid = rd.status()["job_id"], rd.status()["mlflow_run_id"]
    env = {**os.environ, **netns_cluster.env}
    subprocess.run(["scontrol", "suspend", job], check=True, env=env)  # held mid-training (fails if it ended)
    first_steps = wait_for(lambda: rd.status().get("steps_done"), 30, what="steps read")
    assert 3 <= first_steps < steps
    subprocess.run(["scontrol", "requeue", job], check=True, env=env)
    # back in the queue: the same run, its next attempt waiting (Slurm holds a requeued job ~2 minutes)
    wait_for(lambda: (rd.status().get("reason") or "").startswith("requeued, attempt 2: Slurm: PENDING"), 60, what="requeued")
    assert rd.state == "queued" and rd.status()["job_id"] == job
    assert "requeued, attempt 2" in dstui("status", b.id, "-v", check=True).stdout
    # Slurm holds a job requeued while suspended, and lets a requeued job start only ~2 minutes later
    subprocess.run(["scontrol", "release", job], check=True, env=env)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, env=env)
    wait_for(lambda: b.info().get("finalized"), 400, every=0.5, what="batch finalized")
    st = rd.status()
    assert (st["state"], st["slurm_state"], st["job_id"], st["mlflow_run_id"]) == ("done", "COMPLETED", job, rid), st
    assert st["requeues"] == 1 and st["repeated_steps"] >= first_steps
    assert b.runs() == [rd] and not (rd.path / "attempts").exists()  # the same folder, no new attempt folder
    client = mlflow_client()
    hist = history(client, rid)
    assert [s for s, _ in hist] == list(range(1, steps + 1))  # each step exactly once, none lost
    assert hist == sorted((r["step"], r["loss"]) for r in read_records(rd.metrics_file) if r["type"] == "step")
    records = [json.loads(line) for line in rd.metrics_file.read_text().splitlines()]
    assert [r["restarts"] for r in records if r["type"] == "attempt"] == [0, 1]  # both attempts kept in the file
    assert sum(r["type"] == "step" for r in records) == steps + st["repeated_steps"]
    run = client.get_run(rid)
    assert run.info.status == "FINISHED"
    assert (run.data.tags["dstui.requeues"], run.data.tags["dstui.status"]) == ("1", "done")
    (only,) = client.search_runs([run.info.experiment_id], "tags.`dstui.role` = 'run'")
    assert only.info.run_id == rid  # no second MLflow run for the second attempt
    assert "attempt 2 (1x requeued, same MLflow run)" in dstui("status", b.id, check=True).stdout


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_preempted_run_is_submitted_again_in_place(home: Path, netns_cluster: NamespaceCluster) -> None:
    """With `requeue: 1` (the default) a PREEMPTED job (PreemptMode=CANCEL: Slurm ends it) is submitted again
    by dstui: a new job, the same folder and MLflow run, each step once, the run done on its second attempt."""
    from test_reliability import jsonl_steps, spec_file, wait_for

    steps = 25
    spec = spec_file(home, "preempt-again", [{"name": "low", "args": ["--steps", str(steps), "--interval", "0.3"]}], gpus=1, steps=steps)
    data = yaml.safe_load(spec.read_text())
    data.update(executor="slurm", slurm={"extra_sbatch": ["--exclusive"]})
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True)
    b = wait_for(lambda: (list_batches(home / "runs") or [None])[0], what="a batch")
    rd = wait_for(lambda: (b.runs() or [None])[0], 60, what="run folder")
    wait_for(lambda: (rd.status().get("steps_done") or 0) >= 3, 120, what="running")
    first_job, rid = rd.status()["job_id"], rd.status()["mlflow_run_id"]
    env = {**os.environ, **netns_cluster.env}
    subprocess.run(["sbatch", "-p", "urgent", "--exclusive", "-w", rd.status()["nodes"], "-o", "/dev/null", "--wrap", "sleep 3"],
                   capture_output=True, text=True, check=True, env=env)  # fmt: skip
    wait_for(lambda: rd.status().get("resubmits") == 1, 90, every=0.5, what="submitted again")
    assert rd.status()["reason"].startswith("requeued, attempt 2 (after Slurm: PREEMPTED): ")
    wait_for(lambda: b.info().get("finalized"), 180, every=0.5, what="batch finalized")
    st = rd.status()
    assert (st["state"], st["mlflow_run_id"], st["requeues"]) == ("done", rid, 1), st
    assert st["job_id"] != first_job and b.runs() == [rd]
    hist = history(mlflow_client(), rid)
    assert [s for s, _ in hist] == list(range(1, steps + 1))  # each step once
    assert len(jsonl_steps(rd)) == steps + st["repeated_steps"]  # both attempts in the file
