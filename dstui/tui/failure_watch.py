"""Runs that go wrong while the TUI is open: what to tell the user, once each (no textual here).

A failed run used to pass silently: its row turned red in a table the user may not
be looking at. The home reader (:mod:`dstui.tui.home_snapshot`) hands
:class:`FailureWatch` the statuses of every snapshot; it answers which runs of the
unfinished (or just finished) batches failed, were killed, hung or were flagged by
the live guard since the last look, and the app raises a toast (and the terminal
bell, unless turned off) for each. What was already wrong when the TUI started is
not announced again; a user's own cancel is not an alarm. It reads nothing itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.core import failures

RECENT_S = 120.0  # a batch finalized this recently is still watched (its last run's end)

#: (batch id, batch.json, (run name, status.json) of each run): what one look is made of
BatchStatuses = tuple[str, Mapping[str, Any], Iterable[tuple[str, Mapping[str, Any]]]]


@dataclass(frozen=True)
class Alert:
    batch: str
    run: str
    title: str
    text: str


def _trouble(st: Mapping[str, Any]) -> tuple[str, str] | None:
    """(title, text) when a run's status is something to be told about, else None."""
    t = failures.trouble(st)  # type: ignore[arg-type]  (it only reads)
    if t is None or t.cancelled:  # a user's own cancel: they asked for it
        return None
    if t.kind == "flagged":
        return "live guard", t.text
    return ("run hung" if t.hung else f"run {t.kind}"), t.text


class FailureWatch:
    """Remembers what it has seen, so each run's trouble is announced once."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], tuple[str, str] | None] = {}
        self.primed = False

    def scan(self, batches: Iterable[BatchStatuses], now: float) -> list[Alert]:
        """The alerts new since the last scan (none at the first: those troubles are in the tables already)."""
        alerts: list[Alert] = []
        for batch_id, info, runs in batches:
            if info.get("finalized") and now - float(info.get("ended") or 0) > RECENT_S:
                continue
            alerts.extend(self._scan_batch(batch_id, runs))
        first, self.primed = not self.primed, True
        return [] if first else alerts

    def _scan_batch(self, batch_id: str, runs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Alert]:
        out = []
        for name, st in runs:
            key = (batch_id, name)
            trouble = _trouble(st)
            if key in self.seen and self.seen[key] == trouble:
                continue
            new = key in self.seen or self.primed  # a run first seen after start-up counts too
            self.seen[key] = trouble
            if trouble and new:
                out.append(Alert(batch_id, name, trouble[0], trouble[1]))
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
