"""A run's stdout.log (all ranks), following as it grows."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Log, Static

from dstui.core import paths
from dstui.core.records import Follower
from dstui.core.rundir import RunDir
from dstui.core.terminal import printable
from dstui.tui.widgets.fitting_footer import FittingFooter

INITIAL_BYTES = 256 * 1024


def _shown(path: Path) -> str:
    """The path relative to the dstui home when it is inside it (shorter, and stable)."""
    try:
        return str(path.relative_to(paths.home()))
    except ValueError:
        return str(path)


class LogScreen(Screen):
    TITLE = "Log"
    HELP = (
        "The run's stdout.log (launcher and every rank), newest at the bottom, following as it grows. "
        "The first view shows the last 256 KB; the file itself is in the run folder."
    )

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("f", "follow", "Follow on/off"),
        Binding("g", "top", "Top", show=False),
        Binding("G", "bottom", "Bottom", show=False),
    ]

    def __init__(self, rd: RunDir) -> None:
        super().__init__()
        self.rd = rd
        self.follower: Follower | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="log-path")
        yield Log(id="log", max_lines=20000, auto_scroll=True)
        yield FittingFooter()

    def on_mount(self) -> None:
        self.sub_title = f"{self.rd.batch.id}/{self.rd.name}"
        size = self.rd.log_file.stat().st_size if self.rd.log_file.exists() else 0
        start = max(0, size - INITIAL_BYTES)
        self.follower = Follower(self.rd.log_file, start)
        self._path_line()
        self.read_more()
        self.query_one(Log).focus()
        self.set_interval(0.5, self.read_more)

    def _path_line(self) -> None:
        follow = self.query_one(Log).auto_scroll
        self.query_one("#log-path", Static).update(
            Text.assemble(
                (_shown(self.rd.log_file), "dim"),
                ("  following" if follow else "  paused (f follows)", "yellow" if not follow else "green"),
                ("  state ", "dim"),
                self.rd.state,
            )
        )

    def read_more(self) -> None:
        # small reads on the main thread: a log grows by a few KB per second at most
        assert self.follower is not None
        lines = self.follower.read_lines(max_bytes=INITIAL_BYTES * 2)
        if lines:
            self.query_one(Log).write_lines([printable(line, one_line=True) for line, _ in lines])

    def action_follow(self) -> None:
        log = self.query_one(Log)
        log.auto_scroll = not log.auto_scroll
        if log.auto_scroll:
            log.scroll_end(animate=False)
        self._path_line()

    def action_top(self) -> None:
        self.query_one(Log).scroll_home(animate=False)

    def action_bottom(self) -> None:
        self.query_one(Log).scroll_end(animate=False)
