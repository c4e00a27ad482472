"""Property: whatever a job leaves in its run folder, its supervisor stays small and the batch ends.

Hypothesis draws what a job does to its folder before it exits: files turned into links to
/dev/zero, to a FIFO or outside the home, FIFOs, folders, sparse files of up to a TiB, random
binary, records or seed lines joined by bare CRs (metrics.jsonl, stdout.log, system.jsonl,
exit.json, phase.json, files of its own, ``attempts``). Each example is a real batch of two
runs, the hostile one and an ordinary one, followed by a real ``dstui supervise`` child process
(its peak RSS from ``wait4``) into a real SQLite MLflow store. It must exit 0 with the batch
finalized, the ordinary run's every point in MLflow, no MLflow run left RUNNING, no traceback
in its log, and a peak RSS under :data:`RSS_BOUND`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers import REPO, mlflow_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.e2e

HOSTILE = str(REPO / "tests" / "programs" / "hostile_job.py")
RSS_BOUND = 1 << 30  # bytes; an ordinary batch's supervisor peaks at ~0.2-0.3 GiB here
FILES = ("metrics.jsonl", "stdout.log", "system.jsonl", "exit.json", "phase.json", "notes.txt", "blob.bin", "attempts")
KINDS = ("zero_link", "fifo", "fifo_link", "outside_link", "dir", "sparse", "binary", "cr_lines")
EXAMPLES = int(os.environ.get("FUZZ_N") or 10)
SEEN: list[dict] = []  # one line per example (RELIABILITY.md's figures)


@st.composite
def folder_plans(draw: st.DrawFn) -> dict:
    chosen = draw(st.lists(st.tuples(st.sampled_from(FILES), st.sampled_from(KINDS)), min_size=1, max_size=4,
                           unique_by=lambda t: t[0]))  # fmt: skip
    plan = []
    for name, kind in chosen:
        entry: dict = {"file": name, "as": kind}
        if kind == "sparse":
            entry["size"] = draw(st.sampled_from([1 << 20, 1 << 34, 1 << 40]))  # 1 MiB, 16 GiB, 1 TiB
        elif kind == "binary":
            entry.update(size=draw(st.integers(0, 300_000)), seed=draw(st.integers(0, 999)))
        elif kind == "cr_lines":
            entry["n"] = draw(st.integers(2, 40))
        elif kind == "outside_link":
            entry["size"] = draw(st.sampled_from([10, 1 << 20]))
        plan.append(entry)
    return {"plan": plan, "format": draw(st.sampled_from(["jsonl", "seed"])), "exit": draw(st.sampled_from([0, 1]))}


def make_batch(home: Path, scratch: Path, case: dict):
    """A two-run batch laid out as `dstui run` would, without starting its supervisor."""
    from dstui.execute import batch

    hostile = {"name": "hostile", "metrics_format": case["format"],
               "command": [sys.executable, HOSTILE, "--steps", "4", "--format", case["format"], "--wait-ingested", "4",
                           "--plan", json.dumps(case["plan"]), "--scratch", str(scratch), "--exit", str(case["exit"])]}  # fmt: skip
    ordinary = {"name": "ordinary", "command": [sys.executable, HOSTILE, "--steps", "3"]}
    spec = home / "fuzz.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "fuzz", "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 4, "warmup_steps": 0,
                                     "hung_after_s": 60},
        "conditions": [hostile, ordinary]}))  # fmt: skip
    p = batch.plan(spec, validate=False, progress=lambda _: None)
    return batch.create(p, runs_root=home / "runs", parallel=2, tracking_uri=os.environ["MLFLOW_TRACKING_URI"])


# A small parent that starts the supervisor and reports its peak RSS (wait4's ru_maxrss, KiB). Not
# wait4 from this process: a child forked from a big parent starts with the parent's resident pages
# counted in its high-water mark (Linux carries it over exec), so pytest's own ~250 MiB would show up.
MEASURE = (
    "import os, subprocess, sys\n"
    "log = open(sys.argv[1], 'ab')\n"
    "p = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)\n"
)


def supervise(batch_path: Path, env: dict, timeout_s: float = 300) -> tuple[int, int]:
    """(exit status, peak RSS in bytes) of a real `dstui supervise`, logging where a detached one does."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(batch_path / "supervisor.log"), sys.executable, "-m", "dstui", "supervise",
         str(batch_path)],
        env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    code, peak = out.stdout.split()
    return int(code), int(peak)


@pytest.mark.timeout(EXAMPLES * 90 + 120)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(case=folder_plans())
def test_any_run_folder_keeps_the_supervisor_small_and_the_batch_finalizes(tmp_path: Path, empty_db: Path, case: dict) -> None:
    from dstui.core.rundir import FINAL_STATES

    root = Path(tempfile.mkdtemp(prefix="ex", dir=tmp_path))  # hypothesis may replay an example
    home, scratch = root / "home", root / "scratch"
    (home / "mlruns").mkdir(parents=True)
    (scratch / "victim").mkdir(parents=True)
    (scratch / "victim" / "keep.txt").write_text("keep")
    shutil.copy(empty_db, home / "mlruns" / "mlflow.db")
    uri = f"sqlite:///{home}/mlruns/mlflow.db"
    env = {**os.environ, "DSTUI_HOME": str(home), "DSTUI_PRIVATE_DIR": str(root / "private"), "MLFLOW_TRACKING_URI": uri}
    saved = {k: os.environ.get(k) for k in ("DSTUI_HOME", "DSTUI_PRIVATE_DIR", "MLFLOW_TRACKING_URI")}
    os.environ.update({k: env[k] for k in saved})
    try:
        b = make_batch(home, scratch, case)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    code, peak = supervise(b.path, env)
    SEEN.append({"plan": [f"{e['file']}:{e['as']}" for e in case["plan"]], "format": case["format"], "peak_mib": peak >> 20})
    print(json.dumps(SEEN[-1]))  # the figures (run with -s): each plan and its supervisor's peak RSS
    log = b.log_file.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert b.info().get("finalized"), log[-3000:]
    assert peak < RSS_BOUND, (peak, case)
    assert "Traceback" not in log, log[-3000:]
    hostile, ordinary = b.runs()
    assert hostile.state in FINAL_STATES and ordinary.state == "done", (hostile.status(), ordinary.status())
    client = mlflow_client(uri)
    rid = ordinary.status()["mlflow_run_id"]
    assert [m.step for m in sorted(client.get_metric_history(rid, "loss"), key=lambda m: m.step)] == [1, 2, 3]
    exp = client.get_experiment_by_name("fuzz").experiment_id
    assert [r.info.run_name for r in client.search_runs([exp]) if r.info.status == "RUNNING"] == []
    assert sorted(p.name for p in (scratch / "victim").iterdir()) == ["keep.txt"]  # nothing landed outside
