"""The MLflow client dstui writes and reads through: store, experiments, runs, batched values.

What dstui's runs look like (batch run, run per RunSpec, tags, names and units, ends) is
:mod:`dstui.tracking.layout`, which writes through this module; only the supervisor, the
importer and reports write. Metrics go through
``log_batch`` in chunks of at most 1000 values with the record's own
timestamp: MLflow's SQL store ignores an identical (key, step, timestamp,
value) row, so re-sending after a crash cannot duplicate a point.
mlflow is imported lazily: the TUI must start without it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstui.core import paths
from dstui.tracking import sqlite_store, staging
from dstui.tracking import tags as tag_keys

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

MAX_BATCH = 1000
MAX_PARAM_LEN = 6000
MAX_PARAMS_PER_CALL = 100


def _quiet_mlflow() -> None:
    """MLflow's INFO lines ("Creating initial MLflow database tables...") kept out of dstui's output.

    After the import: importing mlflow configures its loggers and sets them to INFO
    again, so levels set before it are lost (the first command on a new store
    printed that line on stderr).
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import logging

    import mlflow  # noqa: F401 - configures the loggers set below

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def client(uri: str | None = None) -> MlflowClient:
    """MLflow's client for ``uri`` (default: this home's); a local SQLite store is made whole first (sqlite_store)."""
    _quiet_mlflow()
    from mlflow import MlflowClient

    uri = uri or paths.tracking_uri()
    sqlite_store.ensure_store(uri)
    use_wal(uri)
    return MlflowClient(tracking_uri=uri)


_WAL_DONE: set[str] = set()


def forget_wal(uri: str | None) -> None:
    """Forget that a store was put in WAL mode: a store deleted and made again at its path is a new file."""
    _WAL_DONE.discard(uri or "")


def use_wal(uri: str) -> bool:
    """Put a local SQLite store in write-ahead-log mode (once; the mode is kept in the file).

    In SQLite's default rollback-journal mode every MLflow transaction costs
    several fsyncs (journal, database, directory) and blocks readers. While runs
    are live the supervisor commits every couple of seconds on the disk the
    training job logs to, and the TUI and reports read the same file. WAL makes
    a commit one fsync of the log and lets readers go on beside the writer.
    Best effort: a store that cannot switch (read-only, a network file system)
    stays as it is.
    """
    path = sqlite_store.sqlite_path(uri)
    if path is None or uri in _WAL_DONE or not path.is_file():  # never a new empty file: sqlite_store makes stores
        return False
    import sqlite3

    _WAL_DONE.add(uri)
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=10)) as con:
            mode = con.execute("PRAGMA journal_mode=WAL").fetchone()
        return bool(mode) and str(mode[0]).lower() == "wal"
    except (OSError, sqlite3.Error):
        return False


# MLflow's UI shows a page in its GenAI layout (traces, evaluations) unless the address says otherwise;
# every link dstui gives carries this, and the experiment's kind (below) points its own page there too
UI_MODE = "workflowType=machine_learning"
# MLflow's UI opens an experiment without this tag in its GenAI layout (traces, evaluations, judges)
# and guesses later; training runs belong in its model-training layout from the first visit.
EXPERIMENT_KIND = (tag_keys.EXPERIMENT_KIND, "custom_model_development")


