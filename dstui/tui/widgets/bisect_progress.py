"""A line on the runs screen for a bisect in progress: outcomes left, tests left, the revision under test, its batch.

The bisect itself runs in the CLI (`dstui bisect`, its own process); this widget
only reads the progress file it writes (:mod:`dstui.bisect.store`). The commit's
runs are an ordinary batch, listed in the batches table like any other. Hidden
when no bisect is running or just finished, so the screen is unchanged otherwise.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widgets import Static

from dstui.bisect.store import list_progress

RECENT_S = 600.0  # a finished bisect's answer stays this long
VERDICT_STYLE = {"good": "green", "bad": "bold red", "skip": "magenta"}


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def shown(progress: list[dict[str, Any]], now: float | None = None) -> list[dict[str, Any]]:
    """Bisects worth a line: running (their process is alive) or finished in the last minutes."""
    now = time.time() if now is None else now

    def worth(p: dict[str, Any]) -> bool:
        if p.get("state") == "running":
            return _alive(p.get("pid"))
        return now - float(p.get("updated", 0)) < RECENT_S

    return [p for p in progress if worth(p)]


def progress_text(p: dict[str, Any]) -> Text:
    """One bisect as one or two lines (pure: easy to test).

    Running: what it walks (commits or releases), the outcomes left and about how
    many more tests that takes (log2), the revision being built or run and its
    batch; then the verdicts so far, in the order the search took them.
    """
    noun = str(p.get("noun") or "commit")
    head = Text.assemble(("bisect ", "bold"), f"{p.get('metric')} of {p.get('condition')} ", ("· ", "dim"))
    if p.get("state") != "running":
        head.append(str(p.get("answer") or p.get("state")), style="bold")
        return head
    head.append(f"{p.get('left', '?')} outcomes left in {p.get('commits', '?')} {noun}s")
    if p.get("tests_left") is not None:
        head.append(f", about {p['tests_left']} more tests", style="dim")
    cur = p.get("current") or {}
    if cur:
        doing = {"building": "building env of", "running": "running"}.get(str(p.get("phase")), "testing")
        head.append(f" · {doing} ", style="dim")
        name = str(cur.get("name") or str(cur.get("sha", ""))[:12])
        head.append(f"{name} {cur.get('subject', '')!r}")
        if cur.get("index") == -1:
            head.append(" (the good end)", style="dim")
        if cur.get("batch") and p.get("phase") != "building":
            head.append(f" (batch {cur['batch']})", style="dim")
    steps = p.get("path") or p.get("tested") or []
    if steps:
        head.append("\n  path: " if p.get("path") else "\n  tested: ", style="dim")
        for i, t in enumerate(steps):
            if i:
                head.append(" -> " if p.get("path") else ", ", style="dim")
            head.append(f"{str(t.get('name') or str(t.get('sha', ''))[:8])} ")
            head.append(str(t.get("verdict")), style=VERDICT_STYLE.get(str(t.get("verdict")), ""))
    return head


class BisectProgress(Static):
    DEFAULT_CSS = "BisectProgress { height: auto; max-height: 4; padding: 0 1; display: none; }"

    def refresh_from(self, runs_root: Path) -> None:
        found = shown(list_progress(runs_root))
        self.display = bool(found)
        if found:
            self.update(Text("\n").join(progress_text(p) for p in found[:2]))
