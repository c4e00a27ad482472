"""A process ended by core.quick_exit does what an ordinary exit would, less the module teardown.

Real processes: each case runs a Python child and looks at what it left (its exit status,
its output, the files its exit handlers wrote, the store's side files).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

END = "from dstui.core import quick_exit\n"


def child(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_exit_handlers_run_output_is_flushed_and_the_status_kept(tmp_path: Path) -> None:
    code = END + (
        "import atexit, logging, sys\n"
        "logging.basicConfig(filename='log.txt', level=logging.INFO)\n"
        "atexit.register(lambda: open('handler-ran', 'w').write('yes'))\n"
        "sys.stdout.write('buffered, no newline')\n"  # a pipe: block-buffered until a flush
        "logging.info('the last line')\n"
        "quick_exit.end(7)\n"
    )
    proc = child(code, tmp_path)
    assert proc.returncode == 7
    assert proc.stdout == "buffered, no newline"
    assert (tmp_path / "handler-ran").read_text() == "yes"
    assert "the last line" in (tmp_path / "log.txt").read_text()


def test_a_running_non_daemon_thread_gets_the_ordinary_exit(tmp_path: Path) -> None:
    """Python joins such a thread before it exits; skipping that could cut its work short."""
    code = END + (
        "import threading, time\n"
        "def work():\n"
        "    time.sleep(0.5)\n"
        "    open('thread-done', 'w').write('done')\n"
        "threading.Thread(target=work).start()\n"
        "assert quick_exit.waits_for_threads()\n"
        "quick_exit.end(3)\n"
    )
    proc = child(code, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert (tmp_path / "thread-done").read_text() == "done"


@pytest.mark.e2e  # three processes that import MLflow (~2 CPU-s each): not for the fast loop
def test_the_store_is_whole_in_its_file_after_a_quick_exit(tmp_path: Path, empty_db: Path) -> None:
    """close_all before the exit: SQLite folds its write-ahead log into mlflow.db, as an ordinary exit did."""
    db = tmp_path / "mlflow.db"
    write = (
        "from dstui.tracking import client, sqlite_store\n"
        f"c = client.client('sqlite:///{db}')\n"
        "run = c.create_run('0')\n"
        "c.log_metric(run.info.run_id, 'loss', 1.5)\n"
        "print(run.info.run_id)\n"
    )
    for close, leaves in ((False, {"mlflow.db", "mlflow.db-wal", "mlflow.db-shm"}), (True, {"mlflow.db"})):
        shutil.copy(empty_db, db)
        for side in tmp_path.glob("mlflow.db-*"):
            side.unlink()
        proc = child(END + write + ("sqlite_store.close_all()\n" if close else "") + "quick_exit.end(0)\n", tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert {p.name for p in tmp_path.iterdir() if p.name.startswith("mlflow.db")} == leaves
    # what was written is in mlflow.db alone
    only = tmp_path / "copy"
    only.mkdir()
    shutil.copy(db, only / "mlflow.db")
    read = f"from mlflow import MlflowClient\nprint(MlflowClient('sqlite:///{only / 'mlflow.db'}').get_run('{proc.stdout.strip()}').data.metrics)\n"
    assert child(read, tmp_path).stdout.strip() == "{'loss': 1.5}"
