"""Following one run's files: new metric and system records become MLflow points.

Per-run state (byte offsets, what was already sent) lives in ``ingest.json`` so
that a supervisor restarted after a crash continues where its predecessor
stopped. Offsets are saved only after the points they cover were sent.

A run's output is untrusted: a line that cannot be a record, a value MLflow cannot
store (a step beyond 64 bits, NaN, a number too large for a float, a metric name
MLflow refuses) is counted as a bad line and left out, never raised and never sent,
so it cannot hold back the points around it. The count and the first one go to
``status.json`` (``bad_lines``, ``first_bad_line``) and to MLflow tags.

A Slurm job started again (requeued) appends a new attempt to the same files; a
step an earlier attempt logged is not sent again (:mod:`dstui.core.attempt_steps`).
``status.json`` says how often (``requeues``) and how many step records were left
out as repeats (``repeated_steps``).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dstui.core import run_files, verdicts
from dstui.core.attempt_steps import AttemptSteps
from dstui.core.metric_catalogue import STATUS_KEYS
from dstui.core.metric_names import MetricNames
from dstui.core.records import (
    ATTEMPT,
    HEADER,
    STEP,
    SUMMARY,
    Follower,
    clean_header,
    example,
    parse_json_object,
    parse_record,
    record_time_ms,
    seed_parts,
    split_metrics,
)
from dstui.core.rundir import RunDir, read_json, write_json_atomic
from dstui.execute import process_group, sysmetrics

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
    steps_sent: bool = False  # a point besides system readings went to MLflow (dstui.execute.sink.held_back)
    attempts: AttemptSteps = field(default_factory=AttemptSteps)  # saved with the offsets it belongs to
    names: MetricNames = field(default_factory=MetricNames)  # the run's distinct metric names so far (bounded)

    def save(self) -> None:
        write_json_atomic(
            self.rd.ingest_file,
            {
                "metrics_offset": self.metrics.offset,
                "system_offset": self.system.offset,
                "bad_lines": self.metrics.bad_lines,
                "first_bad_line": self.metrics.first_bad,
                "metrics_skipping": self.metrics.skipping,
                "system_skipping": self.system.skipping,
                "header_done": self.header_done,
                "finalized": self.finalized,
                "system_step": self.system_step,
                "attempts": self.attempts.to_json(),
                "metric_names": self.names.to_json(),
            },
        )

    def mark(self) -> tuple:
        """Where reading stands (offsets, partial lines, counters), to go back to."""
        m, y = self.metrics, self.system
        return (m.offset, m._partial, m.bad_lines, m.first_bad, m.skipping, y.offset, y._partial, y.skipping, self.system_step,
                copy.copy(self.attempts), set(self.names.names))  # fmt: skip

    def restore(self, mark: tuple) -> None:
        m, y = self.metrics, self.system
        (m.offset, m._partial, m.bad_lines, m.first_bad, m.skipping, y.offset, y._partial, y.skipping,
         self.system_step, attempts, names) = mark  # fmt: skip
        self.attempts = copy.copy(attempts)
        self.names = MetricNames(set(names))

    def rewind(self) -> None:
        """Read the run's files again from the start (the store that held its points is gone)."""
        self.metrics.offset = self.system.offset = 0
        self.metrics._partial = self.system._partial = b""
        self.metrics.skipping = self.system.skipping = False
        self.metrics.bad_lines = 0
        self.metrics.first_bad = ""
        self.system_step = 0
        self.header_done = self.finalized = False
        self.pending = []
        self.steps_sent = False
        self.attempts = AttemptSteps()
        self.names = MetricNames()

    @classmethod
    def load(cls, rd: RunDir, fmt: str) -> Tracked:
        st = read_json(rd.ingest_file, {}) or {}
        source = rd.metrics_file if fmt == "jsonl" else rd.log_file
        return cls(
            rd=rd,
            metrics=Follower(source, st.get("metrics_offset", 0), st.get("bad_lines", 0), st.get("first_bad_line", ""),
                             bool(st.get("metrics_skipping"))),  # fmt: skip
            system=Follower(rd.system_file, st.get("system_offset", 0), skipping=bool(st.get("system_skipping"))),
            header_done=st.get("header_done", False),
            finalized=st.get("finalized", False),
            system_step=st.get("system_step", 0),
            attempts=AttemptSteps.from_json(st.get("attempts")),
            names=MetricNames.from_json(st.get("metric_names")),
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
    (:meth:`dstui.core.records.Follower.read_lines`). Never raises on what a run wrote:
    bad lines and values are counted (module docstring).
    """
    rd = t.rd
    fmt = metrics_format(rd)
    points: list[Point] = []
    last: dict[str, Any] = {}
    steps_done = None
    bad_before = t.metrics.bad_lines
    attempts_before = copy.copy(t.attempts)
    step_times: list[float] = []
    lines = (part for line, _ in t.metrics.read_lines(final=final) for part in (seed_parts(line) if fmt == "seed" else (line,)))
    for line in lines:
        rec, problem = parse_record(line, fmt)
        if problem:
            t.metrics.bad(problem)
            continue
        if rec is None:
            continue  # ordinary log output (seed format), a blank line
        kept = t.attempts.keep(rec)  # False for a repeat of an earlier attempt's step
        if rec["type"] == ATTEMPT:
            continue  # a job (re)start: later steps up to the highest so far are repeats
        values = storable(t, rec, line, counted=kept)
        own_ts = record_time_ms(rec)
        if rec["type"] == HEADER:
            on_header(clean_header(rec))
        elif rec["type"] == STEP:
            step = rec["step"]
            ts = own_ts or stable_ts(rd, step)
            if kept:  # a repeat of an earlier attempt's step is progress of this attempt, not a point
                points.extend((key, value, ts, step) for key, value in values.items())
            steps_done = step
            step_times.append(own_ts / 1000 if own_ts else time.time())
            last = {k: values.get(k) for k in STATUS_KEYS}
        elif rec["type"] == SUMMARY:
            ts = own_ts or stable_ts(rd, 0)
            # step 0: one value a run, drawn by MLflow as a bar
            points.extend((f"summary.{key}", value, ts, 0) for key, value in values.items())
            if update_status:
                merge_summary(rd, rec)
    life = sysmetrics.job_life(rd)
    for line, _ in t.system.read_lines(final=final):
        rec = parse_json_object(line)
        if rec is None:
            continue  # the supervisor writes system.jsonl itself; a torn line is skipped
        points.extend(sysmetrics.mlflow_points(rec, **life))  # MLflow's system-metric names, step = seconds since launch
        t.system_step += 1
    if update_status:
        fields: dict[str, Any] = {}
        if steps_done is not None:
            fields.update(steps_done=steps_done, last=last, last_step_at=time.time())
            slowest = slowest_gap(rd.status(), step_times)
            if slowest is not None:
                fields["slowest_step_s"] = slowest
            fields["last_step_time"] = step_times[-1]
        if t.metrics.bad_lines != bad_before:
            fields.update(bad_lines=t.metrics.bad_lines, first_bad_line=t.metrics.first_bad)
        if t.attempts != attempts_before:
            fields.update(requeues=t.attempts.requeues, repeated_steps=t.attempts.repeated)
        if fields:
            rd.update_status(**fields)
    return points


def storable(t: Tracked, rec: dict[str, Any], line: str, *, counted: bool) -> dict[str, float]:
    """The record's metrics MLflow may store: finite numbers under names MLflow takes, not a name
    dstui reserves, within the run's bound on distinct names (:mod:`dstui.core.metric_names`).
    What is left out makes the line a bad one (``counted``: not for a repeat of an earlier attempt)."""
    values, dropped = split_metrics(rec)
    if rec["type"] in (STEP, SUMMARY) and counted:
        values, refused = t.names.admit(values, "summary." if rec["type"] == SUMMARY else "")
    else:
        refused = []
    if counted and dropped:
        t.metrics.bad(example(line, f"left out {', '.join(dropped[:3])} (not a finite number MLflow can store)"))
    elif counted and refused:
        t.metrics.bad(example(line, f"left out {', '.join(refused[:3])}"))
    return values


def slowest_gap(st: dict, step_times: list[float]) -> float | None:
    """The longest time between two consecutive new steps so far (the automatic stall guard's yardstick).

    Times are the records' own when they have one, else when the supervisor read them; the time
    before the first step (start-up, compilation) does not count.
    """
    prev = st.get("last_step_time")
    times = ([prev] if isinstance(prev, (int, float)) else []) + step_times
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= a]
    old = st.get("slowest_step_s")
    if not gaps:
        return None
    return max([*gaps, *([old] if isinstance(old, (int, float)) else [])])


def merge_summary(rd: RunDir, rec: dict) -> None:
    """A runner may add a second summary (e.g. a check's verdict): merge, don't replace."""
    merged = {**(rd.status().get("summary") or {}), **{k: v for k, v in rec.items() if k != "type"}}
    fields: dict[str, Any] = {"summary": merged}
    if rec.get("verdict"):
        fields["verdict"] = rec["verdict"]
        fields["evidence"] = verdicts.evidence(merged)
    rd.update_status(**fields)


def sample_system(t: Tracked, st: dict, interval_s: float, now: float) -> None:
    """Append one host/GPU sample to system.jsonl, at most every ``interval_s``."""
    if now - t.last_sample < interval_s:
        return
    t.last_sample = now
    if t.tree is None and st.get("pid") and process_group.job_alive(st):  # not a process that took its number
        t.tree = sysmetrics.ProcessTreeSampler(st["pid"], wrapper=True)
    rec = sysmetrics.sample(t.tree, st.get("gpu_slice"))
    if rec is None:  # the job has ended: no reading of it
        return
    try:  # never through a link the job put in its place (dstui.core.run_files)
        fd = run_files.open_append(t.rd.system_file)
    except run_files.NotRegular as e:
        t.system.refused = str(e)
        return
    with os.fdopen(fd, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def stable_ts(rd: RunDir, step: int) -> int:
    """A deterministic timestamp for records without one (seed-format lines).

    It must not change when the same line is re-read after a restart, or the
    store would keep both copies; the run's start time plus the step does that
    (kept within MLflow's non-negative 64-bit timestamps whatever the step).
    """
    started = rd.status().get("started") or 0
    return min(max(int(started * 1000) + step, 0), 2**63 - 1)


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
