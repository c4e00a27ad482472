"""Parsing old logs into runs: seed step lines, summary lines, key=value, Namespace dumps, metrics.jsonl.

No MLflow here: :func:`parse_log` turns one file into :class:`ParsedLog`
segments (one per run it holds); :mod:`dstui.importer.seedlogs` writes them.
The formats understood are listed in that module's docstring.

A log is read as a stream in bounded memory: lines are capped at
:data:`MAX_LINE_BYTES` (a longer one is skipped and counted), and a segment keeps
only counts, a digest and the few smallest steps unless asked for its steps; the
steps themselves go to ``on_step`` as they are read. Whatever a file holds (binary,
a step beyond 64 bits, ``Loss: abc``), parsing never raises: a line that looks like
a record but cannot be one is a counted malformed line.

Every step line is either imported or counted, never both: a line with nothing MLflow
can store (``Loss: nan`` alone) is malformed; one with a non-finite value beside
storable ones (``Loss: nan ... time: 0.1``) is imported without that value and counted
as *partial* (a run none of whose steps has a usable loss is then no clean run).

A job restarted into the same log (steps 1-5, then 1-5 again) follows dstui's rule for
attempts (:mod:`dstui.core.attempt_steps`, the supervisor's and every reader's): **the
first attempt to log a step wins**. In a seed log nothing marks an attempt, so a step
number going backwards opens one; a step logged again right away (a second, truncated
``Step 6`` line) is a repeat. Repeats are counted, never sent, so an imported log reads
as a run dstui launched would. dstui's own metrics.jsonl marks attempts with records.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.core.attempt_steps import AttemptSteps
from dstui.core.records import (
    ATTEMPT,
    STEP,
    BadRecord,
    in_int64,
    parse_json_record,
    parse_seed_record,
    split_metrics,
)
from dstui.importer.lines import parse_kv_line, parse_namespace, parse_summary_line
from dstui.importer.names import value_of

#: the longest line read from a log; a longer one is skipped (counted as malformed)
MAX_LINE_BYTES = 1 << 20
#: longer lines are never summary, key=value or Namespace lines (those patterns are kept off them)
MAX_RECORD_CHARS = 64 << 10
#: a reason taken from a log is kept whole up to this (a tag value's room)
MAX_REASON_CHARS = 2000
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: how many of a segment's smallest distinct steps are kept (the warm-up cut needs the first few)
MAX_SMALLEST = 1000

#: ``(bytes read, lines read)`` of the file being read, called every 2000 lines
Progress = Callable[[int, int], None]
StepSink = Callable[[int, dict[str, Any]], None]

_STEPISH = re.compile(r"\bEpoch\s+\S+,?\s*Step\b|\bLoss:")
_HEADER = re.compile(r"^\s*(NUM_NODES|NGPUS_PER_NODE|NUM_PROCESSES|ZERO_STAGE|MODEL|BACKEND|GRADIENT_ACCUMULATION_STEPS):\s*(\S+)")
# DeepSpeed's own start-up line and ds_report's table; "torch version ...." from ds_report too
_VERSIONS = (
    (re.compile(r"DeepSpeed info: version=([^\s,]+)(?:, git-hash=([0-9a-fA-F]+))?"), "deepspeed"),
    (re.compile(r"^\s*deepspeed info \.*\s*([0-9][^\s,]*)(?:, ([0-9a-fA-F]{6,}))?"), "deepspeed"),
    (re.compile(r"\b[Dd]eep[Ss]peed[ _]version[:=]?\s*([0-9][^\s,]*)"), "deepspeed"),
    (re.compile(r"^\s*torch version \.*\s*([0-9][^\s,]*)"), "torch"),
    (re.compile(r"^\s*transformers version \.*\s*([0-9][^\s,]*)"), "transformers"),
)
_EXC = re.compile(r"^\s*((?:[\w]+\.)*\w*(?:Error|Exception|Interrupt)):\s*(.*)$")


@dataclass
class Segment:
    """One run inside a log: its step count (and steps, when kept) and, when it finished, its summary line."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    summary_params: dict[str, Any] = field(default_factory=dict)
    count: int = 0
    smallest: list[int] = field(default_factory=list)  # the smallest distinct steps, ascending
    digest: Any = field(default_factory=hashlib.sha1, repr=False)  # of (step, loss, iter_time) in order
    attempts: AttemptSteps = field(default_factory=AttemptSteps)
    last: int | None = None  # the step of the previous step line (kept or not)
    repeats: int = 0  # a step line of the step just logged (not an attempt's repeat)
    no_loss: int = 0  # steps kept without a usable loss (nan/inf: the rest of the line kept)

    @property
    def repeated(self) -> int:
        """Step lines left out because their step was logged before (first one wins)."""
        return self.repeats + self.attempts.repeated

    @property
    def restarts(self) -> int:
        """How often the steps went backwards: a job started again, appending to the log."""
        return self.attempts.starts

    def admit(self, rec: dict[str, Any], *, marked: bool = False) -> bool:
        """Whether a step (or, when ``marked``, attempt) record is kept, by the first-attempt-wins rule.

        ``marked``: the file marks attempts itself (metrics.jsonl), so several records of one
        step within an attempt all count, as the supervisor counts them."""
        if marked:
            return self.attempts.keep(rec)
        step = rec["step"]
        if self.last is not None:
            if step == self.last:
                self.repeats += 1
                return False
            if step < self.last:
                self.attempts.keep({"type": ATTEMPT})
        self.last = step
        return self.attempts.keep({"type": STEP, "step": step})

    def add(self, rec: dict[str, Any], keep: bool) -> None:
        step = rec["step"]
        self.count += 1
        self.digest.update(repr((step, rec.get("loss"), rec.get("iter_time"))).encode())
        if keep:
            self.steps.append(rec)
        small = self.smallest
        if len(small) < MAX_SMALLEST or step < small[-1]:
            i = bisect.bisect_left(small, step)
            if i == len(small) or small[i] != step:
                small.insert(i, step)
                if len(small) > MAX_SMALLEST:
                    small.pop()


