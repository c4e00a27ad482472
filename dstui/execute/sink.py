"""The supervisor's side of MLflow: what runs report becomes tags, params, metrics and artifacts.

Tolerant of a store that is unreachable (:mod:`~dstui.execute.store`): the
points stay on disk (offsets unsaved) and are sent on a later pass. Exactly
once: a point is sent, then its offset is saved; a crash between the two
re-sends points with the same (key, step, timestamp, value), which MLflow's SQL
store ignores. The parent and child runs themselves are
:mod:`~dstui.execute.mlflow_runs`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from dstui.core.rundir import FINAL_STATES, BatchDir
from dstui.execute import guard_watch, mlflow_params
from dstui.execute.ingest import Tracked
from dstui.execute.mlflow_runs import MLFLOW_STATUS, MlflowRuns, refused  # noqa: F401 - re-exported
from dstui.execute.store import forget_sqlite_store, resolve_uri, sqlite_path  # noqa: F401 - re-exported
from dstui.tracking import client as tracking
from dstui.tracking import tags as tag_keys

log = logging.getLogger("dstui.execute.supervisor")


class MlflowSink(MlflowRuns):
    """Creates the batch's MLflow runs and sends their points; never raises on store trouble."""

    def __init__(self, batch: BatchDir, tracking_uri: str | None, flush_interval_s: float) -> None:
        super().__init__(batch, tracking_uri)
        # Live runs send to MLflow at most this often: each send is a store transaction
        # (an fsync on SQLite), and fewer of them disturb a host-bound training loop less.
        self.flush_interval_s = flush_interval_s

    # ---- what runs report ----

    def header(self, t: Tracked, rec: dict) -> None:
        """Versions the runner saw become tags; what it measured beats what dstui computed."""
        c = self.client()
        rid = self.child_run_id(t.rd)
        if c is None or not rid:
            return
        try:
            tracking.set_tags(c, rid, tracking.versions_tags(rec))
            if not t.header_done:  # DeepSpeed version and source, the model's shape and size
                revision = t.rd.spec().get("revision_info") or {}
                tracking.log_params(c, rid, mlflow_params.header_params(rec, revision))
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

    def finish_run(self, t: Tracked, job_tags: dict[str, Any] | None = None) -> bool:
        """Final tags (``job_tags``: the backend's of its job), the run folder as artifacts, the MLflow status.

        False: try again later.
        """
        rd = t.rd
        c = self.client()
        rid = self.child_run_id(rd)
        if c is None or rid is None:
            return False
        st = rd.status()
        try:
            final = {
                tag_keys.STATUS: st.get("state"),
                tag_keys.REASON: st.get("reason") or "",
                tag_keys.EXIT_CODE: st.get("exit_code"),
                tag_keys.BAD_METRIC_LINES: t.metrics.bad_lines,
                tag_keys.FIRST_BAD_LINE: t.metrics.first_bad or None,
            }
            if st.get("verdict"):
                final[tag_keys.VERDICT] = st["verdict"]
            if st.get("evidence"):
                final[tag_keys.EVIDENCE] = st["evidence"]
            final.update(job_tags or {})
            final.update(guard_watch.tags_of(st))  # again here: the live tag is lost if MLflow was down then
            tracking.set_tags(c, rid, final)
            if st.get("phases"):  # time/launch, time/init, ... (dstui.core.phases)
                now_ms = int(time.time() * 1000)
                tracking.log_metrics(c, rid, [(f"time/{k}", v, now_ms, 0) for k, v in st["phases"].items() if v is not None])
            tracking.log_artifacts(c, rid, rd.path)
            for key_file in (rd.ds_config_file, rd.cmd_file, rd.spec_file):  # top level: the compare page diffs them
                if key_file.is_file():
                    tracking.log_file_artifact(c, rid, key_file)
            tracking.finish(c, rid, MLFLOW_STATUS.get(st.get("state"), "FAILED"), end_time=st.get("ended"))
        except Exception as e:
            self.down(e)
            return False
        return True

    def finish_batch(self, states: list[str]) -> bool:
        """The parent run's counts, batch.json and end state. False: the store is down, try again later
        (a batch is not finalized while its parent run is RUNNING)."""
        c = self.client()
        pid = self.parent_run_id()
        if c is None or not pid:
            return False
        try:
            tracking.set_tags(c, pid, {tag_keys.runs_in(s): states.count(s) for s in FINAL_STATES})
            with contextlib.suppress(Exception):  # the record of the batch; its end state matters more
                tracking.log_file_artifact(c, pid, self.batch.batch_file)
            tracking.finish(c, pid, "FINISHED" if all(s in ("done", "skipped") for s in states) else "FAILED")
        except Exception as e:
            if refused(e):  # deleted in MLflow's UI, say: nothing left to end, and no reason to wait forever
                log.warning("MLflow refused to end the batch's parent run (%s)", e)
                return True
            self.down(e)
            return False
        return True
