"""The main screen: batches, their runs live from the run folders; launch, cancel, retry.

What it shows is :class:`~dstui.tui.widgets.batch_browser.BatchBrowser` (the
tables, the gpus each run has, the time bar); what its keys do to batches is
:mod:`dstui.tui.run_control`, run in thread workers, with the same functions
and defaults as `dstui run`.
"""

from __future__ import annotations

import time
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header

from dstui.core.errors import DstuiError
from dstui.core.rundir import FINAL_STATES, RETRIABLE_STATES, BatchDir, RunDir
from dstui.tui import run_control
from dstui.tui.screens.confirm import ConfirmScreen
from dstui.tui.widgets.batch_browser import BatchBrowser
from dstui.tui.widgets.fitting_footer import FittingFooter
from dstui.usecases.options import DEFAULT_PARALLEL


class Launched(Message):
    def __init__(self, launched: run_control.Launched) -> None:
        super().__init__()
        self.launched = launched


class LaunchRefused(Message):
    """`dstui run` would have refused it with this line; nothing was launched."""

    def __init__(self, spec: Path, text: str) -> None:
        super().__init__()
        self.spec = spec
        self.text = text


class NeedsForce(Message):
    """Some runs of the spec cannot work here: ask before launching them anyway."""

    def __init__(self, spec: Path, text: str, draft: object = None) -> None:
        super().__init__()
        self.spec = spec
        self.text = text
        self.draft = draft  # the Compose edits being launched (a SpecDraft), if any


class Supervised(Message):
    def __init__(self, live: dict[str, bool], restarted: list[str], gave_up: list[str]) -> None:
        super().__init__()
        self.live = live
        self.restarted = restarted
        self.gave_up = gave_up


