"""Shared fixtures: every test gets its own dstui home and MLflow store.

Tiers by folder: ``unit/`` (no process launched unless marked e2e), ``tui/`` (Textual Pilot and
snapshots), ``e2e/`` (real processes: supervisors, DeepSpeed). Everything under ``e2e/`` is
marked ``e2e`` here, so ``pytest -m "not e2e"`` is the fast inner loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest

E2E_DIR = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)


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
    monkeypatch.setenv("DSTUI_PRIVATE_DIR", str(tmp_path / "private"))  # real env values: outside the home
    monkeypatch.delenv("DSTUI_RUNS_DIR", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{h}/mlruns/mlflow.db")
    (h / "mlruns").mkdir()
    monkeypatch.chdir(h)
    return h
