"""`dstui ui --start` says where to look before it becomes MLflow's server (issue 38.6: it printed no link)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from helpers import batch_in_store


def test_ui_start_prints_the_links_first(home: Path) -> None:
    exp, run_id = batch_in_store(home, "started-20260101-000000")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "dstui", "ui", "--start", "--port", str(port)], cwd=home,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]  # dstui's own lines come before the server's
        text = "".join(lines)
        assert lines[0].startswith(f"starting MLflow's UI at http://127.0.0.1:{port}/#/experiments?"), text
        assert f"http://127.0.0.1:{port}/#/experiments/{exp}/runs?viewStateShareKey=" in text
        assert run_id in text
        # that the server then listens is tests/e2e/test_reliability.py's (ui --start without the venv on PATH)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
