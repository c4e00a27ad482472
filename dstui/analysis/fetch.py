"""Reading runs and their per-step histories out of MLflow.

:func:`fetch_runs` finds a batch's (or experiment's) child runs;
:func:`fetch_histories` fills every run's per-step metrics, through a fast
SQL path when the store is a database and MLflow's public API otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dstui.analysis.rundata import (
    SUMMARY_PREFIX,
    SYSTEM_PREFIX,
    Progress,
    ReportError,
    RunData,
    run_from_mlflow,
)
from dstui.tracking import client as tracking
from dstui.tracking import metric_names
from dstui.tracking import tags as tag_keys


def fetch_runs(
    client: Any,
    experiment: str,
    *,
    batch: str | None = None,
    run_ids: Sequence[str] | None = None,
) -> tuple[Any, list[RunData]]:
    """The experiment and its dstui child runs (optionally one batch or given ids).

    Explicit ``run_ids`` are taken as they are (they need not carry the role
    tag, so hand-made runs can be compared too); otherwise runs tagged
    ``dstui.role='run'`` are searched, paging through all of them.
    """
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ReportError(f"no MLflow experiment named '{experiment}'")
    runs: list[Any] = []
    if run_ids:
        for rid in run_ids:
            try:
                runs.append(client.get_run(rid))
            except Exception as e:  # MlflowException: unknown id
                raise ReportError(f"no MLflow run '{rid}': {e}") from None
    else:
        filt = tag_keys.RUN_FILTER
        if batch:
            lit = tracking.literal(batch)
            if lit is None:
                raise ReportError(f"batch id {batch!r} holds both kinds of quote; MLflow cannot filter on it")
            filt += f" and {tag_keys.search(tag_keys.BATCH)} = {lit}"
        token = None
        while True:
            page = client.search_runs(
                [exp.experiment_id], filter_string=filt, max_results=1000, page_token=token
            )
            runs.extend(page)
            token = getattr(page, "token", None)
            if not token:
                break
    if not runs:
        what = f"batch '{batch}'" if batch else f"experiment '{experiment}'"
        raise ReportError(f"no dstui runs in {what} (child runs tagged dstui.role=run)")
    data = [run_from_mlflow(r) for r in runs]
    if not run_ids:  # runs picked by id are the user's choice, earlier attempts included
        data = newest_attempts(data)
    data.sort(key=lambda r: (r.batch, _order_of(r), r.start_time or 0, r.run_name))
    return exp, data


def newest_attempts(runs: list[RunData]) -> list[RunData]:
    """Each run folder's newest attempt only; runs without the folder tag (imported, hand-made) all stay.

    A run queued again (retry, resume) gets a new MLflow child per attempt and
    the earlier ones stay for the record. Counted together they would make one
    run two repeats of its condition, and put a failure beside its own fix.
    """
    newest: dict[str, tuple[int, RunData]] = {}
    kept: list[RunData] = []
    for run in runs:
        folder, n = tag_keys.run_attempt(run.tags)
        if n is None:
            kept.append(run)
            continue
        if folder not in newest or n > newest[folder][0]:
            newest[folder] = (n, run)
    return kept + [run for _, run in newest.values()]


def _order_of(run: RunData) -> int:
    """Launch order when recorded (tag dstui.order), else repeat: keeps conditions in spec order."""
    try:
        return int(run.tags.get(tag_keys.ORDER, ""))
    except ValueError:
        return run.repeat


def find_batch_parent(client: Any, experiment_id: str, batch: str) -> Any | None:
    """The batch's parent run (tags dstui.role=batch, dstui.batch=ID), if any."""
    return tracking.find_run(client, experiment_id, {tag_keys.ROLE: tag_keys.ROLE_BATCH, tag_keys.BATCH: batch})


