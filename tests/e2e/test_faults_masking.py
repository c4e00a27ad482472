"""Fault test (issue 20): spec env values and tracking-URI credentials never reach a file, a log or MLflow.

A real batch against a real `mlflow server` reached as ``http://user:pass@host``:
the stand-in runner and the real DeepSpeed runner (2 gloo ranks), a spec env
with a URI password, a secret without a secret-looking name and a harmless
variable. Then every byte dstui and MLflow wrote (run and batch folders, the
server's store and artifacts, a report, everything the CLI printed) is searched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import REPO, dstui, mlflow_client

from dstui.core.rundir import list_batches
from dstui.execute.launch import free_port

FAKE = str(REPO / "tests" / "programs" / "fake_runner.py")
ENV = {"DB_URL": "postgres://u:pass@h/db", "MY_SECRET_THING": "s3cr3t", "OMP_NUM_THREADS": "1"}
NEEDLES = (b"s3cr3t", b"pass@")
# The job records what it saw somewhere only it writes, then becomes the stand-in runner.
SEE = (
    "import json, os, sys\n"
    "names = ('DB_URL', 'MY_SECRET_THING', 'OMP_NUM_THREADS')\n"
    "json.dump({n: os.environ.get(n) for n in names}, open(sys.argv[1], 'w'))\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


@pytest.fixture
def server(tmp_path: Path, empty_db: Path) -> Iterator[dict]:
    """`mlflow server` on a SQLite store; its store and artifacts are part of what is searched."""
    root = tmp_path / "server"
    root.mkdir()
    shutil.copy(empty_db, root / "mlflow.db")
    port = free_port()
    log = tmp_path / "mlflow-server.log"  # the server's own output: not dstui's, not searched
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "MLFLOW_TRACKING_URI": ""},
        )  # fmt: skip
    try:
        import urllib.request

        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, "mlflow server did not come up: " + log.read_text()[-2000:]
            time.sleep(0.3)
        yield {"root": root, "uri": f"http://user:pass@127.0.0.1:{port}"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _count(blob: bytes) -> dict[str, int]:
    return {n.decode(): blob.count(n) for n in NEEDLES}


def _files(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("*") if p.is_file()]


def test_env_values_and_uri_credentials_reach_no_file_log_param_or_terminal(home: Path, tmp_path: Path, server: dict) -> None:
    saw = tmp_path / "job-saw.json"  # outside the home, the runs and the store
    spec = home / "masked.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "masked",
        "settings": {"env": ENV, "steps": 2, "warmup_steps": 0, "model": "tiny-llama", "dataset": "tiny-corpus",
                     "seq_length": 32, "micro_batch": 1, "gpus": 2, "dtype": "fp32", "torch_adam": True},
        "conditions": [
            {"name": "stand-in", "kind": "command", "metrics_format": "jsonl",
             "command": [sys.executable, "-c", SEE, str(saw), FAKE, "--metrics-file", "{metrics_file}", "--steps", "3"]},
            {"name": "deepspeed", "kind": "train", "zero_stage": 2},
        ],
    }))  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": server["uri"]}
    printed = [dstui("run", "--dry-run", str(spec), env=env, timeout=300)]
    printed.append(dstui("run", str(spec), env=env, timeout=900))
    assert printed[-1].returncode == 0, printed[-1].stdout[-3000:] + printed[-1].stderr[-3000:]
    (batch,) = list_batches(home / "runs")
    printed.append(dstui("status", batch.id, env=env, timeout=120))
    report = tmp_path / "report"
    printed.append(dstui("report", "-e", "masked", "-b", batch.id, "-o", str(report), env=env, timeout=600))
    assert printed[-1].returncode == 0, printed[-1].stderr[-3000:]

    # the job got the real values, and nothing else has them
    assert json.loads(saw.read_text()) == ENV
    client = mlflow_client(server["uri"])
    runs = {r.data.tags["dstui.condition"]: r for r in client.search_runs([client.get_experiment_by_name("masked").experiment_id])
            if r.data.tags.get("dstui.role") == "run"}  # fmt: skip
    assert sorted(runs) == ["deepspeed", "stand-in"] and all(r.info.status == "FINISHED" for r in runs.values())
    for r in runs.values():
        assert {k: v for k, v in r.data.params.items() if k.startswith("env.")} == {
            "env.DB_URL": "***", "env.MY_SECRET_THING": "***", "env.OMP_NUM_THREADS": "1"}  # fmt: skip
        assert _count(json.dumps([r.data.params, r.data.tags]).encode()) == {"s3cr3t": 0, "pass@": 0}
    searched = _files(batch.path, server["root"], report)
    assert {p.name for p in searched} >= {"spec.json", "batch.json", "cmd.txt", "status.json", "stdout.log", "supervisor.log", "mlflow.db"}
    assert any("artifacts" in p.parts for p in searched) and any(p.suffix == ".md" for p in searched)
    counts = {str(p): _count(p.read_bytes()) for p in searched}
    assert {p: c for p, c in counts.items() if any(c.values())} == {}
    for proc in printed:
        assert _count((proc.stdout + proc.stderr).encode()) == {"s3cr3t": 0, "pass@": 0}
    assert "OMP_NUM_THREADS" in (batch.path / "stand-in-r0" / "spec.json").read_text()
    # the real values are kept only where the launch needs them: outside the home, this user's alone
    private = batch.runs()[0].private_spec_file
    assert home not in private.parents and oct(private.stat().st_mode & 0o777) == "0o600"
    assert b"s3cr3t" in private.read_bytes()
