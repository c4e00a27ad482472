"""Secrets on command lines and open ports (issue 33.5, 33.7), through one real batch.

One batch in a fresh DSTUI_HOME whose MLflow store dstui creates itself: a
`kind: command` run whose command holds ``--hf_token hf_<random>``,
``--api-key=<random>`` and ``--pat {env:MY_PAT}`` (a value taken from the
environment by reference), and a real 1-node, 2-rank DeepSpeed run (CPU,
gloo). While it runs, the listening sockets of the DeepSpeed run's processes
are sampled; afterwards every byte under DSTUI_HOME (run folders, mlflow.db and
its WAL, artifacts, a report) and everything the CLI printed is searched.
"""

from __future__ import annotations

import json
import os
import secrets as pysecrets
import stat
import string
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import REPO, dstui

from dstui.core.rundir import list_batches

FAKE = str(REPO / "tests" / "programs" / "fake_runner.py")
# The job records the argv it got somewhere only it writes, then becomes the stand-in runner.
SEE = (
    "import json, os, sys\n"
    "json.dump(sys.argv[2:], open(sys.argv[1], 'w'))\n"
    "i = sys.argv.index('--steps')\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:i + 2]])\n"
)
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
pytestmark = pytest.mark.xdist_group("argv-secrets")  # one worker: the module's batch is made once


def _random(n: int) -> str:
    return "".join(pysecrets.choice(string.ascii_letters + string.digits) for _ in range(n))


