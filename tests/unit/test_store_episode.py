"""While the MLflow store is locked, supervisor.log gets one dstui line per episode (#33.8).

A real SQLite store held by an exclusive transaction: every write of the supervisor's store
connection fails. MLflow itself logs each failure with a SQLAlchemy traceback of ~85 lines;
none of those reach the log, and dstui says it once, then once more when writes go through.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from dstui.core.rundir import BatchDir, write_json_atomic
from dstui.execute import store as store_mod
from dstui.execute.store import StoreConnection
from dstui.tracking import client as tracking


@pytest.mark.e2e  # nothing launched, but each failed write waits out SQLite's lock timeout (~20 s): not for the fast loop
def test_a_locked_store_is_one_line_per_episode_without_mlflows_tracebacks(
    tmp_path: Path, empty_db: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "mlflow.db"
    shutil.copy(empty_db, db)
    uri = f"sqlite:///{db}"
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path))
    monkeypatch.setattr(store_mod, "RETRY_AFTER_S", 0.0)
    batch = BatchDir(tmp_path / "b")
    batch.path.mkdir()
    write_json_atomic(batch.batch_file, {"experiment": "locked", "runs": []})
    conn = StoreConnection(batch, uri)
    c = conn.client()
    run_id = tracking.create_run(c, conn.experiment_id, "r", tags={})

    def send(step: int) -> bool:
        c = conn.client()
        try:
            tracking.log_metrics(c, run_id, [("loss", 1.0, 1000 + step, step)])
        except Exception as e:
            conn.down(e)
            return False
        conn.up()
        return True

    caplog.set_level(logging.INFO)
    lock = sqlite3.connect(db, timeout=30)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        assert not send(1) and not send(2)
    finally:
        lock.rollback()
        lock.close()
    time.sleep(0.1)
    assert send(4)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert [r.getMessage().startswith("MLflow unreachable") for r in caplog.records].count(True) == 1, text
    assert sum("reachable again" in r.getMessage() for r in caplog.records) == 1, text
    assert not [r for r in caplog.records if r.name.startswith(("mlflow", "sqlalchemy")) and r.levelno >= logging.ERROR], text
    assert batch.info().get("tracking_problem") is None
    assert [m.step for m in c.get_metric_history(run_id, "loss")] == [4]
