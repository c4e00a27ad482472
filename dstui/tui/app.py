"""The dstui Textual app: modes (compose, runs, results), shared state, worker errors.

Screens live in :mod:`dstui.tui.screens`; this module only wires them. Start-up
imports textual and the light core only (no mlflow, torch or deepspeed): those
load inside thread workers when a screen first needs them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.worker import WorkerState

from dstui.core import paths
from dstui.core.errors import DstuiError
from dstui.core.terminal import printable
from dstui.tui.commands import DstuiCommands
from dstui.tui.failure_watch import FailureWatch, bell_enabled, set_bell
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
    ]

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
        self.start_batch = batch_id
        self.start_live = live
        self.parallel = parallel  # for batches launched here: `dstui run --parallel` (0 = auto)
        self.supervise = supervise  # take over unfinished batches on start (off in snapshots)
        self.watch_s = watch_s

    def get_line_filters(self) -> list:
        """Textual's filters, then :class:`TerminalSafe`: no control character of any widget reaches the terminal."""
        return [*super().get_line_filters(), _TERMINAL_SAFE]

    def notify(self, message: str, *, title: str = "", severity: str = "information", timeout: float | None = None,
               markup: bool = False) -> None:  # fmt: skip
        """A toast; its text is often a run's reason or a spec's error: printable, and never read as markup."""
        super().notify(printable(message), title=printable(title), severity=severity, timeout=timeout, markup=markup)

    def on_mount(self) -> None:
        self.title = "dstui"
        self.sub_title = paths.home_label(implicit_only=True)  # where the runs are, when dstui chose it
        self.call_after_refresh(self._first_frame)
        if self.spec_path is not None and not self.spec_path.is_file():
            # the app opens on Runs: without this a mistyped spec path would look opened, and only
            # Compose (or a launch) would show it is not there
            self.notify(
                f"{self.spec_path} does not exist: Compose (1) starts a new spec there; ctrl+s saves it",
                title="no such spec", severity="warning", timeout=12,
            )  # fmt: skip
        self.failures = FailureWatch()
        self.set_interval(self.watch_s, self.watch_failures)

    def watch_failures(self) -> None:
        """A run that fails, hangs or is flagged: a toast (and the bell) the moment it is seen."""
        alerts = self.failures.scan(paths.runs_dir())
        for a in alerts:
            self.notify(f"{a.run} ({a.batch}): {a.text}", title=a.title, severity="error", timeout=15)
        if alerts and bell_enabled():
            self.bell()

    def toggle_bell(self) -> None:
        on = not bell_enabled()
        set_bell(on)
        self.notify(f"bell on failures: {'on' if on else 'off'}")

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

    def compose_draft(self):  # noqa: ANN201 - a SpecDraft or None (spec models load lazily)
        """The spec open in Compose when it has edits not saved (launch that, not its file); else None."""
        screen = self.get_screen_for_mode("compose")
        return screen.draft() if screen is not None and hasattr(screen, "draft") else None

    def compose_blocker(self) -> str | None:
        """Why the spec open in Compose must not be launched (a field marked ✗, a spec error); else None."""
        screen = self.get_screen_for_mode("compose")
        return screen.launch_blocker() if screen is not None and hasattr(screen, "launch_blocker") else None

    async def action_quit(self) -> None:
        """Quit; with unsaved edits in Compose, only after the user says so."""
        screen = self.get_screen_for_mode("compose")
        if screen is not None and getattr(screen, "dirty", False):
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


def main(**kwargs) -> int:  # noqa: ANN003
    DstuiApp(**kwargs).run()
    return 0