@dataclass
class ParsedLog:
    """What one file says: runs, settings, failure clues and line counts."""

    path: Path
    segments: list[Segment]
    config: dict[str, Any]
    lines: int = 0
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    partial: int = 0  # step lines imported without a value MLflow cannot store (nan, inf, too large)
    failure: str = ""
    header: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)  # deepspeed, torch, ..., deepspeed_git_sha
    jsonl_header: dict[str, Any] = field(default_factory=dict)

    @property
    def step_count(self) -> int:
        return sum(s.count for s in self.segments)

    @property
    def repeated(self) -> int:
        return sum(s.repeated for s in self.segments)

    def signature(self) -> str:
        """The steps of every segment, hashed: two files with the same steps import once."""
        h = hashlib.sha1()
        for seg in self.segments:
            h.update(seg.digest.digest())
        return h.hexdigest()



def _failure_of(line: str, last_exc: str) -> tuple[str, str]:
    """(reason found on this line or '', last Python exception seen)."""
    low = line.lower()
    if "out of memory" in low or "outofmemoryerror" in low:
        return "CUDA out of memory", last_exc
    if "nccl" in low and ("timeout" in low or "timed out" in low):
        return "NCCL timeout", last_exc
    m = _EXC.match(line)
    if m and not line.startswith(" "):
        return "", f"Python: {m.group(1)}: {m.group(2)}".strip()
    return "", last_exc


def read_lines(path: Path, parsed: ParsedLog, progress: Progress | None = None) -> Iterator[str]:
    """The file's lines, decoded (bad bytes replaced), each at most :data:`MAX_LINE_BYTES`;
    a longer line is skipped to its end and counted as malformed. Counts ``parsed.lines``."""
    done = 0
    with open(path, "rb") as fh:
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            done += len(raw)
            parsed.lines += 1
            if progress is not None and parsed.lines % 2000 == 0:  # the callback decides how often it speaks
                progress(done, parsed.lines)
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                _malformed(parsed, f"line longer than {MAX_LINE_BYTES} bytes skipped: " + raw[:80].decode("utf-8", "replace"))
                while raw and not raw.endswith(b"\n"):  # on to its end
                    raw = fh.readline(MAX_LINE_BYTES)
                    done += len(raw)
                continue
            yield raw.decode("utf-8", "replace").rstrip("\r\n")
    if progress is not None:
        progress(done, parsed.lines)


def parse_log(
    path: Path, *, on_step: StepSink | None = None, keep_steps: bool = True, progress: Progress | None = None
) -> ParsedLog:
    """Read a seed-format (or key=value, or metrics.jsonl) file into segments, as a stream.

    ``on_step(segment index, step record)`` gets every step as it is read (the records are
    clean: a 64-bit step, numbers MLflow can store); ``keep_steps`` also keeps them in the
    segments (small files, tests); ``progress`` hears how far the read got. Never raises on
    what the file holds (an unreadable file is the caller's OSError).
    """
    if path.name.endswith(".jsonl"):
        return _parse_jsonl(path, on_step, keep_steps, progress)
    segments = [Segment()]
    config: dict[str, Any] = {}
    header: dict[str, Any] = {}
    parsed = ParsedLog(path=path, segments=segments, config=config, header=header)
    failure, last_exc = "", ""

    def step(raw: dict[str, Any], line: str) -> None:
        _take_step(parsed, len(segments) - 1, raw, line, marked=False, keep_steps=keep_steps, on_step=on_step)

    for line in read_lines(path, parsed, progress):
        try:
            rec = parse_seed_record(line)
        except BadRecord:  # 'Loss: abc', a step beyond 64 bits
            _malformed(parsed, line)
            continue
        if rec is not None:
            step(rec, line)
            continue
        if len(line) > MAX_RECORD_CHARS:  # no record is this long: only say if it looked like one
            if _STEPISH.search(line):
                _malformed(parsed, line)
            continue
        summ = parse_summary_line(line)
        if summ is not None:
            segments[-1].summary_params, segments[-1].summary = summ
            segments.append(Segment())
            continue
        try:
            kv = parse_kv_line(line) if "=" in line else None
        except ValueError:
            _malformed(parsed, line)
            continue
        if kv is not None:
            kind, body = kv
            if kind == "step":
                step(body, line)
            else:
                segments[-1].summary_params, segments[-1].summary = body["params"], body["summary"]
                segments.append(Segment())
            continue
        if "Namespace(" in line:
            ns = parse_namespace(line)
            if ns and not config:
                config.update(ns)
            continue
        hm = _HEADER.match(line)
        if hm:
            header.setdefault(hm.group(1), value_of(hm.group(2)))
            continue
        if _STEPISH.search(line) or "iteration time:" in line:
            _malformed(parsed, line)
            continue
        if "version" in line.lower() or "deepspeed info" in line.lower():
            _versions_of(line, parsed.versions)
        reason, last_exc = _failure_of(line, last_exc)
        if reason and not failure:
            failure = reason
    if not segments[-1].count and not segments[-1].summary:
        segments.pop()
    parsed.failure = (failure or last_exc)[:MAX_REASON_CHARS]
    return parsed


