"""The metrics record: the contract between a runner and the supervisor.

A runner appends one JSON object per line to ``metrics.jsonl``: a ``header``
record, one ``step`` record per logged optimizer step and a ``summary``. A Slurm
job's script writes an ``attempt`` record before its ranks start, so a job that
Slurm requeues (or dstui resubmits) opens a new attempt in the same file
(:mod:`dstui.core.attempt_steps`: each step counts once).
Programs that only print the seed's human line (``Epoch 1, Step 10, Loss:
... sync: True time: ... alloc_mem: ... peak_mem: ...``) are followed too:
:func:`parse_seed_line` turns such a line into the same step record.

:class:`Follower` reads a growing file from a byte offset and only hands out
complete lines, so a half-written line is never parsed and the offset can be
persisted for exactly-once ingestion after a crash.

Run output is untrusted: whatever a program prints, parsing here never raises.
:func:`parse_record` answers ``(record, problem)``: a line that looks like a record
but cannot be one (``Loss: abc``, a step beyond 64 bits, broken JSON) is a
*problem* the caller counts as a bad line; a record keeps only what MLflow can
store (:func:`split_metrics`: finite numbers, steps and timestamps in int64, metric
names MLflow accepts), so one bad value never blocks the points around it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dstui.core import run_files

HEADER, STEP, SUMMARY, PHASES, ATTEMPT = "header", "step", "summary", "phases", "attempt"

# Fields of a step record that are bookkeeping, not metrics.
NON_METRIC_FIELDS = frozenset({"type", "time", "step", "epoch", "rank"})

# Loss and time take any word: "Loss: abc" is a seed line gone wrong (a bad line), not ordinary output.
SEED_LINE = re.compile(
    r"Epoch\s+(?P<epoch>\d+),\s*Step\s+(?P<step>\d+),\s*Loss:\s*(?P<loss>[^\s,]+)"
    r"(?:\s+sync:\s*(?P<sync>\w+))?"
    r"(?:\s+time:\s*(?P<time>[^\s,]+))?"
    r"(?:\s+alloc_mem:\s*(?P<alloc>\d+))?"
    r"(?:\s+peak_mem:\s*(?P<peak>\d+))?"
)

#: where a seed line starts: two of them in one line are two ranks' writes glued together
SEED_START = re.compile(r"Epoch\s+\d+,\s*Step\s+\d+,")
#: a step record made from a seed line carries this (True): repeats of its step are left out (attempt_steps)
SEED_SOURCE = "from_seed_line"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: MLflow's rule for metric names (mlflow.utils.validation, non-Windows), within its 250-character key limit
_METRIC_NAME = re.compile(r"^[/\w.\- :]{1,200}$")  # 200: room for the "summary." prefix
#: how much of a bad line status.json and the MLflow tag show
EXAMPLE_CHARS = 120
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class BadRecord(ValueError):
    """A line that looks like a record but cannot be one; the message says why (for the count's example)."""


def in_int64(v: object) -> bool:
    """An int MLflow can store as a step or timestamp (a 64-bit SQL integer)."""
    return isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX


def example(line: str, why: str) -> str:
    """``why: <start of the line>``, bounded, printable, without credentials: the "first: ..." of a bad-line count."""
    from dstui.core import secrets

    text = _UNPRINTABLE.sub("?", line.strip()[:EXAMPLE_CHARS])
    more = "..." if len(line.strip()) > EXAMPLE_CHARS else ""
    return secrets.mask_text(f"{why}: {text}{more}")


def seed_line(epoch: int, step: int, loss: float, iter_time: float, alloc: int, peak: int) -> str:
    """The human line of the seed scripts, kept so existing habits and tools work."""
    return (
        f"Epoch {epoch}, Step {step}, Loss: {loss:.6f} sync: True time: {iter_time:.6f} "
        f"alloc_mem: {alloc} peak_mem: {peak}"
    )


def parse_seed_line(line: str) -> dict[str, Any] | None:
    """The step record of a seed line; None for any other line, and for a seed line gone wrong
    (:func:`parse_seed_record` tells those apart). Never raises."""
    try:
        return parse_seed_record(line)
    except BadRecord:
        return None


def parse_seed_record(line: str) -> dict[str, Any] | None:
    """The step record of a seed line, None for ordinary output; :class:`BadRecord` for ``Loss: abc``,
    a step beyond 64 bits, and the like."""
    m = SEED_LINE.search(line)
    if not m:
        return None
    if len(m["step"]) > 19 or len(m["epoch"]) > 19:  # also keeps int() off Python's 4300-digit limit
        raise BadRecord("step or epoch beyond 64 bits")
    step, epoch = int(m["step"]), int(m["epoch"])
    if not (in_int64(step) and in_int64(epoch)):
        raise BadRecord("step or epoch beyond 64 bits")
    try:
        rec: dict[str, Any] = {"type": STEP, "epoch": epoch, "step": step, "loss": _float(m["loss"]), SEED_SOURCE: True}
        if m["time"] is not None:
            rec["iter_time"] = _float(m["time"])
    except ValueError:
        raise BadRecord("not a number") from None
    for group, key in (("alloc", "mem_alloc"), ("peak", "mem_peak")):
        if m[group] is not None:  # a float, whatever its length (int() stops at 4300 digits)
            rec[key] = float(m[group])
    return rec


def seed_parts(line: str) -> list[str]:
    """The pieces of a line of output that each hold at most one seed line: split at a bare CR (a
    progress bar's, or two lines joined by one) and where a second seed line begins inside the first
    (two ranks writing to one stream: a line's text and its newline are two writes when unbuffered)."""
    parts: list[str] = []
    for piece in line.split("\r"):
        starts = [m.start() for m in SEED_START.finditer(piece)]
        cuts = [0, *starts[1:], len(piece)]
        parts.extend(piece[a:b] for a, b in itertools.pairwise(cuts))
    return parts


def _float(text: str) -> float:
    """float() of a number as programs print it (a trailing comma or period tolerated)."""
    return float(text.rstrip(",;"))


def parse_json_line(line: str) -> dict[str, Any] | None:
    """A record, or None for a line that is not one (garbled, truncated, foreign). Never raises."""
    try:
        return parse_json_record(line)
    except BadRecord:
        return None


def parse_json_record(line: str) -> dict[str, Any] | None:
    """A record (numbers made float-safe: see :func:`_safe_numbers`); None for a blank line;
    :class:`BadRecord` for anything else (garbled, truncated, foreign, a step beyond 64 bits)."""
    line = line.strip()
    if not line:
        return None
    if not line.startswith("{"):
        raise BadRecord("not a JSON record")
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: a deeply nested value
        raise BadRecord("broken JSON") from None
    if not isinstance(rec, dict) or rec.get("type") not in (HEADER, STEP, SUMMARY, PHASES, ATTEMPT):
        raise BadRecord("not a dstui record")
    if rec["type"] == STEP and not in_int64(rec.get("step")):
        raise BadRecord("step is not a 64-bit integer")
    return _safe_numbers(rec)


def parse_attempt_line(line: str) -> dict[str, Any] | None:
    """The ``attempt`` record job.sh echoes into a seed-format run's output (its metrics source), else None."""
    if not line.lstrip().startswith('{"type": "attempt"'):
        return None
    rec = parse_json_line(line)
    return rec if rec is not None and rec.get("type") == ATTEMPT else None


def line_parser(fmt: str) -> Callable[[str], dict[str, Any] | None]:
    """The lenient per-line parser of a run's metrics source: JSONL records, or the seed's human
    lines with the ``attempt`` records a Slurm job writes into that output."""
    if fmt == "jsonl":
        return parse_json_line
    return lambda line: parse_attempt_line(line) or parse_seed_line(line)


def parse_json_object(line: str) -> dict[str, Any] | None:
    """Any JSON object on a line (system readings), None for anything else; never raises."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return _safe_numbers(rec) if isinstance(rec, dict) else None


def parse_record(line: str, fmt: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, problem)`` of one line of a ``jsonl`` or ``seed`` metrics source; never raises.

    In the seed format ordinary log output is neither (``(None, None)``); in jsonl every
    non-blank line that is not a record is a problem.
    """
    try:
        rec = (parse_attempt_line(line) or parse_seed_record(line)) if fmt == "seed" else parse_json_record(line)
    except BadRecord as e:
        return None, example(line, str(e))
    return rec, None


def _safe_numbers(rec: dict[str, Any]) -> dict[str, Any]:
    """Ints too large for a float become ±inf (so every reader can ``float()`` them; ingestion drops
    them as non-finite); a step record's non-numeric ``loss`` is dropped (the guard reads losses)."""
    for k, v in rec.items():
        if isinstance(v, int) and not isinstance(v, bool) and k not in ("step", "epoch", "steps"):
            try:
                float(v)
            except OverflowError:
                rec[k] = math.inf if v > 0 else -math.inf
    if rec.get("type") == STEP and "loss" in rec and not _is_number(rec["loss"]):
        rec["loss_dropped"] = True
        del rec["loss"]
    return rec


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def split_metrics(rec: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
    """(metrics MLflow can store, names of the numeric fields dropped: non-finite, too large, bad name).

    Every numeric field except bookkeeping (step, epoch, time, rank) is a metric; strings and
    booleans are not metrics and are not counted as dropped.
    """
    out: dict[str, float] = {}
    dropped: list[str] = ["loss"] if rec.get("loss_dropped") else []
    for k, v in rec.items():
        if k in NON_METRIC_FIELDS or not _is_number(v):
            continue
        try:
            value = float(v)
        except OverflowError:
            value = math.inf
        if math.isfinite(value) and isinstance(k, str) and _metric_name_ok(k):
            out[k] = value
        else:
            dropped.append(str(k)[:40])
    return out, dropped


def _metric_name_ok(name: str) -> bool:
    """MLflow's rule: allowed characters, at most 250 of them, and a name that is also a clean path."""
    if not _METRIC_NAME.match(name):
        return False
    import posixpath

    norm = posixpath.normpath(name)
    return norm == name and norm != "." and not norm.startswith(("..", "/"))


def metric_values(rec: dict[str, Any]) -> dict[str, float]:
    """The metrics of a record MLflow can store (finite numbers under valid names)."""
    return split_metrics(rec)[0]


def record_time_ms(rec: dict[str, Any]) -> int | None:
    """The record's own time in ms when it is a usable one (a non-negative int64), else None."""
    t = rec.get("time")
    if not _is_number(t):
        return None
    try:
        ms = int(float(t) * 1000)
    except (OverflowError, ValueError):  # inf, nan
        return None
    return ms if 0 < ms <= INT64_MAX else None


def clean_header(rec: dict[str, Any]) -> dict[str, Any]:
    """A header whose versions and hardware fields are short strings under safe names (they become tags)."""
    versions = rec.get("versions")
    safe: dict[str, str] = {}
    if isinstance(versions, dict):
        for k, v in list(versions.items())[:32]:
            if isinstance(k, str) and re.fullmatch(r"[\w.-]{1,64}", k) and v is not None:
                safe[k] = str(v)[:250]
    out = {**rec, "versions": safe}
    for key in ("hostname", "device", "gpu_name", "deepspeed_git_sha"):
        if key in out and out[key] is not None:
            out[key] = str(out[key])[:250]
    for key in ("gpu_count", "world_size"):
        if key in out and not in_int64(out[key]):
            out.pop(key)
    return out


class MetricsWriter:
    """Append records, one line each, flushed so a follower sees them at once."""

    def __init__(self, path: str | Path | None) -> None:
        # 0600 whatever the job's umask (dstui's files are private), never through a link
        self._fh: TextIO | None = os.fdopen(run_files.open_append(path), "a", buffering=1) if path else None

    def write(self, kind: str, **fields: Any) -> None:
        if self._fh is None:
            return
        rec = {"type": kind, "time": time.time(), **fields}
        self._fh.write(json.dumps(rec, default=_jsonable) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _jsonable(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def bad_lines_note(st: dict[str, Any]) -> str | None:
    """``N bad lines (first: ...)`` of a run's status.json, then the run's files dstui refused to read
    (``metrics.jsonl is a FIFO: not read``), for `dstui status` and the TUI; None when none."""
    parts: list[str] = []
    n = st.get("bad_lines")
    if isinstance(n, int) and n > 0:
        first = st.get("first_bad_line") or ""
        parts.append(f"{n} bad line{'s' if n != 1 else ''}" + (f" (first: {first})" if first else ""))
    problems = st.get("file_problems")
    if isinstance(problems, dict):
        parts.extend(str(why) for why in problems.values())
    return "; ".join(parts) or None


#: the longest line a follower hands out; a longer one is skipped and counted
MAX_LINE_BYTES = 8 << 20


@dataclass
class Follower:
    """Incremental reader of a growing line file, resumable from ``offset``.

    Lines are bounded: a line longer than the read size (no newline in a full chunk)
    is skipped to its end, counted in ``bad_lines`` and never read again, so no output
    can make a reader re-read the same bytes forever. ``skipping`` (persisted with the
    offset) says the offset is inside such a line.
    """

    path: Path
    offset: int = 0
    bad_lines: int = 0
    first_bad: str = ""
    skipping: bool = False
    _partial: bytes = field(default=b"", repr=False)
    max_line: int = field(default=MAX_LINE_BYTES, repr=False)  # the read size: the longest line handed out
    refused: str = field(default="", repr=False)  # why the file was not read at the last try (a link, a FIFO, ...)

    def bad(self, problem: str) -> None:
        """Count one bad line; the first one's description (see :func:`example`) is kept."""
        self.bad_lines += 1
        if not self.first_bad:
            self.first_bad = problem

    def read_lines(self, max_bytes: int | None = None, *, final: bool = False) -> list[tuple[str, int]]:
        """Complete new lines with the offset just after each one.

        A line is complete at its newline, except with ``final`` (its writer has
        exited): then the text after the last newline is a line too. A record the
        writer finished but whose newline never came (the disk filled up between
        the two) is still a record; a cut-off one fails to parse like any bad line.
        ``max_bytes`` (default ``max_line``) is the read size and so the longest line.

        The file is the run's, so it is read as untrusted (:mod:`dstui.core.run_files`):
        a link, FIFO or device in its place is not read and ``refused`` names it; a
        sparse file's holes (zeros: no newline in them) are stepped over, not read.
        """
        max_bytes = max_bytes or self.max_line
        try:
            fd = run_files.open_regular(self.path)
        except FileNotFoundError:
            return []
        except run_files.NotRegular as e:
            self.refused = str(e)
            return []
        self.refused = ""
        try:
            size = os.fstat(fd).st_size
            if size < self.offset:  # truncated or replaced: start over
                self.offset, self.skipping = 0, False
            data = run_files.next_data(fd, self.offset, size)
            if data - self.offset >= max_bytes:  # a hole longer than any line: whatever line it is in is over-long
                return self._over_long(b"", max_bytes, self.offset, data, final=final and data >= size)
            os.lseek(fd, self.offset, os.SEEK_SET)
            chunk = os.read(fd, max_bytes)
        finally:
            os.close(fd)
        base, start = self.offset, 0
        full = len(chunk) >= max_bytes
        if self.skipping:  # inside an oversize line: on to its newline
            nl = chunk.find(b"\n")
            if nl < 0:
                self.offset = base + len(chunk)
                self.skipping = not (final and not full)  # the file ended inside it: done with it
                return []
            start, self.skipping = nl + 1, False
        out: list[tuple[str, int]] = []
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            out.append((chunk[start:nl].decode("utf-8", "replace"), base + nl + 1))
            start = nl + 1
        if full and start == 0:  # one line fills the whole read: skip it, never hand it out
            return self._over_long(chunk, max_bytes, base, base + len(chunk), final=False)
        if final and start < len(chunk) and not full:  # the unterminated tail, at the end of the file
            out.append((chunk[start:].decode("utf-8", "replace"), base + len(chunk)))
            start = len(chunk)
        self.offset = base + start
        return out

    def _over_long(self, chunk: bytes, max_bytes: int, base: int, to: int, *, final: bool) -> list[tuple[str, int]]:
        """A line longer than a read: counted once (not again while skipping it), then skipped to ``to``."""
        if not self.skipping:
            self.bad(example(chunk[:EXAMPLE_CHARS].decode("utf-8", "replace"), f"line longer than {max_bytes} bytes skipped"))
        self.offset, self.skipping = to, not final
        return []
