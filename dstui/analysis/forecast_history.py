"""The runs a memory forecast learns from, read straight from a local MLflow SQLite store.

`dstui run` forecasts every run's memory before it launches anything, and the
fit on earlier GPU runs comes from MLflow. Through MLflow's client that costs
``import mlflow`` (1.8-2.7 s on the 2-core box), opening the store (0.8-1 s:
SQLAlchemy, alembic's schema check), the search (0.3 s) and, at the command's
exit, tearing all those modules down again (0.7 s): about 4 s of every `dstui
run`'s start-up, for a query (issue 31). For the default store, a SQLite file,
the same rows are one read-only SQL query here (milliseconds, stdlib only):
the runs :func:`dstui.analysis.forecast.history_fit` would get from
``search_runs`` with its filter (active experiments and runs, tagged
``dstui.role = run`` and ``dstui.device = cuda``, param ``model`` equal), with
their params, tags and latest metrics.

Anything that is not plainly MLflow's schema as known here (a table or column
missing, a store with several workspaces, a locked or broken file) answers None
and the caller asks MLflow's client as before; a tracking server is always
asked through the client. tests/unit/test_forecast.py checks that both roads
give the same fit on a store MLflow itself wrote.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dstui.tracking import tags as tag_keys

#: MLflow's search_runs default and what history_fit asks for
MAX_RUNS_PER_MODEL = 5000
_CHUNK = 500  # run ids per IN (...) query: well under SQLite's variable limit
# what the query reads; a store without any of these is not read here
_NEEDED = {
    "experiments": {"experiment_id", "lifecycle_stage"},
    "runs": {"run_uuid", "experiment_id", "lifecycle_stage", "start_time"},
    "tags": {"key", "value", "run_uuid"},
    "params": {"key", "value", "run_uuid"},
    "latest_metrics": {"key", "value", "is_nan", "run_uuid"},
}


@dataclass
class HistoryRun:
    """One run as the fit reads it: what ``search_runs`` gives as ``run.data``."""

    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for anything else."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def read_runs(db: Path, models: Iterable[str]) -> list[HistoryRun] | None:
    """The GPU runs of ``models`` that history_fit's search would find, in its order; None: ask MLflow instead."""
    gpu = {tag_keys.ROLE: tag_keys.ROLE_RUN, tag_keys.DEVICE: "cuda"}
    # history_fit's filter strips quotes from the name it puts into MLflow's filter string
    return read_matching(db, [(gpu, {"model": model.replace("'", "")}) for model in sorted(set(models))])


def read_matching(db: Path, queries: Iterable[tuple[dict[str, str], dict[str, str]]]) -> list[HistoryRun] | None:
    """Runs whose tags and params equal the given values, one query each, newest first; None: ask MLflow."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    with contextlib.closing(con):
        try:
            if not _schema_known(con):
                return None
            out: list[HistoryRun] = []
            for tags, params in queries:
                out.extend(_runs_where(con, tags, params))
            return out
        except sqlite3.Error:
            return None


def _schema_known(con: sqlite3.Connection) -> bool:
    for table, columns in _NEEDED.items():
        have = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
        if not columns <= have:
            return False
    workspaces = {row[1] for row in con.execute("PRAGMA table_info(experiments)")} & {"workspace"}
    if workspaces:  # MLflow's workspaces: which one a client sees is its business
        n = con.execute("SELECT COUNT(DISTINCT workspace) FROM experiments").fetchone()[0]
        if n > 1:
            return False
    return True


_ACTIVE_RUNS = """
SELECT r.run_uuid FROM runs r JOIN experiments e ON e.experiment_id = r.experiment_id
WHERE e.lifecycle_stage = 'active' AND r.lifecycle_stage = 'active'"""
_HAS_TAG = " AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ? AND t.value = ?)"
_HAS_PARAM = " AND EXISTS (SELECT 1 FROM params p WHERE p.run_uuid = r.run_uuid AND p.key = ? AND p.value = ?)"


def _runs_where(con: sqlite3.Connection, tags: dict[str, str], params: dict[str, str]) -> list[HistoryRun]:
    query = _ACTIVE_RUNS + _HAS_TAG * len(tags) + _HAS_PARAM * len(params)
    query += f"\nORDER BY r.start_time DESC, r.run_uuid ASC\nLIMIT {MAX_RUNS_PER_MODEL}"
    bound = [x for pair in [*tags.items(), *params.items()] for x in pair]
    ids = [row[0] for row in con.execute(query, bound)]
    runs = {i: HistoryRun() for i in ids}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        marks = ",".join("?" * len(chunk))
        for key, value, run in con.execute(
            f"SELECT key, value, run_uuid FROM params WHERE run_uuid IN ({marks})", chunk
        ):  # noqa: S608
            runs[run].params[key] = value
        for key, value, run in con.execute(
            f"SELECT key, value, run_uuid FROM tags WHERE run_uuid IN ({marks})", chunk
        ):  # noqa: S608
            runs[run].tags[key] = value
        query = (
            f"SELECT key, value, is_nan, run_uuid FROM latest_metrics WHERE run_uuid IN ({marks})"  # noqa: S608
        )
        for key, value, is_nan, run in con.execute(query, chunk):
            runs[run].metrics[key] = math.nan if is_nan else float(value)
    return [runs[i] for i in ids]
