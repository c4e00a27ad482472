"""Plain helpers every test tier shares (no fixtures here: those live in the conftest files)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "configs" / "experiments"


def dstui(*args: str, timeout: float = 600, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "dstui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dstui {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def mlflow_client(uri: str | None = None):
    from mlflow import MlflowClient

    return MlflowClient(uri or os.environ["MLFLOW_TRACKING_URI"])