def ensure_experiment(c: MlflowClient, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        if EXPERIMENT_KIND[0] not in (exp.tags or {}):  # older experiments; a kind the user chose stays
            with contextlib.suppress(Exception):
                c.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    if c.tracking_uri.startswith("sqlite:"):
        location = f"{paths.artifact_root()}/{name}"
    try:
        return c.create_experiment(name, artifact_location=location, tags=dict([EXPERIMENT_KIND]))
    except Exception:  # another process created it first
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def literal(value: Any) -> str | None:
    """A string literal for an MLflow filter, or None when none can hold the value.

    MLflow's filter parser takes backslashes as they are and has no escape for
    quotes: a value with a ' goes in double quotes, one with both kinds cannot
    be written at all.
    """
    text = str(value)
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return None


def find_run(c: MlflowClient, experiment_id: str, tags: dict[str, Any]) -> Any | None:
    """The first run of the experiment whose tags equal all of these, or None."""
    parts = []
    for key, value in tags.items():
        lit = literal(value)
        if lit is None:
            return None
        parts.append(f"tags.`{key}` = {lit}")
    found = c.search_runs([experiment_id], filter_string=" and ".join(parts), max_results=1)
    return found[0] if found else None


def value_text(v: Any) -> str:
    """One spelling for every param and tag value: strings as they are, everything else as JSON.

    So a boolean is ``true`` wherever it comes from (settings, ds_config, imported logs), and a
    filter or a report comparing params never meets ``True`` next to ``true``.
    """
    if isinstance(v, str):
        return v
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return str(v)


def create_run(
    c: MlflowClient,
    experiment_id: str,
    name: str,
    *,
    tags: dict[str, str],
    parent_id: str | None = None,
    start_time: float | None = None,
) -> str:
    """A run whose start is ``start_time`` (epoch seconds) when given, not the moment of this call.

    A supervisor may create the run late (the store was down) or again (a batch
    replayed into another store); the run's own launch time keeps reports of
    both stores the same.
    """
    tags = {k: value_text(v) for k, v in tags.items() if v is not None}
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    start_ms = int(start_time * 1000) if start_time else None
    run = c.create_run(experiment_id, run_name=name, tags=tags, start_time=start_ms)
    return run.info.run_id


def log_params(c: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [
        Param(k, value_text(v)[:MAX_PARAM_LEN]) for k, v in sorted(params.items()) if v is not None
    ]
    for i in range(0, len(items), MAX_PARAMS_PER_CALL):
        c.log_batch(run_id, params=items[i : i + MAX_PARAMS_PER_CALL])


def set_tags(c: MlflowClient, run_id: str, tags: dict[str, Any]) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(k, value_text(v)[:MAX_PARAM_LEN]) for k, v in tags.items() if v is not None]
    for i in range(0, len(items), MAX_PARAMS_PER_CALL):
        c.log_batch(run_id, tags=items[i : i + MAX_PARAMS_PER_CALL])


def log_metrics(c: MlflowClient, run_id: str, points: Iterable[tuple[str, float, int, int]]) -> int:
    """Send (key, value, timestamp_ms, step) points in log_batch chunks; returns the count."""
    from mlflow.entities import Metric

    batch: list[Metric] = []
    n = 0
    for key, value, ts, step in points:
        batch.append(Metric(key, value, ts, step))
        if len(batch) == MAX_BATCH:
            c.log_batch(run_id, metrics=batch)
            n += len(batch)
            batch = []
    if batch:
        c.log_batch(run_id, metrics=batch)
        n += len(batch)
    return n


def finish(c: MlflowClient, run_id: str, status: str, end_time: float | None = None) -> None:
    """Terminate the run at ``end_time`` (epoch seconds: the job's exit) when known, else now."""
    c.set_terminated(run_id, status=status, end_time=int(end_time * 1000) if end_time else None)


def log_artifacts(c: MlflowClient, run_id: str, folder: Path, artifact_path: str = "run") -> list[str]:
    """Upload the run folder's own files, bounded, never through a link (:mod:`dstui.tracking.staging`);
    never anything whose name looks secret. The files left out, each a problem in words."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / folder.name
        staged.mkdir()
        problems = staging.stage_folder(folder, staged)
        c.log_artifacts(run_id, str(staged), artifact_path=artifact_path)
    return problems


def log_file_artifact(c: MlflowClient, run_id: str, path: Path, artifact_path: str | None = None) -> str | None:
    """Upload one file as :func:`log_artifacts` does; the problem when it was left out."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / path.name
        problem = staging.stage_file(path, staged)
        if problem is None and staged.exists():
            c.log_artifact(run_id, str(staged), artifact_path=artifact_path)
    return problem


def log_report(c: MlflowClient, run_id: str, folder: Path, artifact_path: str = "report") -> None:
    """Upload a report folder, plus ``report.html`` at the run's top level for MLflow's preview.

    ``report/`` holds the folder as written (markdown, PNGs, CSV); MLflow's UI shows a
    markdown artifact without its images, so the page to open in MLflow is the HTML of
    :mod:`dstui.tracking.report_preview`, images inside.
    """
    import tempfile

    from dstui.tracking.report_preview import report_html

    c.log_artifacts(run_id, str(folder), artifact_path=artifact_path)
    md = folder / "report.md"
    if md.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            staged = Path(tmp) / "report.html"
            staged.write_text(report_html(md.read_text(errors="replace"), folder), encoding="utf-8")
            c.log_artifact(run_id, str(staged))


def run_ui_command(uri: str | None = None, port: int = 5000, host: str = "127.0.0.1") -> list[str]:
    """The `mlflow ui` argv for these runs, bound to loopback unless asked otherwise."""
    uri = uri or paths.tracking_uri()
    argv = ["mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    if uri.startswith("sqlite:"):
        argv += ["--default-artifact-root", paths.artifact_root()]
    return argv


def compare_url(base: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow UI's page comparing these runs (``#/compare-runs?runs=[..]&experiments=[..]``)."""
    from urllib.parse import quote

    def as_list(items: list[str]) -> str:
        return quote(json.dumps(items, separators=(",", ":")), safe="")

    return (f"{base.rstrip('/')}/#/compare-runs?runs={as_list(run_ids)}&experiments={as_list([experiment_id])}"
            f"&{UI_MODE}")  # fmt: skip


def ping(c: MlflowClient) -> bool:
    with contextlib.suppress(Exception):
        c.search_experiments(max_results=1)
        return True
    return False
