"""A local SQLite MLflow store is made whole or not at all; a half-made one is named, or remade.

MLflow makes a new SQLite store in place: its initial tables, then some forty
alembic migrations, about 7 s on a loaded machine, and SQLite runs each DDL
statement outside the migration's transaction. A process killed meanwhile (issue
40: `kill -9` of a new home's first supervisor 6-9 s after `dstui run --detach`,
5 of 11 tries) left a store that every later process failed to open (``table
label_schemas already exists``) and that `mlflow db upgrade` could not mend:
every point of every batch of that home stayed on disk for good.

So dstui never lets MLflow make a store where it will live. Under a creation lock
beside the store (``.<name>.lock``, flock: released by the kernel when its holder
dies), a new store is migrated in a temporary file in the same folder and
renamed into place only when MLflow calls its schema current: the store's path
holds a whole store or nothing, whenever the process dies. What a killed
creator left (its temporary file) is removed by the next one, under the lock.

A store not at MLflow's schema head is checked once per process
(:func:`ensure_store`): one holding no run can only be a creation cut short (a
store without runs holds nothing to lose), so it is moved aside
(``<name>.half-made-<time>``, kept, never deleted) and made again; one holding
runs is a :class:`StoreBroken`, a one-line error naming the commands that mend it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from dstui.core.errors import DstuiError

log = logging.getLogger("dstui.tracking")

SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's files beside a database, named after it
_READY: set[tuple[str, int, int]] = set()  # (path, device, inode) of stores found whole by this process


class StoreBroken(DstuiError):
    """A local MLflow store that MLflow cannot open and dstui must not remake (it holds runs)."""


def sqlite_path(uri: str | None) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI; None for a server, another database or ``:memory:``."""
    if not uri or not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def ensure_store(uri: str) -> None:
    """Make sure the SQLite store of ``uri`` is whole before MLflow opens it (nothing for other URIs).

    Missing: made atomically. Half-made without runs: moved aside and made again.
    Half-made with runs, or not a database: :class:`StoreBroken`. A store this
    process found whole once is not looked at again (one ``stat``).
    """
    path = sqlite_path(uri)
    if path is None:
        return
    if _identity(path) in _READY:
        return
    if inspect(path) != "ready":
        with creation_lock(path):
            if settle(path):
                forget(uri)  # this process's MLflow may hold an engine on the file that was set aside
    found = _identity(path)
    if found is not None:
        _READY.add(found)


def _identity(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path), st.st_dev, st.st_ino)


