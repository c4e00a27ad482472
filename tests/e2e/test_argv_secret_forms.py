"""Issue 40.7's secret forms through one real batch: none reaches a file dstui writes or the terminal.

A `kind: command` run whose command line holds ``-H 'Authorization: Bearer T1'``, ``-p T2``,
``{"token": "T3"}`` and ``HF_TOKEN=T4`` (each leaked into 20 files before: cmd.txt,
spec.json, status.json, batch.json, MLflow params, artifacts, the store, the report, ...).
The job gets all four; it also prints them, so that its own stdout.log holds them (a job's
output is its own) while the copy uploaded to MLflow must not. Afterwards every byte under
DSTUI_HOME (run folders, mlflow.db and its WAL, artifacts), the report and everything
`run`, `run --dry-run`, `list --commands`, `status -v` and `report` printed is searched.
"""

from __future__ import annotations

import json
import secrets as pysecrets
import string
import sys
from pathlib import Path

import yaml
from helpers import dstui

from dstui.core.rundir import list_batches

PROGRAM = (
    "import json, sys\n"
    "json.dump(sys.argv[2:], open(sys.argv[1], 'w'))\n"
    "from dstui.core.records import seed_line\n"
    "for s in (1, 2, 3): print(seed_line(1, s, 1.0 / s, 0.01, 1, 2), flush=True)\n"
    "print('starting with', sys.argv[2:], flush=True)\n"
)


def _random(n: int) -> str:
    return "".join(pysecrets.choice(string.ascii_letters + string.digits) for _ in range(n))


def test_the_four_forms_reach_the_job_and_no_file_or_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tokens = {"bearer": _random(32), "p": _random(16), "json": _random(24), "env": _random(28)}
    forms = ["-H", f"Authorization: Bearer {tokens['bearer']}", "-p", tokens["p"], f'{{"token": "{tokens["json"]}"}}',
             f"HF_TOKEN={tokens['env']}"]  # fmt: skip
    saw = tmp_path / "job-saw.json"  # outside the home
    spec = tmp_path / "forms.yaml"
    spec.write_text(yaml.safe_dump({"name": "forms", "settings": {
        "kind": "command", "steps": 3, "warmup_steps": 0, "metrics_format": "seed",
        "command": [sys.executable, "-c", PROGRAM, str(saw), *forms]}}))  # fmt: skip
    env = {"DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": "", "DSTUI_PRIVATE_DIR": str(tmp_path / "private")}
    printed = [dstui("run", "--dry-run", str(spec), env=env, timeout=300), dstui("list", str(spec), "--commands", env=env, timeout=300)]
    run = dstui("run", str(spec), env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (b,) = list_batches(home / "runs")
    printed += [run, dstui("status", "-v", env=env, timeout=120),
                dstui("report", "-e", "forms", "-b", b.id, "-o", str(home / "report"), env=env, timeout=600)]  # fmt: skip
    assert printed[-1].returncode == 0, printed[-1].stderr[-3000:]
    assert json.loads(saw.read_text()) == forms  # the job got every value
    needles = {name: t.encode() for name, t in tokens.items()}
    own_log = b.path / "base-r0" / "stdout.log"
    assert all(n in own_log.read_bytes() for n in needles.values())  # the job's own output holds them
    files = [p for p in home.rglob("*") if p.is_file() and p != own_log]
    names = {p.name for p in files}
    assert {"batch.json", "cmd.txt", "spec.json", "status.json", "mlflow.db", "report.md", "stdout.log"} <= names
    hits = {str(p.relative_to(home)): name for p in files for name, n in needles.items() if n in p.read_bytes()}
    assert hits == {}
    for proc in printed:
        assert not any(t in proc.stdout + proc.stderr for t in tokens.values()), proc.args
    cmd = (b.path / "base-r0" / "cmd.txt").read_text()
    assert "'Authorization: Bearer ***' -p '***' '{\"token\": \"***\"}' 'HF_TOKEN=***'" in cmd, cmd
