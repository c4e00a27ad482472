"""The CLI as scripts and people use it, with real processes: `run --json`, `status` from another folder,
`cancel BATCH` (every process gone), `retry BATCH --failed`, `list --json` without library noise.

The runs are small `kind: command` programs; only `list` imports DeepSpeed (its config check).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from helpers import SPECS

from dstui.core import exit_codes
from dstui.core.rundir import BatchDir, RunDir
from dstui.execute.process_group import group_alive

LONG_REASON = (
    "RuntimeError: the data loader could not open /data/shards/shard-00001.parquet; check that the dataset "
    "was downloaded and that --data-dir points at it (docs/DATA.md tells how)"
)
SEED_LINES = (
    "import time\n"
    "for s in range(1, 4):\n"
    "    print(f'Epoch 1, Step {s}, Loss: {5.0 / s:.6f} sync: True time: 0.010 alloc_mem: 1000 peak_mem: 2000', flush=True)\n"
)


def write_spec(folder: Path, name: str, conditions: dict[str, str], steps: int = 3) -> Path:
    spec = {
        "name": name,
        "settings": {"kind": "command", "metrics_format": "seed", "steps": steps, "warmup_steps": 0},
        "conditions": [{"name": c, "command": [sys.executable, "-c", code]} for c, code in conditions.items()],
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def cli(*args: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dstui", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def wait_for(pred, timeout: float = 240, what: str = "condition"):  # noqa: ANN001, ANN201
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment without DSTUI_HOME: runs go to the default home ($XDG_DATA_HOME/dstui)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DSTUI_HOME", "DSTUI_RUNS_DIR", "MLFLOW_TRACKING_URI")}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg"), DSTUI_PRIVATE_DIR=str(tmp_path / "private"), COLUMNS="80")
    return env


def test_run_json_status_elsewhere_and_retry_failed(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    crash = f"import sys\nprint('Traceback (most recent call last):')\nprint({LONG_REASON!r})\nsys.exit(1)\n"
    spec = write_spec(here, "mixed", {"ok": SEED_LINES, "crash": crash})
    proc = cli("run", str(spec), "--json", cwd=here, env=env)
    doc = json.loads(proc.stdout)  # only the document on stdout; people's lines went to stderr
    assert proc.returncode == exit_codes.RUN_FAILED == doc["exit_code"], proc.stderr
    runs = {r["run"]: r for r in doc["runs"]}
    assert (runs["ok-r0"]["state"], runs["ok-r0"]["step"], runs["ok-r0"]["reason"]) == ("done", 3, None)
    assert runs["crash-r0"]["state"] == "failed" and LONG_REASON in runs["crash-r0"]["reason"]
    assert all(r["batch"] == doc["batch"] for r in runs.values())
    home = tmp_path / "xdg" / "dstui"
    assert Path(doc["path"]).parent == home / "runs"
    assert (home / "mlruns" / "mlflow.db").is_file()  # the store beside the runs

    # reconnected over SSH, in another folder: the same batch, and why it is looked for there
    status = cli("status", "--json", cwd=elsewhere, env=env)
    sdoc = json.loads(status.stdout)
    assert status.returncode == exit_codes.RUN_FAILED
    assert sdoc["home_source"] == "default" and [b["batch"] for b in sdoc["batches"]] == [doc["batch"]]
    assert {r["run"]: r["state"] for r in sdoc["batches"][0]["runs"]} == {"ok-r0": "done", "crash-r0": "failed"}
    human = cli("status", "-v", cwd=elsewhere, env=env)
    assert f"runs: {home / 'runs'} (the default home" in human.stdout
    assert LONG_REASON in " ".join(human.stdout.split())  # whole, wrapped at 80 columns

    retry = cli("retry", doc["batch"], "--failed", "--json", cwd=elsewhere, env=env)
    assert retry.returncode == 0, retry.stderr
    assert [r["run"] for r in json.loads(retry.stdout)["queued"]] == ["crash-r0"]
    b = BatchDir(Path(doc["path"]))
    crash_rd = RunDir(b.path / "crash-r0")
    assert crash_rd.status()["attempt"] == 2 and (crash_rd.path / "attempts" / "1").is_dir()
    wait_for(lambda: b.info().get("finalized") and crash_rd.state == "failed", what="the retried run ended")
    assert RunDir(b.path / "ok-r0").status().get("attempt", 1) == 1  # the done run was left alone


def test_cancel_batch_stops_every_run(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    sleepy = "import time\nprint('Epoch 1, Step 1, Loss: 1.0 sync: True time: 0.010 alloc_mem: 1 peak_mem: 2', flush=True)\ntime.sleep(600)\n"
    spec = write_spec(tmp_path, "sleepy", {"a": sleepy, "b": sleepy, "c": sleepy}, steps=5)
    start = cli("run", str(spec), "--detach", "--parallel", "2", "--json", cwd=tmp_path, env=env)
    assert start.returncode == 0, start.stderr
    b = BatchDir(Path(json.loads(start.stdout)["path"]))
    follower = subprocess.Popen([sys.executable, "-m", "dstui", "status", "--follow", "--jsonl", b.id], cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        a, bb, c = (RunDir(b.path / n) for n in ("a-r0", "b-r0", "c-r0"))
        wait_for(lambda: a.status().get("pgid") and bb.status().get("pgid"), what="two runs started")
        pgids = [a.status()["pgid"], bb.status()["pgid"]]
        assert all(group_alive(g) for g in pgids) and c.state == "queued"
        cancel = cli("cancel", "sleepy-*", cwd=tmp_path, env=env)  # a pattern over batch ids: the whole batch
        assert cancel.returncode == 0, cancel.stderr
        assert cancel.stdout.count("cancel requested:") == 3
        wait_for(lambda: not any(group_alive(g) for g in pgids), what="process groups gone")
        wait_for(lambda: b.info().get("finalized"), what="batch finalized")
        assert [rd.state for rd in b.runs()] == ["killed"] * 3
        assert not c.status().get("pgid")  # the queued one never started
        out, _ = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
    records = [json.loads(line) for line in out.splitlines()]
    assert records[-1]["event"] == "batch" and records[-1]["exit_code"] == exit_codes.RUN_FAILED
    assert {r["run"]: r["state"] for r in records[-1]["runs"]} == {"a-r0": "killed", "b-r0": "killed", "c-r0": "killed"}
    assert {r["run"] for r in records if r["event"] == "run" and r["state"] == "running"} == {"a-r0", "b-r0"}
    assert follower.returncode == exit_codes.RUN_FAILED


def test_list_json_without_library_noise(tmp_path: Path) -> None:
    """DeepSpeed is imported (an empty answers cache): its accelerator warning goes to the log, -v shows it."""
    env = {**user_env(tmp_path), "DSTUI_CACHE": str(tmp_path / "cache"), "DSTUI_HOME": str(tmp_path / "home")}
    proc = cli("list", str(SPECS / "smoke.yaml"), "--json", "--no-history", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(r["run"], r["state"], r["step"], r["reason"]) for r in doc["runs"]] == [
        (f"z{z}-r0", "planned", 0, None) for z in range(4)
    ]
    assert "Setting accelerator" not in proc.stdout + proc.stderr
    log = tmp_path / "home" / "logs" / "libraries.log"
    assert "Setting accelerator to CPU" in log.read_text()  # DeepSpeed was asked, and said it here
    loud = cli("list", str(SPECS / "smoke.yaml"), "--no-history", "-v", cwd=tmp_path, env={**env, "DSTUI_CACHE": str(tmp_path / "c2")})
    assert loud.returncode == 0 and loud.stdout.startswith("#  run")  # the table opens the output
    assert "Setting accelerator" not in loud.stdout and "Setting accelerator to CPU" in loud.stderr  # -v: on stderr


def test_a_new_store_says_nothing_of_its_tables(tmp_path: Path) -> None:
    """The first command on a new MLflow store printed MLflow's 'Creating initial MLflow database tables...'."""
    env = {**user_env(tmp_path), "DSTUI_HOME": str(tmp_path / "home")}
    proc = cli("report", "-e", "nosuch", "-o", str(tmp_path / "r"), cwd=tmp_path, env=env)
    assert (tmp_path / "home" / "mlruns" / "mlflow.db").exists()  # the store was made by this command
    assert proc.returncode == exit_codes.NOT_FOUND and "no MLflow experiment named 'nosuch'" in proc.stderr
    assert "INFO" not in proc.stderr and "database tables" not in proc.stderr, proc.stderr
