"""Where dstui keeps its state.

Everything is relative to one *home* folder: run folders in ``<home>/runs``, the
MLflow SQLite store in ``<home>/mlruns`` beside them, library warnings in
``<home>/logs``. The home is, first match wins (:func:`home_choice`):

1. ``DSTUI_HOME`` when set;
2. a project's own home: the nearest folder, from the current one up, whose
   ``runs/`` holds a dstui batch (a folder with ``batch.json``: a bare ``runs/``
   may be TensorBoard's);
3. the user's home for dstui, ``$XDG_DATA_HOME/dstui`` (``~/.local/share/dstui``):
   run folders and the store are results kept for later (XDG *data*), not state.

So a user who reconnects over SSH and starts ``dstui status`` in another folder
sees the same runs, and a TUI started later finds what a CLI launched earlier.
``DSTUI_RUNS_DIR`` moves the run folders alone (tests, benchmarks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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


HOME_ENV = "DSTUI_HOME"


@dataclass(frozen=True)
class HomeChoice:
    """The home in use and why: what `dstui status` and the TUI's header say."""

    path: Path
    source: str  # "DSTUI_HOME", "project" (a runs/ found from the current folder up) or "default"

    def describe(self) -> str:
        why = {
            "DSTUI_HOME": "set by DSTUI_HOME",
            "project": "this project's runs/, found from the current folder up",
            "default": "the default home; DSTUI_HOME or a project's runs/ take precedence",
        }[self.source]
        return f"{runs_dir()} ({why})"


def _project_home(start: Path) -> Path | None:
    """The nearest folder from ``start`` up whose runs/ holds a dstui batch."""
    for folder in (start, *start.parents):
        runs = folder / "runs"
        try:
            if runs.is_dir() and any((child / "batch.json").is_file() for child in runs.iterdir()):
                return folder
        except OSError:  # unreadable: not ours
            continue
    return None


def default_home() -> Path:
    """``$XDG_DATA_HOME/dstui``, i.e. ``~/.local/share/dstui`` unless XDG_DATA_HOME says otherwise."""
    data = os.environ.get("XDG_DATA_HOME") or ""
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local" / "share"  # the spec ignores relative ones
    return base / "dstui"


def home_choice() -> HomeChoice:
    env = os.environ.get(HOME_ENV)
    if env:
        return HomeChoice(Path(env).resolve(), "DSTUI_HOME")
    try:
        cwd = Path(os.getcwd())
    except OSError:  # the current folder was removed
        cwd = None
    project = _project_home(cwd) if cwd is not None else None
    if project is not None:
        return HomeChoice(project.resolve(), "project")
    return HomeChoice(default_home().resolve(), "default")


def home() -> Path:
    return home_choice().path


def home_label(*, implicit_only: bool = False) -> str:
    """A short line for the TUI's header: where the runs are (no temp paths for DSTUI_HOME).

    ``implicit_only``: "" when the user chose the home with DSTUI_HOME (they know it);
    the header speaks when dstui chose it (a project's runs/ or the default).
    """
    choice = home_choice()
    if choice.source == "DSTUI_HOME":
        return "" if implicit_only else "runs: $DSTUI_HOME/runs"
    where = str(runs_dir())
    user = str(Path.home())
    if where.startswith(user + os.sep):
        where = "~" + where[len(user):]
    return f"runs: {where}"


def logs_dir() -> Path:
    """Where library warnings (DeepSpeed, torch) go instead of the terminal."""
    return home() / "logs"


def runs_dir() -> Path:
    return Path(os.environ.get("DSTUI_RUNS_DIR", home() / "runs")).resolve()


def mlruns_dir() -> Path:
    return home() / "mlruns"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI wins (a team server); else a SQLite store in <home>/mlruns, beside the runs.

    MLflow >= 3.13 refuses the bare ``./mlruns`` file store, hence SQLite. Naming it makes
    nothing: the store is made (whole, atomically) at its first use, by dstui.tracking.sqlite_store.
    """
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{mlruns_dir() / 'mlflow.db'}"


def artifact_root() -> str:
    return (mlruns_dir() / "artifacts").as_uri()


def cache_dir() -> Path:
    return Path(os.environ.get("DSTUI_CACHE", Path.home() / ".cache" / "dstui")).resolve()
