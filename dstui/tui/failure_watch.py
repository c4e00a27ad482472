"""Runs that go wrong while the TUI is open: what to tell the user, once each (no textual here).

A failed run used to pass silently: its row turned red in a table the user may not
be looking at. The app asks :class:`FailureWatch` every tick which runs of the
unfinished batches failed, were killed, hung or were flagged by the live guard
since the last look, and raises a toast (and the terminal bell, unless turned
off) for each. What was already wrong when the TUI started is not announced
again; a user's own cancel is not an alarm.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from dstui.core import failures
from dstui.core.rundir import BatchDir, list_batches

RECENT_S = 120.0  # a batch finalized this recently is still watched (its last run's end)
MAX_BATCHES = 30
RELIST_S = 5.0  # a batch launched meanwhile is watched from its first 5 s on


@dataclass(frozen=True)
class Alert:
    batch: str
    run: str
    title: str
    text: str


def _trouble(st: dict) -> tuple[str, str] | None:
    """(title, text) when a run's status is something to be told about, else None."""
    t = failures.trouble(st)
    if t is None or t.cancelled:  # a user's own cancel: they asked for it
        return None
    if t.kind == "flagged":
        return "live guard", t.text
    return ("run hung" if t.hung else f"run {t.kind}"), t.text


class FailureWatch:
    """Remembers what it has seen, so each run's trouble is announced once."""

    def __init__(self, relist_s: float = RELIST_S) -> None:
        self.seen: dict[tuple[str, str], tuple[str, str] | None] = {}
        self.primed = False
        self.relist_s = relist_s
        self._watched: list[BatchDir] = []
        self._listed_at = -1e18

    def _batches(self, runs_root: Path, now: float) -> list[BatchDir]:
        """The batches worth reading each tick: unfinished or just finished. Listing every batch of
        the home reads each batch.json, so it is done every ``relist_s``, not every tick."""
        if now - self._listed_at >= self.relist_s:
            self._listed_at = now
            self._watched = list_batches(runs_root)[:MAX_BATCHES]
        return self._watched

    def scan(self, runs_root: Path, now: float | None = None) -> list[Alert]:
        now = now or time.time()
        alerts: list[Alert] = []
        for b in self._batches(runs_root, now):
            info = b.info()
            if info.get("finalized") and now - float(info.get("ended") or 0) > RECENT_S:
                continue
            alerts.extend(self._scan_batch(b))
        first, self.primed = not self.primed, True
        return [] if first else alerts  # troubles older than the TUI are in the tables already

    def _scan_batch(self, b: BatchDir) -> list[Alert]:
        out = []
        for rd in b.runs():
            key = (b.id, rd.name)
            trouble = _trouble(rd.status())
            if key in self.seen and self.seen[key] == trouble:
                continue
            new = key in self.seen or self.primed  # a run first seen after start-up counts too
            self.seen[key] = trouble
            if trouble and new:
                out.append(Alert(b.id, rd.name, trouble[0], trouble[1]))
        return out


def _settings_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dstui" / "tui.json"


def bell_enabled() -> bool:
    """The terminal bell on failures (on unless turned off from the command palette)."""
    try:
        return bool(json.loads(_settings_file().read_text()).get("bell_on_failure", True))
    except (OSError, ValueError, AttributeError):
        return True


def set_bell(on: bool) -> None:
    f = _settings_file()
    try:
        data = json.loads(f.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data["bell_on_failure"] = on
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(data, indent=2) + "\n")
