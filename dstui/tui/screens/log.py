"""A run's stdout.log (all ranks), following as it grows.

The log is read in a thread worker (new bytes only, twice a second) and its
lines posted to the screen; the run's state comes from the app's snapshots of
the runs home. The UI thread reads no file.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Log, Static

from dstui.core import paths
from dstui.core.records import Follower
from dstui.core.rundir import RunDir
from dstui.core.terminal import printable
from dstui.tui.home_snapshot import HomeSnapshot
from dstui.tui.widgets.fitting_footer import FittingFooter

INITIAL_BYTES = 256 * 1024


def _shown(path: Path) -> str:
    """The path relative to the dstui home when it is inside it (shorter, and stable)."""
    try:
        return str(path.relative_to(paths.home()))
    except ValueError:
        return str(path)


class LogRead(Message):
    def __init__(self, lines: list[str], shown_path: str) -> None:
        super().__init__()
        self.lines = lines
        self.shown_path = shown_path


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
        self.shown_path = ""
        self.state = ""
        self._busy = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="log-path")
        yield Log(id="log", max_lines=20000, auto_scroll=True)
        yield FittingFooter()

    def on_mount(self) -> None:
        self.sub_title = f"{self.rd.batch.id}/{self.rd.name}"
        self._path_line()
        self.query_one(Log).focus()
        self.watch(self.app, "home", self._show_state)
        self._poll()
        self.set_interval(0.5, self._poll)

    def _show_state(self, home: HomeSnapshot | None) -> None:
        batch = home.batch(self.rd.batch.id) if home is not None else None
        run = batch.run(self.rd.name) if batch is not None else None
        state = run.state if run is not None else ""
        if state != self.state:
            self.state = state
            self._path_line()

    def _path_line(self) -> None:
        follow = self.query_one(Log).auto_scroll
        self.query_one("#log-path", Static).update(
            Text.assemble(
                (self.shown_path, "dim"),
                ("  following" if follow else "  paused (f follows)", "yellow" if not follow else "green"),
                ("  state ", "dim"),
                self.state,
            )
        )

    def _poll(self) -> None:
        if not self._busy:  # the previous read still going: skip this tick
            self._busy = True
            self.read_more()

    @work(thread=True, group="log-read", exit_on_error=False, name="log")
    def read_more(self) -> None:
        try:
            if self.follower is None:  # the last 256 KB first
                size = self.rd.log_file.stat().st_size if self.rd.log_file.exists() else 0
                self.follower = Follower(self.rd.log_file, max(0, size - INITIAL_BYTES))
                self.post_message(LogRead([], _shown(self.rd.log_file)))
            lines = self.follower.read_lines(max_bytes=INITIAL_BYTES * 2)
            if lines:
                self.post_message(LogRead([printable(line, one_line=True) for line, _ in lines], ""))
        finally:
            self._busy = False

    def on_log_read(self, message: LogRead) -> None:
        if message.shown_path:
            self.shown_path = message.shown_path
            self._path_line()
        if message.lines:
            self.query_one(Log).write_lines(message.lines)

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
