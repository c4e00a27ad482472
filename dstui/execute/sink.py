"""The supervisor's side of MLflow: one parent run per batch, a child per run, their points.

Tolerant of a store that is unreachable: every call that fails marks the store
down for a few seconds and returns ``None``; the points stay on disk (offsets
unsaved) and are sent on a later pass. Exactly once: a point is sent, then its
offset is saved; a crash between the two re-sends points with the same
(key, step, timestamp, value), which MLflow's SQL store ignores.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir, read_json
from dstui.core.secrets import redact, strip_credentials
from dstui.execute import guard_watch
from dstui.execute.ingest import Tracked
from dstui.spec import dsconfig
from dstui.tracking import client as tracking

log = logging.getLogger("dstui.execute.supervisor")

MLFLOW_STATUS = {"done": "FINISHED", "failed": "FAILED", "killed": "KILLED", "skipped": "KILLED"}
RETRY_AFTER_S = 5.0


class MlflowSink:
    """Creates the batch's MLflow runs and sends their points; never raises on store trouble."""

    def __init__(self, batch: BatchDir, tracking_uri: str | None, flush_interval_s: float) -> None:
        self.batch = batch
        self.info = batch.info()
        self.tracking_uri = tracking_uri or resolve_uri(self.info.get("tracking_uri"))
        # Live runs send to MLflow at most this often: each send is a store transaction
        # (an fsync on SQLite), and fewer of them disturb a host-bound training loop less.
        self.flush_interval_s = flush_interval_s
        self._client: Any = None
        self.error: str | None = None
        self._retry_at = 0.0
        self._store_id: tuple[int, int] | None = None
        self.experiment_id: str | None = None

    # ---- connection ----

    def client(self) -> Any:
        if self._client is None and time.time() >= self._retry_at:
            try:
                c = tracking.client(self.tracking_uri)
                self.experiment_id = tracking.ensure_experiment(c, self.info["experiment"])
                self._client = c
                self._store_id = _file_id(self.tracking_uri)
                if self.error:
                    self.report(None)
                self.error = None
            except Exception as e:
                self.down(e)
        return self._client

    def down(self, e: Exception) -> None:
        detail = strip_credentials(str(e))[:200]
        msg = f"MLflow unreachable ({type(e).__name__}: {detail}); metrics stay on disk and are sent later"
        if msg != self.error:
            log.warning(msg)
            self.report("MLflow unreachable; metrics stay in the run folders and are sent later")
        self.error = msg
        self._client = None
        self._retry_at = time.time() + RETRY_AFTER_S

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

    # ---- runs ----

    def parent_run_id(self) -> str | None:
        pid = self.info.get("mlflow_parent_run_id")
        if pid:
            return pid
        c = self.client()
        if c is None:
            return None
        try:
            found = tracking.find_run(c, self.experiment_id, {"dstui.batch": self.batch.id, "dstui.role": "batch"})
            if found:
                pid = found.info.run_id
            else:
                tags = {
                    "dstui.role": "batch",
                    "dstui.batch": self.batch.id,
                    "dstui.spec": self.info.get("spec_path"),
                    "dstui.runs": len(self.info.get("runs", [])),
                    **tracking.host_tags(),
                }
                pid = tracking.create_run(c, self.experiment_id, self.batch.id, tags=tags)
            self.info = self.batch.update_info(mlflow_parent_run_id=pid)
            return pid
        except Exception as e:
            self.down(e)
            return None

    def child_run_id(self, rd: RunDir) -> str | None:
        st = rd.status()
        if st.get("mlflow_run_id"):
            return st["mlflow_run_id"]
        parent = self.parent_run_id()
        c = self.client()
        if c is None or parent is None:
            return None
        try:
            # the folder plus the attempt identifies this child, so a supervisor that died
            # between creating it and saving its id finds it again instead of making a twin
            ref = f"{rd.path}#{st.get('attempt', 1)}"
            found = tracking.find_run(c, self.experiment_id, {"dstui.run_dir": ref})
            rid = found.info.run_id if found else self._create_child(c, rd, st, ref, parent)
            rd.update_status(mlflow_run_id=rid)
            return rid
        except Exception as e:
            self.down(e)
            return None

    def _create_child(self, c: Any, rd: RunDir, st: dict, ref: str, parent: str) -> str:

        spec = rd.spec()
        settings = spec.get("settings", {})
        tags = {
            "dstui.role": "run",
            "dstui.batch": self.batch.id,
            "dstui.condition": spec.get("condition"),
            "dstui.revision": spec.get("revision"),
            "dstui.repeat": spec.get("repeat"),
            "dstui.order": spec.get("order"),
            "dstui.run_key": spec.get("key"),
            "dstui.kind": settings.get("kind"),
            "dstui.run_dir": ref,
            "dstui.status": st.get("state"),
            **tracking.host_tags(),
        }
        rev = spec.get("revision_info") or {}
        if rev:
            from dstui.revisions.envs import ResolvedRevision

            tags.update(ResolvedRevision.from_dict(rev).mlflow_tags())
        rid = tracking.create_run(c, self.experiment_id, rd.name, tags=tags, parent_id=parent)
        if rev.get("diff_path") and Path(rev["diff_path"]).is_file():
            # a working-tree revision: the uncommitted changes it ran with
            c.log_artifact(rid, rev["diff_path"], artifact_path="revision")
        params = flat_settings({k: v for k, v in redact(settings).items() if k != "env_visible"})  # env.* shows the choice
        params.update(dsconfig.flatten(read_json(rd.ds_config_file, {}) or {}))
        params["run_key"] = spec.get("key")
        params["revision"] = spec.get("revision")
        params["repeat"] = spec.get("repeat")
        tracking.log_params(c, rid, params)
        return rid

    def tag(self, rd: RunDir, tags: dict[str, Any]) -> None:
        """Tags on a run's MLflow child now (live state); a store that is down only loses this copy."""
        c = self.client()
        rid = self.child_run_id(rd)
        if c is None or rid is None:
            return
        try:
            tracking.set_tags(c, rid, tags)
        except Exception as e:
            self.down(e)

    # ---- what runs report ----

    def header(self, t: Tracked, rec: dict) -> None:
        """Versions the runner saw become tags; what it measured beats what dstui computed."""
        c = self.client()
        rid = self.child_run_id(t.rd)
        if c is None or not rid:
            return
        try:
            tracking.set_tags(c, rid, tracking.versions_tags(rec))
            if not t.header_done:
                keys = ("tokens_per_step", "params", "flops_per_token", "peak_tflops", "world_size")
                tracking.log_params(c, rid, {k: rec.get(k) for k in keys})
            t.header_done = True
        except Exception as e:
            self.down(e)

    def flush(self, t: Tracked, *, force: bool = False) -> None:
        """Send the pending points (at most every flush interval unless forced), then save offsets."""
        if not t.pending:
            t.save()
            return
        now = time.time()
        if not force and now - t.last_flush < self.flush_interval_s:
            return  # offsets stay unsaved with the points, so a crash re-reads them
        t.last_flush = now
        c = self.client()
        rid = self.child_run_id(t.rd)
        if c is None or rid is None:
            return  # keep pending; offsets are not saved, so a restart re-reads them too
        try:
            tracking.log_metrics(c, rid, t.pending)
        except Exception as e:
            self.down(e)
            return
        t.pending = []
        t.save()

    def finish_run(self, t: Tracked) -> bool:
        """Final tags, the run folder as artifacts, the MLflow status. False: try again later."""
        rd = t.rd
        c = self.client()
        rid = self.child_run_id(rd)
        if c is None or rid is None:
            return False
        st = rd.status()
        try:
            tags = {
                "dstui.status": st.get("state"),
                "dstui.reason": st.get("reason") or "",
                "dstui.exit_code": st.get("exit_code"),
                "dstui.bad_metric_lines": t.metrics.bad_lines,
            }
            if st.get("verdict"):
                tags["dstui.verdict"] = st["verdict"]
            if st.get("job_id"):
                tags.update({"dstui.slurm_job": st["job_id"], "dstui.slurm_state": st.get("slurm_state"), "dstui.nodes": st.get("nodes") or ""})
            tags.update(guard_watch.tags_of(st))  # again here: the live tag is lost if MLflow was down then
            tracking.set_tags(c, rid, tags)
            if st.get("phases"):  # time/launch, time/init, ... (dstui.core.phases)
                now_ms = int(time.time() * 1000)
                tracking.log_metrics(c, rid, [(f"time/{k}", v, now_ms, 0) for k, v in st["phases"].items() if v is not None])
            tracking.log_artifacts(c, rid, rd.path)
            tracking.finish(c, rid, MLFLOW_STATUS.get(st.get("state"), "FAILED"))
        except Exception as e:
            self.down(e)
            return False
        return True

    def finish_batch(self, states: list[str]) -> None:
        c = self.client()
        pid = self.parent_run_id()
        if c is None or not pid:
            return
        with contextlib.suppress(Exception):
            tracking.set_tags(c, pid, {f"dstui.runs_{s}": states.count(s) for s in FINAL_STATES})
            tracking.log_file_artifact(c, pid, self.batch.batch_file)
            tracking.finish(c, pid, "FINISHED" if all(s in ("done", "skipped") for s in states) else "FAILED")


def sqlite_path(uri: str | None) -> Path | None:
    if not uri or not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


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
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service import utils

    # MLflow caches the store per URI, and one engine per URI under it: drop both
    utils._tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    engine = SqlAlchemyStore._engine_map.pop(uri, None)
    if engine is not None:
        with contextlib.suppress(Exception):
            engine.dispose()
    tracking._WAL_DONE.discard(uri or "")


def resolve_uri(recorded: str | None) -> str | None:
    """batch.json keeps the tracking URI without credentials; the environment has the full one."""
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if env_uri and recorded and strip_credentials(env_uri) == recorded:
        return env_uri
    return recorded


def flat_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in settings.items():
        if isinstance(v, dict):
            out.update(flat_settings(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out[f"{prefix}{k}"] = json.dumps(v)
        else:
            out[f"{prefix}{k}"] = "" if v is None else str(v)
    return out