_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def fetch_histories(
    client: Any,
    tracking_uri: str,
    runs: Sequence[RunData],
    *,
    progress: Progress | None = None,
) -> str:
    """Fill ``run.history`` for every run; returns the method used.

    MLflow's ``get_metric_history`` builds one ORM object per value (about
    30 us each here), which for 50 runs x 10,000 steps x 6 metrics is over a
    minute. When the tracking store is a database, one plain SELECT over
    MLflow's ``metrics`` table through SQLAlchemy reads the same rows at about
    1 us each. Any failure there (an unexpected schema, a server URI) falls
    back to the public API, so results never depend on the fast path.
    """
    if not runs:
        return "none"
    scheme = tracking_uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme == "sqlite":
        try:
            _histories_sqlite(tracking_uri, runs)
            return "sqlite"
        except Exception:  # noqa: BLE001 - any problem: try the generic paths
            pass
    if scheme in _DB_SCHEMES:
        try:
            _histories_sql(tracking_uri, runs)
            return "sql"
        except Exception:  # noqa: BLE001 - any problem: use the public API instead
            pass
    _histories_api(client, runs, progress=progress)
    return "api"


def _wanted_key(key: str) -> bool:
    return not key.startswith(SYSTEM_PREFIX) and not key.startswith(SUMMARY_PREFIX)


def _history_keys(run: RunData) -> list[str]:
    """The MLflow names of the run's step metrics (the names :func:`run_from_mlflow` read them under)."""
    names = run.mlflow_keys.values() if run.mlflow_keys else run.metrics
    return [k for k in names if _wanted_key(k)]


def _keep(run: RunData, mlflow_key: str, steps: Any, values: Any) -> None:
    """One metric's history on the run, under the name and in the unit records use (bytes, ``time/*``)."""
    key, values = metric_names.from_mlflow(mlflow_key, values)
    run.history[key] = (steps, values)


def _histories_sql(tracking_uri: str, runs: Sequence[RunData]) -> None:
    import numpy as np
    import pandas as pd
    import sqlalchemy as sa

    engine = sa.create_engine(tracking_uri)
    ids = [r.run_id for r in runs]
    frames = []
    try:
        with engine.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                stmt = sa.text(
                    "SELECT run_uuid, key, step, value, is_nan, timestamp FROM metrics "
                    "WHERE run_uuid IN :ids AND key NOT LIKE 'system/%' AND key NOT LIKE 'summary.%'"
                ).bindparams(sa.bindparam("ids", expanding=True))
                rows = conn.execute(stmt, {"ids": chunk}).fetchall()
                if rows:
                    frames.append(
                        pd.DataFrame.from_records(
                            rows, columns=["run_id", "key", "step", "value", "is_nan", "ts"]
                        )
                    )
    finally:
        engine.dispose()
    by_run = {r.run_id: r for r in runs}
    for r in runs:
        r.history = {}
    if not frames:
        return
    df = pd.concat(frames, ignore_index=True)
    df["value"] = df["value"].astype("float64")
    nan_mask = df["is_nan"].astype(bool).to_numpy()
    if nan_mask.any():
        df.loc[nan_mask, "value"] = np.nan
    # A value logged twice at one step (a resumed ingestion): the newest wins.
    df = df.sort_values(["run_id", "key", "step", "ts"], kind="stable")
    df = df.drop_duplicates(["run_id", "key", "step"], keep="last")
    for (rid, key), g in df.groupby(["run_id", "key"], sort=False):
        _keep(by_run[rid], key, g["step"].to_numpy(dtype="int64"), g["value"].to_numpy(dtype="float64"))


_STEP_OFFSET = 1 << 38  # packed rows: (key code << 40) | (is_nan << 39) | (step + offset)


