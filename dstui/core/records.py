"""The metrics record: the contract between a runner and the supervisor.

A runner appends one JSON object per line to ``metrics.jsonl``: a ``header``
record, one ``step`` record per logged optimizer step and a ``summary``.
Programs that only print the seed's human line (``Epoch 1, Step 10, Loss:
... sync: True time: ... alloc_mem: ... peak_mem: ...``) are followed too:
:func:`parse_seed_line` turns such a line into the same step record.

:class:`Follower` reads a growing file from a byte offset and only hands out
complete lines, so a half-written line is never parsed and the offset can be
persisted for exactly-once ingestion after a crash.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

HEADER, STEP, SUMMARY, PHASES = "header", "step", "summary", "phases"

# Fields of a step record that are bookkeeping, not metrics.
NON_METRIC_FIELDS = frozenset({"type", "time", "step", "epoch", "rank"})

SEED_LINE = re.compile(
    r"Epoch\s+(?P<epoch>\d+),\s*Step\s+(?P<step>\d+),\s*Loss:\s*(?P<loss>[-+0-9.eEnaif]+)"
    r"(?:\s+sync:\s*(?P<sync>\w+))?"
    r"(?:\s+time:\s*(?P<time>[-+0-9.eE]+))?"
    r"(?:\s+alloc_mem:\s*(?P<alloc>\d+))?"
    r"(?:\s+peak_mem:\s*(?P<peak>\d+))?"
)


def seed_line(epoch: int, step: int, loss: float, iter_time: float, alloc: int, peak: int) -> str:
    """The human line of the seed scripts, kept so existing habits and tools work."""
    return (
        f"Epoch {epoch}, Step {step}, Loss: {loss:.6f} sync: True time: {iter_time:.6f} "
        f"alloc_mem: {alloc} peak_mem: {peak}"
    )


def parse_seed_line(line: str) -> dict[str, Any] | None:
    m = SEED_LINE.search(line)
    if not m:
        return None
    rec: dict[str, Any] = {
        "type": STEP,
        "epoch": int(m["epoch"]),
        "step": int(m["step"]),
        "loss": float(m["loss"]),
    }
    if m["time"] is not None:
        rec["iter_time"] = float(m["time"])
    if m["alloc"] is not None:
        rec["mem_alloc"] = int(m["alloc"])
    if m["peak"] is not None:
        rec["mem_peak"] = int(m["peak"])
    return rec


def parse_json_line(line: str) -> dict[str, Any] | None:
    """A record, or None for a line that is not one (garbled, truncated, foreign)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("type") not in (HEADER, STEP, SUMMARY, PHASES):
        return None
    if rec["type"] == STEP and not isinstance(rec.get("step"), int):
        return None
    return rec


def metric_values(rec: dict[str, Any]) -> dict[str, float]:
    """The finite numeric metrics of a step record."""
    out = {}
    for k, v in rec.items():
        if k in NON_METRIC_FIELDS or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


class MetricsWriter:
    """Append records, one line each, flushed so a follower sees them at once."""

    def __init__(self, path: str | Path | None) -> None:
        self._fh: TextIO | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115

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


@dataclass
class Follower:
    """Incremental reader of a growing line file, resumable from ``offset``."""

    path: Path
    offset: int = 0
    bad_lines: int = 0
    _partial: bytes = field(default=b"", repr=False)

    def read_lines(self, max_bytes: int = 8 << 20, *, final: bool = False) -> list[tuple[str, int]]:
        """Complete new lines with the offset just after each one.

        A line is complete at its newline, except with ``final`` (its writer has
        exited): then the text after the last newline is a line too. A record the
        writer finished but whose newline never came (the disk filled up between
        the two) is still a record; a cut-off one fails to parse like any bad line.
        """
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:  # truncated or replaced: start over
                    self.offset = 0
                fh.seek(self.offset)
                chunk = fh.read(max_bytes)
        except FileNotFoundError:
            return []
        out: list[tuple[str, int]] = []
        pos = self.offset
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            pos = self.offset + nl + 1
            out.append((chunk[start:nl].decode("utf-8", "replace"), pos))
            start = nl + 1
        if final and start < len(chunk) and len(chunk) < max_bytes:  # the unterminated tail, at the end of the file
            out.append((chunk[start:].decode("utf-8", "replace"), self.offset + len(chunk)))
        if out:
            self.offset = out[-1][1]
        return out


def read_records(path: str | Path, fmt: str = "jsonl") -> list[dict[str, Any]]:
    """All records of a finished file (used by reports, import and tests)."""
    parse = parse_json_line if fmt == "jsonl" else parse_seed_line
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                rec = parse(line)
                if rec is not None:
                    out.append(rec)
    except FileNotFoundError:
        return []
    return out