class RunsScreen(Screen):
    TITLE = "Runs"
    # one string per paragraph: the help screen wraps them to its width (a hard-wrapped line would break twice)
    HELP = (
        "Batches (top) and the runs of the highlighted batch, read live from their "
        "run folders. Runs go on when you quit; start dstui again to watch them.\n"
        "l launches the spec open in Compose (or `dstui tui SPEC`) like `dstui run`: the same checks "
        "(a refusal is said in the spec line), predicted-OOM runs skipped when the spec says so, "
        "runs sharing the box on disjoint GPUs (the gpus column). R resumes the highlighted batch "
        "from its spec like `dstui run SPEC --resume BATCH`: done runs kept, the others run again.\n"
        "Under the runs: where the highlighted run's time went, and the batch's "
        "step share (optimizer steps / wall time). Mark runs with space, then v "
        "opens the live view on them (no marks: the batch)."
    )

    BINDINGS = [
        Binding("l", "launch", "Launch"),
        Binding("v,enter", "live", "Live"),
        Binding("space", "mark", "Mark"),
        Binding("a", "mark_all", "Mark all", show=False),
        Binding("c", "cancel", "Cancel"),
        Binding("C", "cancel_batch", "Cancel batch", show=False),
        Binding("r", "retry", "Retry"),
        Binding("R", "resume", "Resume", show=False),
        Binding("o", "log", "Log"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._last_takeover = time.monotonic()
        self._takeover = None  # this screen's takeover policy (its restarts are counted); made in its worker

    def on_worker_state_changed(self, event) -> None:  # noqa: ANN001 - Worker.StateChanged (does not bubble)
        self.app.on_worker_state_changed(event)  # type: ignore[attr-defined]  (a failure said, not swallowed)

    def compose(self) -> ComposeResult:
        yield Header()
        yield BatchBrowser(id="runs-body")
        yield FittingFooter()

    @property
    def browser(self) -> BatchBrowser:
        return self.query_one(BatchBrowser)

    @property
    def batch(self) -> BatchDir | None:
        """The highlighted batch."""
        return self.browser.batch

    @property
    def _rows(self) -> dict[str, tuple]:
        """The runs table's cells by run name (what it shows)."""
        return self.browser.runs_table.cells

    def on_mount(self) -> None:
        browser = self.browser
        browser.setup()
        browser.show_spec(getattr(self.app, "spec_path", None))
        browser.refresh_batches(force=True)
        app = self.app
        if getattr(app, "start_batch", None):
            browser.select_batch(app.start_batch)  # type: ignore[attr-defined]
        browser.refresh_runs()
        browser.runs_table.focus()
        if getattr(app, "supervise", True):
            self.take_over()
        self.set_interval(getattr(app, "watch_s", 1.0), self._tick)
        if getattr(app, "start_live", False) and self.batch is not None:
            app.start_live = False  # type: ignore[attr-defined]
            self.call_after_refresh(self.action_live)

    def on_screen_resume(self) -> None:
        self.browser.show_spec(getattr(self.app, "spec_path", None))

    def _tick(self) -> None:
        self.browser.tick()
        now = time.monotonic()
        if getattr(self.app, "supervise", True) and now - self._last_takeover > run_control.TAKEOVER_EVERY_S:
            self._last_takeover = now
            self.take_over()  # a supervisor that died while we watch is replaced too

    def select_batch(self, batch_id: str) -> None:
        self.browser.select_batch(batch_id)

    def current_run(self) -> RunDir | None:
        return self.browser.current_run()

    def action_mark(self) -> None:
        self.browser.mark()

    def action_mark_all(self) -> None:
        self.browser.mark_all()

    # -- actions ---------------------------------------------------------------

    def action_live(self) -> None:
        from dstui.tui.screens.live import LiveScreen

        if self.batch is None:
            self.notify("no batch yet: l launches the open spec", severity="warning")
            return
        runs = [rd for rd in self.batch.runs() if rd.name in self.browser.marked]
        if not runs:
            cur = self.current_run()
            focused_runs = self.focused is self.query_one("#runs", DataTable)
            runs = self.batch.runs()
            if len(runs) > 8 and cur is not None and focused_runs:
                runs = [cur]
        self.app.push_screen(LiveScreen(self.batch, runs[:8]))

    def action_log(self) -> None:
        from dstui.tui.screens.log import LogScreen

        rd = self.current_run()
        if rd is None:
            self.notify("no run selected", severity="warning")
            return
        self.app.push_screen(LogScreen(rd))

    def action_cancel(self) -> None:
        if self.focused is self.query_one("#batches", DataTable):
            self.action_cancel_batch()  # on the batches table, c means the highlighted batch
            return
        rd = self.current_run()
        if rd is None:
            return
        if rd.state in FINAL_STATES:
            self.notify(f"{rd.name} is already {rd.state}", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.cancel_run(rd)

        self.app.push_screen(ConfirmScreen(f"Cancel {rd.name}? Its whole process group is killed."), answer)

    def action_cancel_batch(self) -> None:
        """Cancel every unfinished run of the highlighted batch, once confirmed (`dstui cancel BATCH`)."""
        b = self.batch
        if b is None:
            return
        runs = run_control.unfinished(b)
        if not runs:
            self.notify(f"{b.id}: every run has already ended", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.cancel_batch(b)

        question = f"Cancel batch {b.id}? Its {len(runs)} unfinished run(s) are stopped (process groups killed)."
        self.app.push_screen(ConfirmScreen(question), answer)

    @work(thread=True, group="control", exit_on_error=False, name="cancel batch")
    def cancel_batch(self, b: BatchDir) -> None:
        runs = run_control.cancel_batch(b)
        self.app.call_from_thread(self.notify, f"cancel requested: {len(runs)} run(s) of {b.id}")

    @work(thread=True, group="control", exit_on_error=False, name="cancel")
    def cancel_run(self, rd: RunDir) -> None:
        run_control.cancel(rd)
        self.app.call_from_thread(self.notify, f"cancel requested: {rd.name}")

    def action_retry(self) -> None:
        rd = self.current_run()
        if rd is None:
            return
        if rd.state not in RETRIABLE_STATES:  # the CLI's rule (dstui retry); a done run: dstui retry --force
            self.notify(f"{rd.name} is {rd.state}; only failed, killed or skipped runs are retried "
                        "(a done run again: dstui retry --force)", severity="warning")  # fmt: skip
            return
        self.retry_run(rd)

    @work(thread=True, group="control", exit_on_error=False, name="retry")
    def retry_run(self, rd: RunDir) -> None:
        try:
            run_control.retry(rd, lambda text: self.app.call_from_thread(self.notify, text))
        except DstuiError as e:  # a screen's worker error never reaches the app's handler: said here
            self.app.call_from_thread(self.notify, str(e), title="not retried", severity="error", timeout=12)

    def action_launch(self) -> None:
        # a field marked ✗ in Compose is not in its spec: launching would run something else than it shows
        why = self.app.compose_blocker() if hasattr(self.app, "compose_blocker") else None
        if why:
            self.notify(f"not launched: {why} (fix it in Compose: 1)", severity="error", timeout=8)
            return
        # the spec open in Compose: as edited there when it has unsaved edits (its file is not written)
        draft = self.app.compose_draft() if hasattr(self.app, "compose_draft") else None
        spec = getattr(self.app, "spec_path", None)
        if draft is not None:
            spec = draft.origin or Path.cwd() / f"{draft.data.get('name') or 'experiment'}.yaml"
        if not spec:
            self.notify("open or compose a spec first (1, or ctrl+p: Open spec)", severity="warning")
            return
        self.notify(f"validating {Path(spec).name}{' (as edited, not saved)' if draft else ''} ...")
        self.launch(Path(spec), draft)

    def action_resume(self) -> None:
        """Continue the highlighted batch from the spec it was launched from (`dstui run SPEC --resume BATCH`)."""
        b = self.batch
        if b is None:
            return
        spec = run_control.resume_spec(b)
        if spec is None:
            self.notify(f"{b.id}: its spec file is gone; `dstui run SPEC --resume {b.id}` names another",
                        severity="warning")  # fmt: skip
            return
        self.notify(f"validating {spec.name} to resume {b.id} ...")
        self.launch(spec, resume=b.id)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, name="launch")
    def launch(self, spec: Path, draft=None, force: bool = False, resume: str | None = None) -> None:  # noqa: ANN001 - a SpecDraft (spec models load lazily)
        # the service `dstui run` uses, with its defaults: checks, folders, skips, a detached supervisor
        parallel = getattr(self.app, "parallel", DEFAULT_PARALLEL)
        say = lambda m: self.app.call_from_thread(self.notify, m)  # noqa: E731
        out = run_control.launch(spec, parallel, say, draft, force=force, resume=resume)
        if isinstance(out, run_control.Refused):
            self.post_message(NeedsForce(spec, out.text, draft) if out.forceable else LaunchRefused(spec, out.text))
            return
        self.post_message(Launched(out))

    def on_needs_force(self, message: NeedsForce) -> None:
        text = message.text.replace(" (--force launches anyway)", "")

        def answer(yes: bool | None) -> None:
            if yes:
                self.launch(message.spec, message.draft, force=True)

        self.app.push_screen(ConfirmScreen(f"{text}\n\nLaunch them anyway?"), answer)

    def on_launch_refused(self, message: LaunchRefused) -> None:
        self.browser.show_refusal(message.spec, message.text)
        self.notify(message.text, title="not launched", severity="error", timeout=15)

    def on_launched(self, message: Launched) -> None:
        out = message.launched
        self.browser.show_refusal(None, None)
        self.notify(out.text())
        for name, reason in out.skipped.items():
            self.notify(f"{name}: {reason}", severity="warning")
        for note in out.notes:
            self.notify(note, severity="warning", timeout=10)
        self.browser.live[out.batch_id] = True
        self.select_batch(out.batch_id)

    @work(thread=True, exclusive=True, group="supervise", exit_on_error=False, name="take over")
    def take_over(self) -> None:
        """Restart supervisors of unfinished batches (leave and come back), by `dstui status`'s rule."""
        if self._takeover is None:
            self._takeover = run_control.new_takeover()
        self.post_message(Supervised(*run_control.take_over(self._takeover)))

    def on_supervised(self, message: Supervised) -> None:
        self.browser.live.update(message.live)
        if message.restarted:
            self.notify("took over: " + ", ".join(message.restarted))
        for note in message.gave_up:
            self.notify(note, title="supervisor keeps stopping", severity="error", timeout=15)
        self.browser.refresh_batches(force=True)
