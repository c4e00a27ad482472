"""Where a run's wall time went, as a stacked bar, and how much of its batch trained.

The segments are dstui.core.phases' (launch, imports, init, compile, steps,
teardown: consecutive, they add up to the wall time), read from the run's
status.json where the supervisor stores them when the run ends. The batch's
step share is the sum of its optimizer steps' times over its wall time. A short
verification run spends most of its time outside the steps: the bar makes
that visible at a glance, before anyone opens a report.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from dstui.core.phases import SEGMENTS, Breakdown, batch_step_share, compile_cache_line, from_status

SEGMENT_STYLE = {
    "launch": "grey62",
    "imports": "dodger_blue2",
    "init": "dark_cyan",
    "compile": "magenta",
    "steps": "green3",
    "teardown": "dark_orange",
}
BAR_WIDTH = 40


def bar_widths(seconds: list[float], width: int) -> list[int]:
    """Characters per segment, proportional to its time, adding up to ``width`` (largest remainder)."""
    total = sum(seconds)
    if total <= 0 or width <= 0:
        return [0] * len(seconds)
    exact = [s / total * width for s in seconds]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - out[i], reverse=True)
    for i in by_remainder[: width - sum(out)]:
        out[i] += 1
    return out


def _known(b: Breakdown) -> list[tuple[str, float]]:
    return [(k, getattr(b, k)) for k in SEGMENTS if getattr(b, k) is not None]


def stacked_bar(b: Breakdown, width: int = BAR_WIDTH) -> Text:
    """'58.0 s [bar of `width` cells, one colour per segment]  steps 3% of wall' on one line."""
    known = _known(b)
    text = Text(f"{b.wall:.1f} s " if b.wall is not None else "")
    for (key, _), n in zip(known, bar_widths([max(0.0, s) for _, s in known], width), strict=True):
        text.append("█" * n, style=SEGMENT_STYLE[key])
    if b.step_share is not None:
        text.append(f"  steps {b.step_share:.0%} of wall", style="bold")
    return text


def breakdown_text(name: str, b: Breakdown, width: int = BAR_WIDTH) -> Text:
    """Two lines: 'time name  wall s [stacked bar]  steps N% of wall' and the coloured segment legend."""
    text = Text.assemble(("time ", "dim"), (name, "bold"), "  ", stacked_bar(b, width), "\n")
    for key, seconds in _known(b):
        text.append("■ ", style=SEGMENT_STYLE[key])
        text.append(f"{key} {seconds:.1f}  ")
    return text


def share_text(share: tuple[float, float, float]) -> Text:
    """The batch's step share: 'batch step share 6%: 3.2 s of optimizer steps in 52.0 s of wall time'."""
    value, steps, wall = share
    return Text.assemble(
        ("batch ", "dim"),
        (f"step share {value:.0%}", "bold"),
        f": {steps:.1f} s of optimizer steps in {wall:.1f} s of wall time",
    )


class TimeBar(Static):
    """The highlighted run's time breakdown (and how torch.compile's caches answered it) and the batch's
    step share; hidden when none is known."""

    _shown: tuple | None = None

    def show(self, name: str | None, statuses: list[dict[str, Any]]) -> None:
        """``name``: the highlighted run; ``statuses``: every run of the batch (status.json contents)."""
        own = next((st for st in statuses if st.get("name") == name), None)
        times = from_status(own) if own else None
        caches = compile_cache_line(own.get("summary")) if own else None
        share = batch_step_share(statuses)
        if (name, times, caches, share) == self._shown:
            return  # called every tick: redraw only what changed
        self._shown = (name, times, caches, share)
        parts = []
        if times is not None and any(getattr(times, k) is not None for k in SEGMENTS):
            parts.append(breakdown_text(str(name), times))
        if caches:  # why the compile segment is what it is: a repeat whose graphs miss compiles again
            parts.append(Text.assemble(("compile cache ", "dim"), caches))
        if share is not None:
            parts.append(share_text(share))
        self.display = bool(parts)
        self.update(Text("\n").join(parts) if parts else "")
