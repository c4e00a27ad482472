"""Fault injection with real processes: runs outlive the terminal, failures are explained.

The supervisor is what is under test here, so most runs are a small scriptable
program (tests/programs/fake_runner.py) that writes real metrics records and
misbehaves on demand; the rank-kill test uses the real DeepSpeed runner.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import REPO, SPECS, dstui, mlflow_client

from dstui.core.rundir import BatchDir, RunDir, list_batches
from dstui.execute.supervisor import is_supervised

FAKE = str(REPO / "tests" / "programs" / "fake_runner.py")


def spec_file(home: Path, name: str, conditions: list[dict], **settings) -> Path:
    data = {
        "name": name,
        "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 10, "warmup_steps": 1, **settings},
        "conditions": [
            {"name": c.pop("name"), "command": [sys.executable, FAKE, "--metrics-file", "{metrics_file}", *c.pop("args", [])], **c}
            for c in conditions
        ],
    }
    p = home / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def wait_for(pred, timeout: float = 120, every: float = 0.2, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def only_batch(home: Path) -> BatchDir:
    return wait_for(lambda: (list_batches(home / "runs") or [None])[0], what="a batch")


def finalized(b: BatchDir) -> bool:
    return bool(b.info().get("finalized"))


def supervisor_pid(b: BatchDir) -> int:
    text = b.lock_file.read_text()
    return int(text.split()[1])


def history(client, run_id: str, key: str = "loss") -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def jsonl_steps(rd: RunDir) -> list[tuple[int, float]]:
    out = []
    for line in rd.metrics_file.read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "step":
            out.append((rec["step"], rec["loss"]))
    return out


def test_supervisor_kill9_and_takeover_is_exactly_once(home: Path) -> None:
    steps = 60
    spec = spec_file(home, "kill-sup", [{"name": "long", "args": ["--steps", str(steps), "--interval", "0.15"]}], steps=steps)
    client = mlflow_client()
    client.search_experiments()
    dstui("run", "--detach", str(spec), check=True)
    b = only_batch(home)
    rd = wait_for(lambda: b.runs() and b.runs()[0], what="run folder")
    kills = 0
    for _ in range(3):  # kill it three times at different points of the run
        run_id = wait_for(lambda: rd.status().get("mlflow_run_id"), what="child run")
        before = len(history(client, run_id))
        wait_for(lambda b4=before, rid=run_id: len(history(client, rid)) > b4, what="new points in MLflow")
        if rd.state != "running":
            break
        os.kill(supervisor_pid(b), signal.SIGKILL)
        kills += 1
        wait_for(lambda: not is_supervised(b), what="lock released")
        time.sleep(0.5)  # the run goes on unsupervised for a while
        assert rd.state == "running"
        out = dstui("status", check=True).stdout
        assert "took over" in out
    assert kills >= 2
    wait_for(lambda: finalized(b), timeout=180, what="batch finalized")
    assert rd.state == "done"
    mlflow_hist = history(client, rd.status()["mlflow_run_id"])
    assert mlflow_hist == jsonl_steps(rd)
    assert [s for s, _ in mlflow_hist] == list(range(1, steps + 1))  # none lost, none twice
    (child,) = client.search_runs([client.get_experiment_by_name("kill-sup").experiment_id], "tags.`dstui.role` = 'run'")
    assert child.info.status == "FINISHED"


def test_hung_run_is_marked_and_its_group_killed(home: Path) -> None:
    spec = spec_file(home, "hang", [{"name": "stuck", "args": ["--hang-after", "2"]}], hung_after_s=3)
    proc = dstui("run", str(spec), timeout=120)
    assert proc.returncode == 1
    (rd,) = only_batch(home).runs()
    st = rd.status()
    assert st["state"] == "failed" and st["reason"].startswith("hung (no output for 3 s)")
    with pytest.raises(ProcessLookupError):
        os.killpg(st["pgid"], 0)
    client = mlflow_client()
    run = client.get_run(st["mlflow_run_id"])
    assert run.info.status == "FAILED" and run.data.tags["dstui.reason"].startswith("hung")
    assert history(client, run.info.run_id) == [(1, 10.0), (2, 5.0)]  # partial metrics stay


def test_garbled_lines_are_counted_not_fatal(home: Path) -> None:
    spec = spec_file(home, "garble", [{"name": "noisy", "args": ["--garble", "--steps", "5"]}], steps=5)
    proc = dstui("run", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rd,) = only_batch(home).runs()
    client = mlflow_client()
    run = client.get_run(rd.status()["mlflow_run_id"])
    assert history(client, run.info.run_id) == [(s, 10.0 / s) for s in range(1, 6)]
    assert run.data.tags["dstui.bad_metric_lines"] == str(3 * 5)
    assert "Traceback" not in (rd.batch.log_file).read_text()


def test_python_exception_and_silent_runner_are_explained(home: Path) -> None:
    spec = spec_file(
        home,
        "explain",
        [{"name": "crash", "args": ["--fail-at", "3"]}, {"name": "silent", "args": ["--silent"]}],
    )
    proc = dstui("run", str(spec), timeout=120)
    assert proc.returncode == 1
    crash, silent = only_batch(home).runs()
    assert crash.status()["reason"] == "Python: RuntimeError: injected failure at step 3"
    assert crash.status()["steps_done"] == 3
    assert silent.status()["state"] == "failed"
    assert "wrote no metrics" in silent.status()["reason"]
    client = mlflow_client()
    run = client.get_run(crash.status()["mlflow_run_id"])
    assert "run/stdout.log" in {a.path for a in client.list_artifacts(run.info.run_id, "run")}
    assert run.data.tags["dstui.reason"].startswith("Python: RuntimeError")


def test_resume_keeps_done_and_reruns_failed_then_retry(home: Path) -> None:
    flag = home / "fixed"
    spec = spec_file(
        home,
        "resume",
        [
            {"name": "good", "args": ["--steps", "3"]},
            {"name": "flaky", "args": ["--steps", "3", "--fail-at", "2", "--fail-unless", str(flag)]},
        ],
        steps=3,
    )
    assert dstui("run", str(spec), timeout=120).returncode == 1
    b = only_batch(home)
    good, flaky = b.runs()
    assert (good.state, flaky.state) == ("done", "failed")
    good_started = good.status()["started"]
    flag.write_text("now it works")
    proc = dstui("run", "--resume", str(spec), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 1 requeued, 0 new" in proc.stdout
    assert list_batches(home / "runs") == [b]  # same batch, not a new one
    assert good.status()["started"] == good_started  # not run again
    assert flaky.state == "done" and flaky.status()["attempt"] == 2
    assert (flaky.path / "attempts" / "1" / "stdout.log").exists()  # first attempt kept
    # retry one run explicitly
    out = dstui("retry", f"{b.id}/good-r0", check=True).stdout
    assert "queued again" in out
    wait_for(lambda: good.state == "done" and good.status().get("attempt") == 2 and finalized(b), what="retry done")
    client = mlflow_client()
    exp = client.get_experiment_by_name("resume")
    states = sorted((r.info.run_name, r.info.status) for r in client.search_runs([exp.experiment_id], "tags.`dstui.role` = 'run'"))
    # every attempt is its own MLflow run: the failed one stays FAILED for the record
    assert states == [("flaky-r0", "FAILED"), ("flaky-r0", "FINISHED"), ("good-r0", "FINISHED"), ("good-r0", "FINISHED")]


def test_only_runs_the_chosen_conditions_and_resume_keeps_the_rest(home: Path) -> None:
    flag = home / "fixed"
    conds = [
        {"name": "a", "args": ["--steps", "2"]},
        {"name": "b-slow", "args": ["--steps", "2", "--fail-at", "1", "--fail-unless", str(flag)]},
        {"name": "b-fast", "args": ["--steps", "2"]},
    ]
    spec = spec_file(home, "only", conds, steps=2)
    bad = dstui("run", str(spec), "--only", "zzz*", timeout=120)
    assert bad.returncode == 2 and "no run matches" in bad.stderr and "a, b-fast, b-slow" in bad.stderr
    assert not (home / "runs").exists() or not list_batches(home / "runs")  # nothing laid out
    # a whole batch where b-slow fails, then only it is resumed
    assert dstui("run", str(spec), timeout=120).returncode == 1
    b = only_batch(home)
    assert [r.state for r in b.runs()] == ["done", "failed", "done"]
    before = {r.name: r.status()["started"] for r in b.runs()}
    flag.write_text("fixed")
    proc = dstui("run", "--resume", str(spec), "--only", "b-s*", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 kept, 1 requeued, 0 new" in proc.stdout
    runs = {r.name: r for r in b.runs()}
    assert list(runs) == ["a-r0", "b-slow-r0", "b-fast-r0"]  # the batch keeps all three, in order
    assert all(r.state == "done" for r in runs.values())
    assert runs["a-r0"].status()["started"] == before["a-r0"]  # untouched
    assert runs["b-fast-r0"].status()["started"] == before["b-fast-r0"]
    assert runs["b-slow-r0"].status()["attempt"] == 2


def test_one_supervisor_per_batch(home: Path) -> None:
    spec = spec_file(home, "lock", [{"name": "slow", "args": ["--steps", "40", "--interval", "0.2"]}], steps=40)
    dstui("run", "--detach", str(spec), check=True)
    b = only_batch(home)
    wait_for(lambda: is_supervised(b), what="supervisor up")
    second = dstui("supervise", str(b.path))
    assert second.returncode == 3
    assert f"batch {b.id} is already supervised by pid {supervisor_pid(b)}" in second.stderr
    again = dstui("run", "--resume", str(spec))
    assert again.returncode == 2 and "still being supervised" in again.stderr
    wait_for(lambda: b.runs() and b.runs()[0].state == "running", what="run started")
    dstui("cancel", f"{b.id}/slow-r0", check=True)
    wait_for(lambda: finalized(b), what="cancelled batch finalized")
    (rd,) = b.runs()
    assert rd.state == "killed" and rd.status()["reason"] == "cancelled"


def test_locked_mlflow_store_keeps_metrics_and_sends_later(home: Path) -> None:
    client = mlflow_client()
    client.search_experiments()  # create the store
    db = home / "mlruns" / "mlflow.db"
    spec = spec_file(home, "locked", [{"name": "r", "args": ["--steps", "8", "--interval", "0.1"]}], steps=8)
    hold = threading.Event()
    locked = threading.Event()

    def lock_db() -> None:
        con = sqlite3.connect(db, timeout=30)
        con.execute("BEGIN EXCLUSIVE")
        locked.set()
        hold.wait(60)
        con.rollback()
        con.close()

    t = threading.Thread(target=lock_db)
    t.start()
    locked.wait(10)
    try:
        dstui("run", "--detach", str(spec), check=True)
        b = only_batch(home)
        rd = wait_for(lambda: b.runs() and b.runs()[0], what="run folder")
        # the run is not held back by the store: it starts, runs and ends while MLflow is locked
        wait_for(lambda: rd.state in ("done", "failed"), timeout=120, what="run ended during the lock")
        assert rd.state == "done" and not finalized(b)
        assert "MLflow unreachable" in b.log_file.read_text()
    finally:
        hold.set()
        t.join()
    wait_for(lambda: finalized(b), timeout=120, what="batch finalized after the store came back")
    assert history(client, rd.status()["mlflow_run_id"]) == jsonl_steps(rd)


def test_deleted_run_folder_under_a_live_batch(home: Path) -> None:
    spec = spec_file(
        home,
        "delete",
        [{"name": "first", "args": ["--steps", "15", "--interval", "0.2"]}, {"name": "second", "args": ["--steps", "2"]}],
        steps=15,
    )
    dstui("run", "--detach", str(spec), check=True)
    b = only_batch(home)
    wait_for(lambda: len(b.runs()) == 2 and b.runs()[0].state == "running", what="first running")
    import shutil

    shutil.rmtree(b.path / "second-r0")
    wait_for(lambda: finalized(b), timeout=120, what="batch finalized")
    assert [r.name for r in b.runs()] == ["first-r0"] and b.runs()[0].state == "done"
    assert "Traceback" not in b.log_file.read_text()
    out = dstui("status", b.id, check=True)
    assert "first-r0" in out.stdout and "Traceback" not in out.stderr


def test_secrets_never_reach_mlflow(home: Path) -> None:
    spec = spec_file(home, "secret", [{"name": "s", "args": ["--steps", "2"]}], steps=2, env={"HF_TOKEN": "hf_supersecret", "MY_FLAG": "1"})
    assert dstui("run", str(spec), timeout=120).returncode == 0
    client = mlflow_client()
    (rd,) = only_batch(home).runs()
    run = client.get_run(rd.status()["mlflow_run_id"])
    blob = json.dumps([run.data.params, run.data.tags])
    assert "hf_supersecret" not in blob
    assert run.data.params["env.HF_TOKEN"] == "***" and run.data.params["env.MY_FLAG"] == "1"
    art = Path(client.download_artifacts(run.info.run_id, "run", str(home / "dl")))
    for f in art.iterdir():
        assert "hf_supersecret" not in f.read_text(errors="replace"), f.name


@pytest.mark.e2e
def test_killing_one_rank_fails_the_job_and_leaves_no_orphan(home: Path) -> None:
    data = yaml.safe_load((SPECS / "smoke.yaml").read_text())
    data.update(name="rank-kill", axes={"zero_stage": [2]})
    data["settings"].update(steps=400, warmup_steps=1)
    spec = home / "rank.yaml"
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True)
    b = only_batch(home)
    rd = wait_for(lambda: b.runs() and b.runs()[0], what="run")
    wait_for(lambda: (rd.status().get("steps_done") or 0) >= 2, timeout=300, what="training steps")
    pgid = rd.status()["pgid"]
    ranks = [p for p in psutil.process_iter(["cmdline"]) if "--local_rank=1" in " ".join(p.info["cmdline"] or [])]
    assert ranks, "rank 1 not found"
    ranks[0].send_signal(signal.SIGKILL)
    wait_for(lambda: finalized(b), timeout=180, what="batch finalized")
    st = rd.status()
    assert st["state"] == "failed" and st["exit_code"] != 0, st
    assert st["reason"], st
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(rd.metrics_file) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
