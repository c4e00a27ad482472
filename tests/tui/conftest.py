"""Fixtures of the TUI tests: an isolated home and MLflow store, anyio on asyncio."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


@pytest.fixture
def tui_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DSTUI_HOME and MLflow in a temp dir; local times in UTC."""
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path))
    monkeypatch.delenv("DSTUI_RUNS_DIR", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
