"""Where dstui keeps its state.

Everything is relative to a *home* folder (the current directory unless
``DSTUI_HOME`` says otherwise) so that a TUI started later in the same place
finds the runs a CLI launched earlier.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # dstui/
REPO_DIR = PACKAGE_DIR.parent


def _shipped(name: str) -> Path:
    """A checkout's top-level folder, else the copy a regular install carries (see setup.py)."""
    in_checkout = REPO_DIR / name
    if (REPO_DIR / "pyproject.toml").is_file() and in_checkout.is_dir():
        return in_checkout
    return PACKAGE_DIR / "bundled" / name


CONFIGS_DIR = _shipped("configs")
RUNNERS_DIR = _shipped("runners")


def home() -> Path:
    return Path(os.environ.get("DSTUI_HOME", os.getcwd())).resolve()


def runs_dir() -> Path:
    return Path(os.environ.get("DSTUI_RUNS_DIR", home() / "runs")).resolve()


def mlruns_dir() -> Path:
    return home() / "mlruns"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI wins (a team server); else a SQLite store in ./mlruns.

    MLflow >= 3.13 refuses the bare ``./mlruns`` file store, hence SQLite.
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    d = mlruns_dir()
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'mlflow.db'}"


def artifact_root() -> str:
    return (mlruns_dir() / "artifacts").as_uri()


def cache_dir() -> Path:
    return Path(os.environ.get("DSTUI_CACHE", Path.home() / ".cache" / "dstui")).resolve()
