"""Shared fixtures: every test gets its own dstui home and MLflow store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "configs" / "experiments"


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty MLflow SQLite store; copying it saves ~5 s of migrations per test."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated DSTUI_HOME with its own SQLite MLflow store."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("DSTUI_HOME", str(h))
    monkeypatch.delenv("DSTUI_RUNS_DIR", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{h}/mlruns/mlflow.db")
    (h / "mlruns").mkdir()
    monkeypatch.chdir(h)
    return h


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
