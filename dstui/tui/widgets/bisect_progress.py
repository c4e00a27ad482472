"""A line on the runs screen for a bisect in progress: outcomes left, tests left, the revision under test, its batch.

The bisect itself runs in the CLI (`dstui bisect`, its own process); the home
snapshot carries the progress it writes (:mod:`dstui.bisect.store`, chosen by
:func:`dstui.tui.home_snapshot.shown_bisects`) and this widget renders it. The
commit's runs are an ordinary batch, listed in the batches table like any other.
Hidden when no bisect is running or just finished, so the screen is unchanged otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.widgets import Static

VERDICT_STYLE = {"good": "green", "bad": "bold red", "skip": "magenta"}


def progress_text(p: Mapping[str, Any]) -> Text:
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

    _shown: Sequence[Mapping[str, Any]] | None = None

    def show(self, bisects: Sequence[Mapping[str, Any]]) -> None:
        if bisects == self._shown:
            return
        self._shown = bisects
        self.display = bool(bisects)
        if bisects:
            self.update(Text("\n").join(progress_text(p) for p in bisects[:2]))
