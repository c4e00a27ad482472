"""The supervisor's side of MLflow: what runs report becomes tags, params, metrics and artifacts.

Tolerant of a store that is unreachable (:mod:`~dstui.execute.store`): the
points stay on disk (offsets unsaved) and are sent on a later pass. Exactly
once: a point is sent, then its offset is saved; a crash between the two
re-sends points with the same (key, step, timestamp, value), which MLflow's SQL
store ignores. The batch's and the runs' MLflow runs themselves are
:mod:`~dstui.execute.mlflow_runs`; names, units and ends follow :mod:`dstui.tracking.layout`.

A run's system readings wait for its first step record before they go out: MLflow's
compare page opens its parallel-coordinates chart on the first metric a run logged,
and a run that starts up for a minute logs CPU readings long before its first loss
(the chart opened on ``system/cpu_utilization_percentage``, 100 for every run).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from dstui.core.rundir import BatchDir
from dstui.execute import guard_watch, mlflow_params
from dstui.execute.ingest import Point, Tracked
from dstui.execute.mlflow_runs import MlflowRuns, refused
from dstui.tracking import client as tracking
from dstui.tracking import layout
from dstui.tracking import tags as tag_keys
from dstui.tracking.sqlite_store import sqlite_path  # noqa: F401 - re-exported

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
            tracking.set_tags(c, rid, layout.versions_tags(rec))
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
        send, held = held_back(t.pending, steps_sent=t.steps_sent or force)
        try:  # chunk by chunk: what went through is not sent again after a failure (a long backlog got
            # nowhere while any one of its chunks failed); the offsets wait for the last chunk
            while send:
                chunk = send[: tracking.MAX_BATCH]
                layout.log_points(c, rid, chunk)
                del send[: len(chunk)]
                t.steps_sent = True
        except Exception as e:
            t.pending = send + held
            self.down(e)
            return
        t.pending = held
        if not held:  # held readings are not on MLflow yet: their offsets stay unsaved with them
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
            if st.get("phases"):  # time/launch, time/init, ... (dstui.core.phases)
                now_ms = int(time.time() * 1000)
                layout.log_points(c, rid, [(f"time/{k}", v, now_ms, 0) for k, v in st["phases"].items() if v is not None])
            # the run's files, bounded and never through a link; what was left out is a problem of this run
            problems = tracking.log_artifacts(c, rid, rd.path)
            for key_file in (rd.ds_config_file, rd.cmd_file, rd.spec_file):  # top level: the compare page diffs them
                problems.append(tracking.log_file_artifact(c, rid, key_file))
            for why in dict.fromkeys(p for p in problems if p):
                rd.note_file_problem(why)
            layout.end_run(c, rid, st.get("state") or "failed", ended_s=st.get("ended"), tags=final)
        except Exception as e:
            self.down(e)
            return False
        return True

    def finish_batch(self, states: list[str]) -> bool:
        """The batch run's counts, batch.json and end state. False: the store is down, try again later
        (a batch is not finalized while its batch run is RUNNING)."""
        c = self.client()
        pid = self.parent_run_id()
        if c is None or not pid:
            return False
        try:
            with contextlib.suppress(Exception):  # the record of the batch; its end state matters more
                tracking.log_file_artifact(c, pid, self.batch.batch_file)
            layout.end_batch(c, pid, states)
        except Exception as e:
            if refused(e):  # deleted in MLflow's UI, say: nothing left to end, and no reason to wait forever
                log.warning("MLflow refused to end the batch's run (%s)", e)
                return True
            self.down(e)
            return False
        return True


SYSTEM_PREFIX = "system/"


def held_back(points: list[Point], *, steps_sent: bool) -> tuple[list[Point], list[Point]]:
    """(points to send now, system readings to hold): until a run's first step point went out, its
    readings wait, and go right after it (module docstring). Step points first either way."""
    step = [p for p in points if not p[0].startswith(SYSTEM_PREFIX)]
    system = [p for p in points if p[0].startswith(SYSTEM_PREFIX)]
    if steps_sent or step:
        return step + system, []
    return [], system
