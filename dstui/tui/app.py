"""The dstui Textual app: modes (compose, runs, results), the runs home's snapshots, worker errors.

Screens live in :mod:`dstui.tui.screens`; this module only wires them and offers
them :class:`~dstui.tui.face.AppFace`. One thread worker (:meth:`DstuiApp.read_home`)
reads the runs home every tick and posts an immutable
:class:`~dstui.tui.home_snapshot.HomeSnapshot`; the screens render it (``home``), so
the UI thread reads no run folder and probes no lock. Start-up imports textual and
the light core only (no mlflow, torch or deepspeed): those load inside thread
workers when a screen first needs them.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.reactive import var
from textual.worker import WorkerState, get_current_worker

from dstui.core.errors import DstuiError
from dstui.core.terminal import printable
from dstui.tui import run_control
from dstui.tui.commands import DstuiCommands
from dstui.tui.face import StartOptions
from dstui.tui.failure_watch import bell_enabled, set_bell
from dstui.tui.home_snapshot import HomeReader, HomeSnapshot
from dstui.tui.screens.help import HelpScreen
from dstui.tui.screens.results import ResultsScreen
from dstui.tui.screens.runs import RunsScreen
from dstui.tui.terminal_filter import TerminalSafe
from dstui.usecases.options import DEFAULT_PARALLEL

_TERMINAL_SAFE = TerminalSafe()
READY_ENV = "DSTUI_TUI_READY_FILE"  # benchmarks: written once the first frame is up


def _compose_screen():  # noqa: ANN202
    # pydantic spec models cost ~0.2 s to import: only when Compose is first opened
    from dstui.tui.screens.compose import ComposeScreen

    return ComposeScreen()


class HomeRead(Message):
    """A new snapshot of the runs home (from the home worker)."""

    def __init__(self, snapshot: HomeSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class Supervised(Message):
    """What the takeover worker did: supervisors restarted, batches given up on."""

    def __init__(self, restarted: list[str], gave_up: list[str]) -> None:
        super().__init__()
        self.restarted = restarted
        self.gave_up = gave_up


class DstuiApp(App):
    """Compose, launch, watch and compare DeepSpeed experiments."""

    CSS_PATH = "dstui.tcss"
    TITLE = "dstui"
    COMMANDS = App.COMMANDS | {DstuiCommands}
    MODES = {"compose": _compose_screen, "runs": RunsScreen, "results": ResultsScreen}
    DEFAULT_MODE = "runs"
    BINDINGS = [
        Binding("1", "goto('compose')", "Compose"),
        Binding("2", "goto('runs')", "Runs"),
        Binding("3", "goto('results')", "Results"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        # a text field keeps every key it is given (1, 2, q among them): Escape leaves it (issue 38.6);
        # a screen's own Escape (Back, Clear filter, Done) comes first
        Binding("escape", "leave_field", "Leave field", show=False),
    ]

    #: the newest snapshot of the runs home; screens watch it (``self.watch(app, "home", ...)``)
    home: var[HomeSnapshot | None] = var(None, always_update=True)

    def __init__(
        self,
        *,
        spec_path: str | Path | None = None,
        batch_id: str | None = None,
        live: bool = False,
        parallel: int = DEFAULT_PARALLEL,
        supervise: bool = True,
        watch_s: float = 1.0,
    ) -> None:
        super().__init__()
        self.spec_path: Path | None = Path(spec_path).resolve() if spec_path else None
        self.options = StartOptions(batch_id=batch_id, live=live, parallel=parallel, supervise=supervise, watch_s=watch_s)
        self._home_wake = threading.Event()
        self._home_relist = threading.Event()
        self._home_problem: str | None = None
        self._takeover = None  # the app's takeover policy (its restarts are counted); made in its worker
        self._bell = True

    def get_line_filters(self) -> list:
        """Textual's filters, then :class:`TerminalSafe`: no control character of any widget reaches the terminal."""
        return [*super().get_line_filters(), _TERMINAL_SAFE]

    def notify(self, message: str, *, title: str = "", severity: str = "information", timeout: float | None = None,
               markup: bool = False) -> None:  # fmt: skip
        """A toast; its text is often a run's reason or a spec's error: printable, and never read as markup."""
        super().notify(printable(message), title=printable(title), severity=severity, timeout=timeout, markup=markup)

    def on_mount(self) -> None:
        self.title = "dstui"
        self.call_after_refresh(self._first_frame)
        if self.spec_path is not None and not self.spec_path.is_file():
            # the app opens on Runs: without this a mistyped spec path would look opened, and only
            # Compose (or a launch) would show it is not there
            self.notify(
                f"{self.spec_path} does not exist: Compose (1) starts a new spec there; ctrl+s saves it",
                title="no such spec", severity="warning", timeout=12,
            )  # fmt: skip
        self.read_home()
        if self.options.supervise:
            self.take_over()
            self.set_interval(run_control.TAKEOVER_EVERY_S, self.take_over)  # a supervisor that dies while we watch

    # -- the runs home, read off the UI thread ------------------------------

    @work(thread=True, exclusive=True, group="home", exit_on_error=False, name="runs home")
    def read_home(self) -> None:
        """Every tick (or at once when asked): a snapshot of the runs home, posted to the app.

        (Not ``watch_home``: Textual would call that on every change of ``home``.)"""
        self._bell = bell_enabled()  # the settings file: read here, not on the UI thread
        reader = HomeReader()
        worker = get_current_worker()
        first = True
        while not worker.is_cancelled:
            relist = self._home_relist.is_set()
            self._home_relist.clear()
            self._home_wake.clear()
            self.post_message(HomeRead(reader.take(relist=relist)))
            if first:
                first = False
                warm_imports()
                # what exists now (modules, the app's widgets) lives as long as the app: out of the collector's
                # full passes, which otherwise walk it all and stopped the UI thread for 50-500 ms (gen 2)
                gc.freeze()
            deadline = time.monotonic() + self.options.watch_s
            # in slices: a quitting app must not wait a whole tick for this thread
            while not worker.is_cancelled and (left := deadline - time.monotonic()) > 0:
                if self._home_wake.wait(min(left, 0.1)):
                    break

    def refresh_home(self, *, relist: bool = False) -> None:
        if relist:
            self._home_relist.set()
        self._home_wake.set()

    def on_home_read(self, message: HomeRead) -> None:
        snap = message.snapshot
        self.home = snap
        self.sub_title = snap.label  # where the runs are, when dstui chose it
        for a in snap.alerts:  # a run that fails, hangs or is flagged: a toast (and the bell) the moment it is seen
            self.notify(f"{a.run} ({a.batch}): {a.text}", title=a.title, severity="error", timeout=15)
        if snap.alerts and self._bell:
            self.bell()
        if snap.problem and snap.problem != self._home_problem:
            self.notify(snap.problem, title="runs home", severity="error", timeout=15)
        self._home_problem = snap.problem

    def toggle_bell(self) -> None:
        self._bell = not self._bell
        set_bell(self._bell)
        self.notify(f"bell on failures: {'on' if self._bell else 'off'}")

    @work(thread=True, exclusive=True, group="supervise", exit_on_error=False, name="take over")
    def take_over(self) -> None:
        """Restart supervisors of unfinished batches (leave and come back), by `dstui status`'s rule."""
        if self._takeover is None:
            self._takeover = run_control.new_takeover()
        _, restarted, gave_up = run_control.take_over(self._takeover)
        self.post_message(Supervised(restarted, gave_up))

    def on_supervised(self, message: Supervised) -> None:
        if message.restarted:
            self.notify("took over: " + ", ".join(message.restarted))
        for note in message.gave_up:
            self.notify(note, title="supervisor keeps stopping", severity="error", timeout=15)
        self.refresh_home()  # the supervised flags as they are now

    def _first_frame(self) -> None:
        marker = os.environ.get(READY_ENV)
        if marker:
            Path(marker).write_text(f"{time.time()}\n")

    # -- navigation ---------------------------------------------------------

    def action_goto(self, mode: str) -> None:
        if self.current_mode != mode:
            self.switch_mode(mode)
        else:
            # already there: back to the mode's base screen (e.g. leave the live view)
            while len(self.screen_stack) > 1:
                self.pop_screen()

    def action_leave_field(self) -> None:
        """Take the focus off a text field, so the screen's and the app's keys work again."""
        from textual.widgets import Input, TextArea

        if isinstance(self.focused, (Input, TextArea)):
            self.screen.set_focus(None)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def open_spec(self, path: str | Path) -> None:
        """Make a spec the current one (compose shows it, launch uses it)."""
        self.spec_path = Path(path).resolve()
        from dstui.tui.screens.compose import ComposeScreen

        self.switch_mode("compose")
        screen = self.screen
        if isinstance(screen, ComposeScreen):
            screen.request_open(self.spec_path)  # asks first when the open spec has unsaved edits

    def _compose(self):  # noqa: ANN202 - the ComposeScreen once it was opened, else None (its module loads lazily)
        screen = self.get_screen_for_mode("compose")
        if screen is None:
            return None
        from dstui.tui.screens.compose import ComposeScreen  # loaded already: the screen exists

        return screen if isinstance(screen, ComposeScreen) else None

    def compose_draft(self):  # noqa: ANN201 - a SpecDraft or None (spec models load lazily)
        """The spec open in Compose when it has edits not saved (launch that, not its file); else None."""
        screen = self._compose()
        return screen.draft() if screen is not None else None

    def compose_blocker(self) -> str | None:
        """Why the spec open in Compose must not be launched (a field marked ✗, a spec error); else None."""
        screen = self._compose()
        return screen.launch_blocker() if screen is not None else None

    async def action_quit(self) -> None:
        """Quit; with unsaved edits in Compose, only after the user says so."""
        screen = self._compose()
        if screen is not None and screen.dirty:
            screen.ask_discard("Quit", self.exit)
            return
        self.exit()

    def launch_current(self) -> None:
        self.switch_mode("runs")
        screen = self.get_screen_for_mode("runs")
        if isinstance(screen, RunsScreen):
            screen.action_launch()

    def tune_current(self) -> None:
        """The Tune screen on the current spec's file (edits must be saved: the search resumes from the file)."""
        if self.spec_path is None or not self.spec_path.is_file():
            self.notify("open or save a spec first (Compose, ctrl+o / ctrl+s)", severity="warning")
            return
        if self.compose_draft() is not None:
            self.notify("the spec has unsaved edits: save them (ctrl+s) first; a search runs from the file", severity="warning")
            return
        from dstui.tui.screens.tune import TuneScreen

        self.push_screen(TuneScreen(self.spec_path))

    def get_screen_for_mode(self, mode: str):  # noqa: ANN201 - textual's Screen
        stack = self._screen_stacks.get(mode) or []
        return stack[0] if stack else None

    # -- one place where worker failures become visible ---------------------
    # Textual posts Worker.StateChanged to the worker's own node without bubbling: a screen's worker
    # reaches this only through its screen's handler (the Runs and Compose screens forward theirs)

    def on_worker_state_changed(self, event) -> None:  # noqa: ANN001 - Worker.StateChanged
        if event.state != WorkerState.ERROR:
            return
        err = event.worker.error
        if isinstance(err, DstuiError):
            text = str(err)
        else:
            text = f"{type(err).__name__}: {err}"
        self.notify(text, title=f"{event.worker.name} failed", severity="error", timeout=12)


def warm_imports() -> None:
    """Load what the Live and Log views need (numpy, plotext, their modules) off the UI thread, after the
    first snapshot: importing them there froze the first `v` for up to 1.4 s (benchmarks/tui_ui_thread.py)."""
    import numpy  # noqa: F401
    import rich.ansi  # noqa: F401 - a plot's first render (textual-plotext reads plotext's ANSI output)

    import dstui.tui.screens.live  # noqa: F401
    import dstui.tui.screens.log  # noqa: F401


def main(**kwargs) -> int:  # noqa: ANN003
    DstuiApp(**kwargs).run()
    return 0