@contextlib.contextmanager
def creation_lock(path: Path) -> Iterator[None]:
    """One creator at a time per store, across processes (flock on ``.<name>.lock`` beside it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def inspect(path: Path) -> str:
    """``missing`` (no file, or one without a table), ``ready`` (MLflow's tables at its schema head) or ``half-made``.

    A file that is not a SQLite database is a :class:`StoreBroken`; a locked store
    raises sqlite3's error, as MLflow would (the supervisor retries later).
    """
    try:
        if path.stat().st_size == 0:
            return "missing"
    except FileNotFoundError:
        return "missing"
    tables, revision = _schema(path)
    if not tables:
        return "missing"
    from mlflow.store.db import utils as db_utils  # its import registers every MLflow table on Base

    whole = set(db_utils.Base.metadata.tables) <= tables and revision == [db_utils._get_latest_schema_revision()]
    return "ready" if whole else "half-made"


def _schema(path: Path) -> tuple[set[str], list[str] | None]:
    """(table names, alembic revisions) of a SQLite file, read without writing to it."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5)) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            revision = [r[0] for r in con.execute("SELECT version_num FROM alembic_version")] if "alembic_version" in tables else None
    except sqlite3.DatabaseError as e:
        if "not a database" not in str(e):
            raise
        raise StoreBroken(f"the MLflow store {path} is not an SQLite database; move it aside "
                          f"(`mv {path} {path}.broken`) and dstui makes a new one") from None  # fmt: skip
    return tables, revision


def settle(path: Path) -> bool:
    """Under the creation lock: leave a whole store at ``path`` (True when made now) or raise :class:`StoreBroken`."""
    drop_leftovers(path)
    state = inspect(path)
    if state == "ready":
        return False
    if state == "half-made":
        runs = _count_runs(path)
        if runs:
            raise StoreBroken(broken_message(path, runs))
        aside = set_aside(path)
        log.warning("MLflow store %s was half-made (a creation cut short; no runs in it): moved to %s and made again",
                    path, aside.name)  # fmt: skip
    create(path)
    return True


def _count_runs(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5)) as con:
            return int(con.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return 0
        raise


def experiment_of_run(path: Path, run_id: str) -> str | None:
    """The experiment id of a run in a local store, read with SQLite alone (read-only); None when not there.

    `dstui ui` names the links it prints with it: asking MLflow's client for it imported MLflow
    and opened the store, 12.8 s on a loaded machine to print two lines (issue 38.6).
    """
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=5)) as con:
            row = con.execute("SELECT experiment_id FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None


def broken_message(path: Path, runs: int) -> str:
    """One line: what is wrong with a store that holds runs, and the commands that mend it."""
    import mlflow
    from mlflow.store.db.utils import _get_latest_schema_revision

    _, revision = _schema(path)
    found = ", ".join(revision or []) or "none"
    return (f"the MLflow store {path} is half-made or older than this MLflow (schema {found}, MLflow {mlflow.__version__} "
            f"needs {_get_latest_schema_revision()}; {runs} runs in it): back it up, then `mlflow db upgrade sqlite:///{path}`; "
            f"if that fails, `mv {path} {path}.broken` and dstui makes a new one")  # fmt: skip


def set_aside(path: Path) -> Path:
    """Move a half-made store (and its WAL) to ``<name>.half-made-<time>``: kept for a look, out of the way."""
    aside = path.with_name(f"{path.name}.half-made-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    for suffix in SIDE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    os.replace(path, aside)
    return aside


def drop_leftovers(path: Path) -> None:
    """What a killed creator left (its temporary store); and the WAL of a store that is gone.

    Only under the creation lock: no creator is at work. A ``-wal`` without its
    database would be read into the next store made at that path.
    """
    for tmp in path.parent.glob(f".{path.name}.creating-*"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if not path.exists():
        for suffix in SIDE_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")


def create(path: Path) -> None:
    """Migrate a new store in a temporary file beside ``path``, then rename it into place (atomic).

    MLflow's Default experiment keeps its artifacts in ``artifacts/`` beside the store (the
    home's ``paths.artifact_root()``), not in a ``mlruns/`` of whatever folder dstui ran in.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
    tmp_uri = f"sqlite:///{tmp}"
    try:
        SqlAlchemyStore(tmp_uri, (path.parent / "artifacts").as_uri())  # MLflow's own creation: tables, migrations, its schema check, Default experiment
        engine = SqlAlchemyStore._engine_map.pop(tmp_uri, None)
        if engine is not None:
            engine.dispose()  # closed before the rename: no journal left behind under the old name
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _sync_folder(path.parent)
    finally:
        for leftover in (tmp, *(Path(f"{tmp}{s}") for s in SIDE_FILES)):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def forget(uri: str | None) -> None:
    """A store deleted or replaced: this process's MLflow drops its engine, and the store is checked at its next use.

    MLflow caches the store per URI, and one engine per URI under it; an engine
    opened on the old file would go on reading and writing that file.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service import utils

    utils._tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        with contextlib.suppress(Exception):
            engine.dispose()
    path = sqlite_path(uri)
    if path is not None:
        _READY.difference_update({k for k in _READY if k[0] == str(path)})


def close_all() -> None:
    """Close this process's MLflow database connections now (the process is about to end).

    At its last connection's close SQLite folds the write-ahead log into the store and
    removes it, so ``mlflow.db`` alone holds everything; Python's teardown does this
    too, but a process ended without it (core.quick_exit) does it here. MLflow keeps
    one engine per store URI per store class; nothing is imported to find them.
    """
    for name in ("mlflow.store.tracking.sqlalchemy_store", "mlflow.store.model_registry.sqlalchemy_store"):
        store_cls = getattr(sys.modules.get(name), "SqlAlchemyStore", None)
        for engine in list(getattr(store_cls, "_engine_map", {}).values()):
            with contextlib.suppress(Exception):  # a store gone or locked: the kernel closes it at exit
                engine.dispose()