def _histories_sqlite(tracking_uri: str, runs: Sequence[RunData]) -> None:
    """SQLite fast path: two numbers per row, read by two threads.

    Turning rows into Python objects is the cost (SQLite itself scans 3.5 M
    rows in under a second), so the key, NaN flag and step are packed into
    one integer in SQL and the rows go straight into a numpy record array.
    Rows come in insertion order (the run_uuid index keeps rowid order), so
    a value logged twice at one step is resolved as "the last write wins".
    sqlite3 releases the GIL while stepping, hence the second thread.
    """
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from sqlalchemy.engine import make_url

    db = make_url(tracking_uri).database
    if not db:
        raise ValueError("in-memory SQLite store")
    keys = sorted({k for r in runs for k in _history_keys(r)})
    klist = "|" + "|".join(keys) + "|"
    query = (
        "SELECT (instr(?1, '|' || key || '|') << 40) + (is_nan << 39) + (step + ?2), value "
        "FROM metrics WHERE run_uuid = ?3 AND instr(?1, '|' || key || '|') > 0"
    )
    dtype = np.dtype([("p", "i8"), ("v", "f8")])
    uri = Path(db).resolve().as_uri() + "?mode=ro"

    def load(run: RunData) -> tuple[RunData, dict[str, tuple[Any, Any]]]:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        try:
            arr = np.fromiter(conn.execute(query, (klist, _STEP_OFFSET, run.run_id)), dtype=dtype)
        finally:
            conn.close()
        packed, values = arr["p"], arr["v"].copy()
        codes = packed >> 40
        nan = ((packed >> 39) & 1).astype(bool)
        steps = (packed & ((1 << 39) - 1)) - _STEP_OFFSET
        values[nan] = np.nan
        order = np.lexsort((steps, codes))  # stable: equal (key, step) keep write order
        codes, steps, values = codes[order], steps[order], values[order]
        last = np.ones(len(codes), dtype=bool)
        if len(codes) > 1:
            last[:-1] = (codes[1:] != codes[:-1]) | (steps[1:] != steps[:-1])
        codes, steps, values = codes[last], steps[last], values[last]
        out: dict[str, tuple[Any, Any]] = {}
        if len(codes):
            bounds = np.flatnonzero(np.diff(codes)) + 1
            starts = np.r_[0, bounds]
            ends = np.r_[bounds, len(codes)]
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
                pos = int(codes[a])
                key = klist[pos : klist.index("|", pos)]
                out[key] = (steps[a:b], values[a:b])
        return run, out

    if not Path(db).is_file():
        raise FileNotFoundError(db)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for run, hist in pool.map(load, runs):
            run.history = {}
            for key, (steps, values) in hist.items():
                _keep(run, key, steps, values)


def _histories_api(client: Any, runs: Sequence[RunData], *, progress: Progress | None) -> None:
    """Public-API path: one get_metric_history per run and key, a few in parallel (servers)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    jobs = [(r, k) for r in runs for k in _history_keys(r)]
    for r in runs:
        r.history = {}

    def load(job: tuple[RunData, str]) -> tuple[RunData, str, Any, Any]:
        run, key = job
        hist = client.get_metric_history(run.run_id, key)
        latest: dict[int, tuple[int, float]] = {}
        for m in hist:
            prev = latest.get(m.step)
            if prev is None or m.timestamp >= prev[0]:
                latest[m.step] = (m.timestamp, m.value)
        steps = np.array(sorted(latest), dtype="int64")
        values = np.array([latest[s][1] for s in steps.tolist()], dtype="float64")
        return run, key, steps, values

    with ThreadPoolExecutor(max_workers=4) as pool:
        for i, (run, key, steps, values) in enumerate(pool.map(load, jobs)):
            _keep(run, key, steps, values)
            if progress and jobs and i % 20 == 0:
                progress(0.1 + 0.5 * i / len(jobs), f"metric history {i}/{len(jobs)}")


def read_artifact(run: RunData, rel: str) -> str:
    """A text artifact of the run ('' when missing): local stores directly, others through MLflow."""
    from urllib.parse import unquote, urlparse

    try:
        parsed = urlparse(run.artifact_uri)
        if parsed.scheme in ("", "file"):
            p = Path(unquote(parsed.path)) / rel
            return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else ""
        import mlflow.artifacts

        local = mlflow.artifacts.download_artifacts(run_id=run.run_id, artifact_path=rel)
        return Path(local).read_text(encoding="utf-8", errors="replace")
    except Exception:  # noqa: BLE001 - a missing command is reported as such, not fatal
        return ""
