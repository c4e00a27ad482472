"""No MLflow run of dstui's ends before it starts: cancel before start, retry and resume (issue 38.3).

A user's `dstui cancel` while a batch's first run trained left the two queued runs in
MLflow with -508 ms durations and a failed icon: their MLflow runs were made at the
end (start = now) and ended when they were cancelled (earlier). Here a real supervisor
runs cheap ``kind: command`` runs into a real SQLite store: cancel while the first run
hangs, retry one of the never-started runs, resume the batch; then every MLflow run it
made (the batch's run, every attempt of every run) has an end at or after its start,
and the attempts that never started are KILLED with no duration.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, dstui, mlflow_client
from test_reliability import finalized, wait_for

from dstui.core.rundir import list_batches

pytestmark = pytest.mark.e2e

FAKE = str(REPO / "tests" / "programs" / "fake_runner.py")


def test_no_mlflow_run_ends_before_it_starts(home: Path) -> None:
    flag = home / "let-it-finish"
    command = [sys.executable, FAKE, "--metrics-file", "{metrics_file}", "--steps", "3", "--interval", "0.05"]
    data = {
        "name": "durations",
        "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 3, "warmup_steps": 0},
        "conditions": [  # one run at a time (no GPUs): b and c wait while a hangs after its first step
            {"name": "a", "command": [*command, "--hang-after", "1", "--hang-unless", str(flag)]},
            {"name": "b", "command": command},
            {"name": "c", "command": command},
        ],
    }
    spec = home / "durations.yaml"
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True)
    b = wait_for(lambda: (list_batches(home / "runs") or [None])[0], what="the batch")
    a_run = b.runs()[0]
    wait_for(lambda: (a_run.status().get("steps_done") or 0) >= 1, what="a's first step")

    dstui("cancel", b.id, check=True)  # a is killed; b and c never started
    wait_for(lambda: finalized(b), what="the cancelled batch finalized")
    states = {rd.name: (rd.state, rd.status().get("reason")) for rd in b.runs()}
    assert states["b-r0"] == ("killed", "cancelled before start") == states["c-r0"], states

    dstui("retry", f"{b.id}/b-r0", check=True)  # a run that never started, queued again
    wait_for(lambda: b.runs()[1].state == "done" and finalized(b), what="the retried run done")

    flag.write_text("go")
    resumed = dstui("run", "--resume", str(spec), timeout=300)  # a and c again
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [rd.state for rd in b.runs()] == ["done", "done", "done"]

    client = mlflow_client()
    exp = client.get_experiment_by_name("durations")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    by_attempt = {(r.info.run_name, r.data.tags.get("dstui.attempt")): r for r in runs if r.data.tags.get("dstui.role") == "run"}
    assert sorted(by_attempt) == [("a-r0", "1"), ("a-r0", "2"), ("b-r0", "1"), ("b-r0", "2"), ("c-r0", "1"), ("c-r0", "2")]
    for r in runs:  # the batch's run too: it ended, was reopened by the retry and the resume, and ended again
        assert r.info.end_time is not None and r.info.end_time >= r.info.start_time, (
            r.info.run_name, r.data.tags.get("dstui.attempt"), r.info.start_time, r.info.end_time, r.info.status)
    for name in ("b-r0", "c-r0"):  # never started: killed, not failed, and no duration
        first = by_attempt[(name, "1")]
        assert first.info.status == "KILLED" and first.data.tags["dstui.status"] == "killed"
        assert first.info.end_time == first.info.start_time
        assert first.data.tags["dstui.reason"] == "cancelled before start"
    assert by_attempt[("a-r0", "1")].info.status == "KILLED"  # cancelled while it ran
    assert all(by_attempt[(n, "2")].info.status == "FINISHED" for n in ("a-r0", "b-r0", "c-r0"))
    for r in by_attempt.values():  # the run folder as it is, the attempt beside it (no '#1' to strip)
        assert r.data.tags["dstui.run_dir"] == str(b.path / r.info.run_name)
    (batch_run,) = [r for r in runs if r.data.tags.get("dstui.role") == "batch"]
    assert batch_run.info.status == "FINISHED" and not batch_run.data.metrics  # in no chart's legend
