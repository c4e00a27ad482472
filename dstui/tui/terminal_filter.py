"""The TUI's net under core.terminal: no control character of any widget's text reaches the screen.

Textual draws a widget's text as it is: its Log widget turns only ``\\x00-\\x14``
into a mark and lets ESC through, and Content strips BEL, BS, VT, FF and CR alone,
so an OSC or CSI sequence in a run's reason or log line retitled and cleared the
user's terminal (issue 40.4). Text that came from a run, a spec or a log is made
:func:`~dstui.core.terminal.printable` where it enters a widget (the sequence is
gone, not just its ESC); this line filter, applied by Textual to every line of
every widget, removes whatever control character is left anywhere else. Control
characters are zero cells wide, so removing them moves nothing on screen;
Textual's own control segments (cursor moves) are left alone.
"""

from __future__ import annotations

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

from dstui.core.terminal import CONTROLS


class TerminalSafe(LineFilter):
    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        search, sub = CONTROLS.search, CONTROLS.sub
        if not any(not control and search(text) for text, _, control in segments):
            return segments
        return [seg if seg.control or not search(seg.text) else Segment(sub("", seg.text), seg.style) for seg in segments]
