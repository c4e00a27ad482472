"""The supervisor's connection to the MLflow store: connect, notice trouble, retry later.

Tolerant of a store that is unreachable: every call that fails marks the store
down for a few seconds (:meth:`StoreConnection.down`); callers get ``None`` and
keep their points on disk for a later pass. One episode of trouble (from the first
failure to the next successful write, :meth:`StoreConnection.up`) is one line in
supervisor.log; MLflow's own SQLAlchemy tracebacks of it are kept out
(:func:`quiet_store_tracebacks`). A local SQLite store deleted under a
live connection is noticed (:meth:`StoreConnection.store_vanished`) so that
nothing is written into the unlinked file.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from dstui.core.credential_text import strip_credentials
from dstui.core.rundir import BatchDir
from dstui.tracking import client as tracking
from dstui.tracking import sqlite_store
from dstui.tracking.sqlite_store import StoreBroken, sqlite_path  # noqa: F401 - sqlite_path re-exported (sink)

log = logging.getLogger("dstui.execute.supervisor")

RETRY_AFTER_S = 5.0  # the first wait after a failed call; doubled per failure in a row, up to RETRY_MAX_S
RETRY_MAX_S = 30.0
RETRY_JITTER = 0.2  # +-20%: supervisors of many batches do not retry against one server in step


class StoreConnection:
    """One batch's MLflow client and experiment; says in batch.json when the store is down."""

    def __init__(self, batch: BatchDir, tracking_uri: str | None) -> None:
        self.batch = batch
        self.info = batch.info()
        self.tracking_uri = tracking_uri or resolve_uri(self.info.get("tracking_uri"))
        self._client: Any = None
        self.error: str | None = None
        self._retry_at = 0.0
        self._failures = 0  # failed calls since the last one that went through (the back-off's exponent)
        self._store_id: tuple[int, int] | None = None
        self.experiment_id: str | None = None
        quiet_store_tracebacks()

    def client(self) -> Any:
        if self._client is None and time.time() >= self._retry_at:
            try:
                c = tracking.client(self.tracking_uri)
                self.experiment_id = tracking.ensure_experiment(c, self.info["experiment"])
                self._client = c
                self._store_id = _file_id(self.tracking_uri)
            except Exception as e:
                self.down(e)
        return self._client

    def down(self, e: Exception) -> None:
        """A call failed: retry in a few seconds. Said once per episode (until :meth:`up`)."""
        detail = strip_credentials(str(e).splitlines()[0] if str(e) else "")[:200]
        msg = f"MLflow unreachable ({type(e).__name__}: {detail}); metrics stay on disk and are sent later"
        if self.error is None:
            log.warning(msg)
            # a broken store is said as it is, with the commands that mend it: waiting does not
            self.report(str(e) if isinstance(e, StoreBroken) else "MLflow unreachable; metrics stay in the run folders and are sent later")
            self.error = msg
        self._client = None
        self._retry_at = time.time() + self.backoff_s()
        self._failures += 1

    def backoff_s(self) -> float:
        """The wait before the next try: 5 s, then doubling while the store keeps failing, at most 30 s."""
        import random

        wait = min(RETRY_AFTER_S * 2 ** min(self._failures, 8), RETRY_MAX_S)
        return wait * (1 + RETRY_JITTER * (2 * random.random() - 1))

    def up(self) -> None:
        """A write went through: the episode of trouble, if any, is over."""
        self._failures = 0
        if self.error is not None:
            log.info("MLflow reachable again; held-back metrics are being sent")
            self.error = None
            self.report(None)

    def report(self, problem: str | None) -> None:
        """What `dstui status`, `dstui run` and the TUI show about the store (batch.json)."""
        if self.batch.info().get("tracking_problem") != problem:
            self.info = self.batch.update_info(tracking_problem=problem)

    def store_vanished(self) -> bool:
        """True once when a local SQLite store was deleted (or replaced) under a live connection.

        SQLite keeps writing to the unlinked file, so without this every point sent
        after an ``rm mlruns/mlflow.db`` would be lost without a word.
        """
        if self._client is None or self._store_id is None or _file_id(self.tracking_uri) == self._store_id:
            return False
        log.error("MLflow store deleted (%s): re-creating it and re-sending every point from the run folders",
                  strip_credentials(str(self.tracking_uri)))  # fmt: skip
        forget_sqlite_store(self.tracking_uri)
        self._client = None
        self._store_id = None
        self.info = self.batch.update_info(
            mlflow_parent_run_id=None,
            tracking_problem=None,
            tracking_note=f"MLflow store deleted at {time.strftime('%H:%M:%S')}; points re-sent from the run folders",
        )
        return True


class _NoStoreTracebacks(logging.Filter):
    """Drops MLflow's own "SQLAlchemy database error" records (a traceback of ~85 lines per failed
    call while the store is locked); :meth:`StoreConnection.down` says it in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def quiet_store_tracebacks() -> None:
    """Keep MLflow's SQL store error tracebacks out of this process's log (once per process)."""
    logger = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _NoStoreTracebacks) for f in logger.filters):
        logger.addFilter(_NoStoreTracebacks())


def _file_id(uri: str | None) -> tuple[int, int] | None:
    """(device, inode) of a local SQLite store: changes when the file is deleted or replaced."""
    path = sqlite_path(uri)
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return (st.st_dev, st.st_ino)


def forget_sqlite_store(uri: str | None) -> None:
    """Drop MLflow's cached engine for a store (it would go on writing to a deleted file)."""
    sqlite_store.forget(uri)
    tracking.forget_wal(uri)


def resolve_uri(recorded: str | None) -> str | None:
    """batch.json keeps the tracking URI without credentials; the environment has the full one."""
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if env_uri and recorded and strip_credentials(env_uri) == recorded:
        return env_uri
    return recorded
