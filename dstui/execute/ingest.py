"""Following one run's files: new metric and system records become MLflow points.

Per-run state (byte offsets, what was already sent) lives in ``ingest.json`` so
that a supervisor restarted after a crash continues where its predecessor
stopped. Offsets are saved only after the points they cover were sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dstui.core.records import (
    HEADER,
    STEP,
    SUMMARY,
    Follower,
    metric_values,
    parse_json_line,
    parse_seed_line,
)
from dstui.core.rundir import RunDir, read_json, write_json_atomic
from dstui.execute import sysmetrics

Point = tuple[str, float, int, int]  # (key, value, timestamp ms, step)


def metrics_format(rd: RunDir) -> str:
    return rd.settings().get("metrics_format", "jsonl")


@dataclass
class Tracked:
    """Per-run ingestion state, mirrored to ingest.json."""

    rd: RunDir
    metrics: Follower
    system: Follower
    header_done: bool = False
    finalized: bool = False
    system_step: int = 0
    proc: Any = None  # the executor's job handle, while this supervisor started the job
    tree: sysmetrics.ProcessTreeSampler | None = None
    last_sample: float = 0.0
    last_flush: float = 0.0
    pending: list[Point] = field(default_factory=list)

    def save(self) -> None:
        write_json_atomic(
            self.rd.ingest_file,
            {
                "metrics_offset": self.metrics.offset,
                "system_offset": self.system.offset,
                "bad_lines": self.metrics.bad_lines,
                "header_done": self.header_done,
                "finalized": self.finalized,
                "system_step": self.system_step,
            },
        )

    def mark(self) -> tuple:
        """Where reading stands (offsets, partial lines, counters), to go back to."""
        m, y = self.metrics, self.system
        return (m.offset, m._partial, m.bad_lines, y.offset, y._partial, self.system_step)

    def restore(self, mark: tuple) -> None:
        m, y = self.metrics, self.system
        m.offset, m._partial, m.bad_lines, y.offset, y._partial, self.system_step = mark

    def rewind(self) -> None:
        """Read the run's files again from the start (the store that held its points is gone)."""
        self.metrics.offset = self.system.offset = 0
        self.metrics._partial = self.system._partial = b""
        self.metrics.bad_lines = 0
        self.system_step = 0
        self.header_done = self.finalized = False
        self.pending = []

    @classmethod
    def load(cls, rd: RunDir, fmt: str) -> Tracked:
        st = read_json(rd.ingest_file, {}) or {}
        source = rd.metrics_file if fmt == "jsonl" else rd.log_file
        return cls(
            rd=rd,
            metrics=Follower(source, st.get("metrics_offset", 0), st.get("bad_lines", 0)),
            system=Follower(rd.system_file, st.get("system_offset", 0)),
            header_done=st.get("header_done", False),
            finalized=st.get("finalized", False),
            system_step=st.get("system_step", 0),
        )


def read_points(
    t: Tracked,
    on_header: Callable[[dict], None],
    *,
    update_status: bool = True,
    final: bool = False,
) -> list[Point]:
    """Every new point of a run since the saved offsets; updates the run's status as it goes.

    ``final``: the job has exited, so an unterminated last line is read too
    (:meth:`dstui.core.records.Follower.read_lines`).
    """
    rd = t.rd
    fmt = metrics_format(rd)
    points: list[Point] = []
    last: dict[str, Any] = {}
    steps_done = None
    for line, _ in t.metrics.read_lines(final=final):
        if fmt == "seed":
            rec = parse_seed_line(line)
            if rec is None:
                continue  # ordinary log output
            rec["time"] = None
        else:
            rec = parse_json_line(line)
            if rec is None:
                if line.strip():
                    t.metrics.bad_lines += 1
                continue
        ts = int((rec.get("time") or 0) * 1000) or stable_ts(rd, rec)
        if rec["type"] == HEADER:
            on_header(rec)
        elif rec["type"] == STEP:
            step = int(rec["step"])
            for key, value in metric_values(rec).items():
                points.append((key, value, ts, step))
            steps_done = step
            last = {k: rec.get(k) for k in ("loss", "iter_time", "tokens_per_s", "mem_peak")}
        elif rec["type"] == SUMMARY:
            for key, value in metric_values(rec).items():  # step 0: one value a run, drawn as a bar
                points.append((f"summary.{key}", value, ts, 0))
            if update_status:
                merge_summary(rd, rec)
    life = sysmetrics.job_life(rd)
    for line, _ in t.system.read_lines(final=final):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):  # MLflow's system-metric names, step = seconds since launch
            points.extend(sysmetrics.mlflow_points(rec, **life))
        t.system_step += 1
    if steps_done is not None and update_status:
        rd.update_status(steps_done=steps_done, last=last, last_step_at=time.time())
    return points


def merge_summary(rd: RunDir, rec: dict) -> None:
    """A runner may add a second summary (e.g. a check's verdict): merge, don't replace."""
    merged = {**(rd.status().get("summary") or {}), **{k: v for k, v in rec.items() if k != "type"}}
    fields: dict[str, Any] = {"summary": merged}
    if rec.get("verdict"):
        fields["verdict"] = rec["verdict"]
    rd.update_status(**fields)


def sample_system(t: Tracked, st: dict, interval_s: float, now: float) -> None:
    """Append one host/GPU sample to system.jsonl, at most every ``interval_s``."""
    if now - t.last_sample < interval_s:
        return
    t.last_sample = now
    if t.tree is None and st.get("pid"):
        t.tree = sysmetrics.ProcessTreeSampler(st["pid"])
    rec = sysmetrics.sample(t.tree, st.get("gpu_slice"))
    if rec is None:  # the job has ended: no reading of it
        return
    with open(t.rd.system_file, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def stable_ts(rd: RunDir, rec: dict) -> int:
    """A deterministic timestamp for records without one (seed-format lines).

    It must not change when the same line is re-read after a restart, or the
    store would keep both copies; the run's start time plus the step does that.
    """
    started = rd.status().get("started") or 0
    return int(started * 1000) + int(rec.get("step", 0))


def unsent_points(rd: RunDir) -> int:
    """Points a run wrote that MLflow has not confirmed yet (after the offsets in ingest.json)."""
    st = read_json(rd.ingest_file, {}) or {}
    if st.get("finalized"):
        return 0
    t = Tracked.load(rd, metrics_format(rd))
    n = 0
    while True:
        batch = read_points(t, on_header=lambda rec: None, update_status=False)
        if not batch:
            return n
        n += len(batch)
