"""Makes MLflow stores on request, each in a forked child that a test may kill at any instant.

The first store of a home is made by whichever dstui process opens it first, most
often a batch's supervisor (``StoreConnection.client``: ``tracking.client(uri)`` and
``tracking.ensure_experiment``). This program runs exactly those two calls in a
forked child per request, so a try costs the store's creation alone: MLflow and
dstui are imported once, here, not once per try (6 s of imports on a loaded machine).

Protocol: the test writes ``URI``; this prints ``pid PID`` as the child starts; the test
writes ``reap`` (after killing it, or not); this prints ``exit CODE SECONDS`` (``CODE`` -9
when killed). The child is reaped only after ``reap``, so a kill never reaches a reused pid.
``--mode mlflow`` makes the store the way MLflow does by itself (in place, no lock):
the behaviour dstui had before, for the benchmark's comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dstui.tracking import client as tracking
from dstui.tracking import sqlite_store  # noqa: F401 - imported before the fork, as in a supervisor


def create(uri: str, mode: str) -> None:
    if mode == "mlflow":
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        SqlAlchemyStore(uri, "file:///tmp/unused-artifacts")
        return
    c = tracking.client(uri)
    tracking.ensure_experiment(c, "store-creation")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("dstui", "mlflow"), default="dstui")
    args = ap.parse_args()
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - MLflow's store code, loaded before any fork

    print("ready", flush=True)
    for line in sys.stdin:
        uri = line.strip()
        if not uri:
            continue
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            try:
                create(uri, args.mode)
            except BaseException as e:  # noqa: BLE001 - the child reports and leaves, whatever happened
                print(f"child error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                os._exit(1)
            os._exit(0)
        print(f"pid {pid}", flush=True)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, and left unreaped: its pid stays its own
        lived = time.perf_counter() - start
        sys.stdin.readline()  # the test's "reap", sent after any kill: a kill never meets a reused pid
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)} {lived:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ---- the test's side: drive this program, judge a store with MLflow's own checks ----


class Creator:
    """This program in a subprocess: ``make(uri, kill_after)`` makes a store, killing its child after ``kill_after`` s."""

    def __init__(self, mode: str = "dstui", env: dict[str, str] | None = None) -> None:
        import subprocess

        self.proc = subprocess.Popen([sys.executable, __file__, "--mode", mode], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"store_creator ended (exit {self.proc.wait()})")
        return line.strip()

    def make(self, uri: str, kill_after: float | None = None) -> tuple[int, float]:
        """(exit code of the child, -9 when the kill came first; seconds it lived)."""
        import signal

        assert self.proc.stdin is not None
        self.proc.stdin.write(uri + "\n")
        self.proc.stdin.flush()
        pid = int(self._line().split()[1])
        if kill_after is not None:
            time.sleep(kill_after)
            os.kill(pid, signal.SIGKILL)  # a child that has ended is a zombie until "reap": the kill is a no-op
        self.proc.stdin.write("reap\n")
        self.proc.stdin.flush()
        _, code, seconds = self._line().split()
        return int(code), float(seconds)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def store_state(path: str) -> str:
    """``none`` (no file: a fresh home), ``whole`` (MLflow opens it as it is) or ``broken``, by MLflow's own checks."""
    import sqlalchemy
    from mlflow.store.db import utils

    if not os.path.exists(path):
        return "none"
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        whole = utils._all_tables_exist(engine) and utils._get_schema_version(engine) == utils._get_latest_schema_revision()
        with engine.connect() as con:
            whole = whole and con.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    except Exception:  # noqa: BLE001 - anything MLflow or SQLite cannot read is broken
        whole = False
    finally:
        engine.dispose()
    return "whole" if whole else "broken"