def _clean_step(parsed: ParsedLog, rec: dict[str, Any], line: str) -> tuple[dict[str, Any] | None, bool]:
    """(what MLflow can store of a step, whether a value was left out); None when that is nothing.

    A line is imported or counted bad, never both: one with nothing storable (a NaN loss
    alone) is malformed here; one that keeps something (its time, its memory) but loses a
    non-finite value is imported and counted as partial by :func:`_kept`.
    """
    values, dropped = split_metrics(rec)
    keep = {k: v for k, v in rec.items() if k in ("type", "step", "epoch") and in_int64(v)}
    if not values or not isinstance(keep.get("step"), int):
        _malformed(parsed, line)
        return None, bool(dropped)
    return {**keep, **values}, bool(dropped)


def _take_step(
    parsed: ParsedLog, index: int, raw: dict[str, Any], line: str, *,
    marked: bool, keep_steps: bool, on_step: StepSink | None,
) -> None:  # fmt: skip
    """One step line of either format into segment ``index``: kept, or counted (malformed, a repeat).

    ``marked``: the file marks attempts with records (metrics.jsonl); see :meth:`Segment.admit`.
    A kept step is counted partial when a value was left out, and without loss when it has none.
    """
    seg = parsed.segments[index]
    rec, lost = _clean_step(parsed, raw, line)
    if rec is None or not seg.admit(rec, marked=marked):
        return
    if lost:
        parsed.partial += 1
    if "loss" not in rec:
        seg.no_loss += 1
    seg.add(rec, keep_steps)
    if on_step is not None:
        on_step(index, rec)


def _versions_of(line: str, out: dict[str, str]) -> None:
    """Versions printed in a log (first one wins): ``DeepSpeed info: version=0.17.1+e440506b, git-hash=e440506b``."""
    for rx, name in _VERSIONS:
        m = rx.search(line)
        if not m:
            continue
        out.setdefault(name, m.group(1))
        if name == "deepspeed":
            sha = m.group(2) if m.lastindex and m.lastindex >= 2 else None
            if not sha and "+" in m.group(1):
                sha = m.group(1).split("+", 1)[1]  # a local version carries the git sha: 0.17.1+e440506b
            if sha and re.fullmatch(r"[0-9a-fA-F]{6,40}", sha):
                out.setdefault("deepspeed_git_sha", sha)
        return


def _malformed(parsed: ParsedLog, line: str) -> None:
    parsed.malformed += 1
    if len(parsed.malformed_examples) < 3:
        parsed.malformed_examples.append(_UNPRINTABLE.sub("?", line.strip()[:160]))


def _parse_jsonl(path: Path, on_step: StepSink | None, keep_steps: bool, progress: Progress | None) -> ParsedLog:
    seg = Segment()
    parsed = ParsedLog(path=path, segments=[seg], config={})
    for line in read_lines(path, parsed, progress):
        try:
            rec = parse_json_record(line)
        except BadRecord:
            _malformed(parsed, line)
            continue
        if rec is None:
            continue
        if rec["type"] == ATTEMPT:
            seg.admit(rec, marked=True)
        elif rec["type"] == "header":
            parsed.jsonl_header = rec
            if isinstance(rec.get("config"), dict):
                parsed.config.update(rec["config"])
        elif rec["type"] == "step":
            _take_step(parsed, 0, rec, line, marked=True, keep_steps=keep_steps, on_step=on_step)
        elif rec["type"] == "summary":
            seg.summary = {k: float(v) for k, v in rec.items() if is_number(v)}
            if rec.get("status") not in (None, "ok"):
                parsed.failure = str(rec.get("status"))[:300]
    if not seg.count and not seg.summary:
        parsed.segments = []
    return parsed


def is_number(v: Any) -> bool:
    """A finite number that fits a float (an int too large for one is not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False

