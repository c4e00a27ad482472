"""Issue 33.1 end to end: a batch of real runs whose output is hostile still streams and finalizes.

Two `kind: command` programs in one batch, one followed through its seed-format log lines and
one through metrics.jsonl, print between valid steps: ``Loss: abc``, a step of 10**30, a 9 MiB
line and a NaN loss. The foreground `dstui run` returns, the batch finalizes, every valid step
is in MLflow exactly once, no MLflow run is left RUNNING, and the bad lines are counted where
a user looks (status.json, `dstui status`, the MLflow tag).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import dstui, mlflow_client

from dstui.core.rundir import list_batches

NINE_MIB = 9 << 20
SEED = f"""
import sys
from dstui.core.records import seed_line
for s in (1, 2, 3):
    print(seed_line(1, s, 1.0 / s, 0.01, 100, 200), flush=True)
print("Epoch 1, Step 4, Loss: abc sync: True time: 0.01", flush=True)
print("Epoch 1, Step {10**30}, Loss: 1.5", flush=True)
sys.stdout.write("~" * {NINE_MIB} + "\\n"); sys.stdout.flush()
print("Epoch 1, Step 5, Loss: nan", flush=True)
for s in (6, 7, 8):
    print(seed_line(1, s, 1.0 / s, 0.01, 100, 200), flush=True)
"""
JSONL = f"""
import json, sys, time
with open(sys.argv[1], "a") as fh:
    w = lambda text: (fh.write(text + "\\n"), fh.flush())
    w(json.dumps({{"type": "header", "time": time.time(), "versions": {{"x": "1", "../bad key": 2}}}}))
    for s in (1, 2, 3):
        w(json.dumps({{"type": "step", "time": time.time(), "step": s, "loss": 1.0 / s}}))
    w('{{"type": "step", "step": 4, "loss": "abc"}}')
    w('{{"type": "step", "step": {10**30}, "loss": 1.5}}')
    w("~" * {NINE_MIB})
    w('{{"type": "step", "step": 5, "loss": NaN}}')
    for s in (6, 7, 8):
        w(json.dumps({{"type": "step", "time": time.time(), "step": s, "loss": 1.0 / s}}))
    w(json.dumps({{"type": "summary", "time": time.time(), "steps": 8, "status": "ok"}}))
"""


def test_hostile_run_output_neither_wedges_nor_loses_the_batch(home: Path) -> None:
    spec = home / "hostile.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "hostile",
        "settings": {"kind": "command", "steps": 8, "warmup_steps": 0},
        "conditions": [
            {"name": "seedlog", "metrics_format": "seed", "command": [sys.executable, "-c", SEED]},
            {"name": "jsonl", "metrics_format": "jsonl", "command": [sys.executable, "-c", JSONL, "{metrics_file}"]},
        ],
    }))  # fmt: skip
    proc = dstui("run", str(spec), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (batch,) = list_batches(home / "runs")
    assert batch.info().get("finalized") and not batch.info().get("tracking_problem")
    client = mlflow_client()
    exp = client.get_experiment_by_name("hostile")
    runs = client.search_runs([exp.experiment_id])
    assert runs and all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    for rd in batch.runs():
        st = rd.status()
        assert st["state"] == "done", st
        history = sorted((m.step, m.value) for m in client.get_metric_history(st["mlflow_run_id"], "loss"))
        assert history == [(s, pytest.approx(1.0 / s, abs=1e-6)) for s in (1, 2, 3, 6, 7, 8)]  # every valid step once, nothing else
        assert st["bad_lines"] >= 4 and st["first_bad_line"], st
        tags = client.get_run(st["mlflow_run_id"]).data.tags
        assert tags["dstui.bad_metric_lines"] == str(st["bad_lines"]) and tags["dstui.first_bad_line"]
        assert json.loads(rd.ingest_file.read_text())["bad_lines"] == st["bad_lines"]
    assert "Traceback" not in batch.log_file.read_text()
    out = dstui("status", batch.id, timeout=120)
    assert out.returncode == 0 and "bad lines (first:" in out.stdout, out.stdout