def _listening(pgid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of the processes of one run (its process group)."""
    found: set[tuple[str, int]] = set()
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            conns = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections(kind="inet")
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
        found |= {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return found


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("argv-secrets")
    home = root / "home"
    home.mkdir()
    tokens = {"hf": "hf_" + _random(34), "api": _random(32), "pat": _random(24)}
    env = {"DSTUI_HOME": str(home), "DSTUI_PRIVATE_DIR": str(root / "private"), "MY_PAT": tokens["pat"],
           "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlruns/mlflow.db"}  # fmt: skip
    saw = root / "job-saw.json"  # outside the home
    spec = root / "argv.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "argv",
        "settings": {"steps": 6, "warmup_steps": 0, "model": "tiny-llama", "dataset": "tiny-corpus", "seq_length": 32,
                     "micro_batch": 1, "gpus": 2, "dtype": "fp32", "torch_adam": True},
        "conditions": [
            {"name": "stand-in", "kind": "command", "metrics_format": "jsonl", "gpus": 1,
             "command": [sys.executable, "-c", SEE, str(saw), FAKE, "--metrics-file", "{metrics_file}", "--steps", "3",
                         "--hf_token", tokens["hf"], f"--api-key={tokens['api']}", "--pat", "{env:MY_PAT}"]},
            {"name": "deepspeed", "kind": "train", "zero_stage": 1},
        ],
    }))  # fmt: skip
    old_umask = os.umask(0o022)  # a usual umask: dstui's files must come out private anyway
    try:
        return _run_batch(root, home, env, spec, saw, tokens)
    finally:
        os.umask(old_umask)


def _run_batch(root: Path, home: Path, env: dict, spec: Path, saw: Path, tokens: dict) -> dict:
    printed = [dstui("run", "--dry-run", str(spec), env=env, timeout=300), dstui("list", str(spec), "--commands", env=env, timeout=300)]
    listens: set[tuple[str, int]] = set()
    master_port = None
    run = subprocess.Popen([sys.executable, "-m", "dstui", "run", str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, **env})  # fmt: skip
    try:
        while run.poll() is None:  # sample the DeepSpeed run's sockets while it runs
            for status_file in (home / "runs").glob("*/deepspeed-r0/status.json"):
                status = json.loads(status_file.read_text() or "{}")
                if status.get("pgid") and status.get("state") == "running":
                    argv = status.get("argv") or []
                    flag = next((f for f in ("--master-port", "--master_port") if f in argv), None)  # dstui's / DeepSpeed's
                    if flag:
                        master_port = int(argv[argv.index(flag) + 1])
                    listens |= _listening(int(status["pgid"]))
            time.sleep(0.2)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    printed.append(subprocess.CompletedProcess(run.args, run.returncode, out, err))
    assert run.returncode == 0, out[-3000:] + err[-3000:]
    (b,) = list_batches(home / "runs")
    printed.append(dstui("status", b.id, env=env, timeout=120))
    printed.append(dstui("report", "-e", "argv", "-b", b.id, "-o", str(home / "report"), env=env, timeout=600))
    assert printed[-1].returncode == 0, printed[-1].stderr[-3000:]
    return {"home": home, "tokens": tokens, "saw": saw, "printed": printed, "listens": listens,
            "master_port": master_port, "batch": b}  # fmt: skip


def test_argv_tokens_reach_the_job_and_no_file_store_report_or_terminal(batch: dict) -> None:
    home, tokens = batch["home"], batch["tokens"]
    got = json.loads(batch["saw"].read_text())
    assert got[got.index("--hf_token") + 1] == tokens["hf"] and f"--api-key={tokens['api']}" in got
    assert got[got.index("--pat") + 1] == tokens["pat"]  # {env:MY_PAT}: the value, for the process only
    needles = [t.encode() for t in tokens.values()]
    files = [p for p in home.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"batch.json", "cmd.txt", "spec.json", "status.json", "mlflow.db", "report.md"} <= names
    assert any("artifacts" in p.parts for p in files)
    hits = {str(p): n.decode() for p in files for n in needles if n in p.read_bytes()}
    assert hits == {}
    for proc in batch["printed"]:
        assert not any(t in proc.stdout + proc.stderr for t in tokens.values())
    cmd = (batch["batch"].path / "stand-in-r0" / "cmd.txt").read_text()
    assert "--hf_token '***'" in cmd and "'--api-key=***'" in cmd and "'{env:MY_PAT}'" in cmd


def test_dstuis_own_files_under_its_home_are_private(batch: dict) -> None:
    """Folders 0700, files 0600, whatever the umask; only a job's own files follow the user's umask."""
    home = batch["home"]
    loose = [str(p.relative_to(home)) for p in home.rglob("*") if p.is_dir() and stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert loose == []
    dstuis = [home / "mlruns" / "mlflow.db", *(p for n in ("cmd.txt", "status.json", "spec.json", "batch.json", "stdout.log")
                                              for p in home.rglob(n))]  # fmt: skip
    dstuis += [p for p in home.rglob("*") if p.is_file() and "artifacts" in p.parts]
    assert len(dstuis) > 10
    assert {str(p.relative_to(home)): oct(stat.S_IMODE(p.stat().st_mode)) for p in dstuis if stat.S_IMODE(p.stat().st_mode) & 0o077} == {}
    # the walk the issue asks for: no file others may read holds a token (a job's own files may be 0644)
    needles = [t.encode() for t in batch["tokens"].values()]
    readable = [p for p in home.rglob("*") if p.is_file() and stat.S_IMODE(p.stat().st_mode) & 0o044]
    assert [str(p) for p in readable if any(n in p.read_bytes() for n in needles)] == []


def test_exit_metrics_and_phase_files_are_private_whatever_the_umask(batch: dict) -> None:
    """Issue 40.7: the job's wrapper (exit.json) and the bundled runner (metrics.jsonl, phase.json) write
    them 0600 under umask 022 (they were 0644); the stand-in's own metrics file follows its umask."""
    b = batch["batch"]
    ours = [b.path / "deepspeed-r0" / n for n in ("exit.json", "metrics.jsonl", "phase.json")] + [b.path / "stand-in-r0" / "exit.json"]
    assert {str(p.relative_to(b.path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in ours} == {
        str(p.relative_to(b.path)): "0o600" for p in ours
    }


def test_one_node_rendezvous_listens_on_loopback_only(batch: dict) -> None:
    listens, port = batch["listens"], batch["master_port"]
    assert port and (("127.0.0.1", port) in listens), (port, listens)  # the store was seen, bound to loopback
    assert {(ip, p) for ip, p in listens if ip not in LOOPBACK} == set()


def test_dstui_ui_with_a_wide_host_warns(tmp_path: Path) -> None:
    env = {"DSTUI_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    wide = dstui("ui", "--host", "0.0.0.0", "--port", "5002", env=env, timeout=120)
    assert wide.returncode == 0, wide.stderr
    assert "dstui: warning: --host 0.0.0.0 serves MLflow without authentication" in wide.stderr
    assert "ssh -L 5002:127.0.0.1:5002" in wide.stderr and "basic-auth" in wide.stderr
    local = dstui("ui", "--port", "5002", env=env, timeout=120)
    assert local.returncode == 0 and "warning" not in local.stderr
