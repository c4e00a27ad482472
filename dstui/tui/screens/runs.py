"""The main screen: batches, their runs live from the run folders; launch, cancel, retry.

What it shows is :class:`~dstui.tui.widgets.batch_browser.BatchBrowser` (the
tables, the gpus each run has, the time bar), rendered from the app's snapshots
of the runs home (it reads no file); what its keys do to batches is
:mod:`dstui.tui.run_control`, run in thread workers, with the same functions
and defaults as `dstui run`.
"""

from __future__ import annotations

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
from dstui.tui.face import AppFace, face
from dstui.tui.home_snapshot import HomeSnapshot
from dstui.tui.screens.confirm import ConfirmScreen
from dstui.tui.widgets.batch_browser import BatchBrowser
from dstui.tui.widgets.fitting_footer import FittingFooter


class ReadyToLaunch(Message):
    """The spec passed `dstui run`'s checks: ask, then start."""

    def __init__(self, ready: run_control.Ready) -> None:
        super().__init__()
        self.ready = ready


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


class RunsScreen(Screen):
    TITLE = "Runs"
    # one string per paragraph: the help screen wraps them to its width (a hard-wrapped line would break twice)
    HELP = (
        "Batches (top) and the runs of the highlighted batch, read live from their "
        "run folders. Runs go on when you quit; start dstui again to watch them.\n"
        "iter s and tok/s: a finished run's means over its steps after warm-up (as the report has them); "
        "a live run's last step, dimmed. ETA: from the pace of the steps after warm-up (none before).\n"
        "l launches the spec open in Compose (or `dstui tui SPEC`) like `dstui run`, after asking: the same checks "
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
        self._live_pending = False  # `dstui tui --live`: the Live view once the start batch is shown

    @property
    def face(self) -> AppFace:
        return face(self)

    def on_worker_state_changed(self, event) -> None:  # noqa: ANN001 - Worker.StateChanged (does not bubble)
        self.face.on_worker_state_changed(event)  # a failure said, not swallowed

    def compose(self) -> ComposeResult:
        yield Header()
        yield BatchBrowser(id="runs-body")
        yield FittingFooter()

    @property
    def browser(self) -> BatchBrowser:
        return self.query_one(BatchBrowser)

    @property
    def batch(self) -> BatchDir | None:
        """The highlighted batch's folder (what the keys act on)."""
        view = self.browser.view
        return view.dir if view is not None else None

    @property
    def _rows(self) -> dict[str, tuple]:
        """The runs table's cells by run name (what it shows)."""
        return self.browser.runs_table.cells

    def on_mount(self) -> None:
        browser = self.browser
        options = self.face.options
        browser.show_spec(self.face.spec_path)
        if options.batch_id:
            browser.select_batch(options.batch_id)
            self._live_pending = options.live
        browser.runs_table.focus()
        self.watch(self.app, "home", self._show_home)

    def _show_home(self, home: HomeSnapshot | None) -> None:
        if home is None:
            return
        self.browser.show(home)
        if self._live_pending and self.browser.wanted is None and self.batch is not None:
            self._live_pending = False
            self.call_after_refresh(self.action_live)

    def on_screen_resume(self) -> None:
        self.browser.show_spec(self.face.spec_path)

    def select_batch(self, batch_id: str) -> None:
        self.browser.select_batch(batch_id)

    def current_run(self) -> RunDir | None:
        return self.browser.current_dir()

    def action_mark(self) -> None:
        self.browser.mark()

    def action_mark_all(self) -> None:
        self.browser.mark_all()

    # -- actions ---------------------------------------------------------------

    def action_live(self) -> None:
        from dstui.tui.screens.live import LiveScreen

        view = self.browser.view
        if view is None:
            self.notify("no batch yet: l launches the open spec", severity="warning")
            return
        runs = [r.dir for r in view.runs if r.name in self.browser.marked]
        if not runs:
            cur = self.current_run()
            focused_runs = self.focused is self.query_one("#runs", DataTable)
            runs = [r.dir for r in view.runs]
            if len(runs) > 8 and cur is not None and focused_runs:
                runs = [cur]
        self.app.push_screen(LiveScreen(view.dir, runs[:8]))

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
        run = self.browser.current_run()
        if run is None:
            return
        if run.state in FINAL_STATES:
            self.notify(f"{run.name} is already {run.state}", severity="warning")
            return
        rd = run.dir

        def answer(yes: bool | None) -> None:
            if yes:
                self.cancel_run(rd)

        self.app.push_screen(ConfirmScreen(f"Cancel {rd.name}? Its whole process group is killed."), answer)

    def action_cancel_batch(self) -> None:
        """Cancel every unfinished run of the highlighted batch, once confirmed (`dstui cancel BATCH`)."""
        view = self.browser.view
        if view is None:
            return
        runs = view.unfinished
        if not runs:
            self.notify(f"{view.id}: every run has already ended", severity="warning")
            return
        b = view.dir

        def answer(yes: bool | None) -> None:
            if yes:
                self.cancel_batch(b)

        question = f"Cancel batch {b.id}? Its {len(runs)} unfinished run(s) are stopped (process groups killed)."
        self.app.push_screen(ConfirmScreen(question), answer)

    @work(thread=True, group="control", exit_on_error=False, name="cancel batch")
    def cancel_batch(self, b: BatchDir) -> None:
        runs = run_control.cancel_batch(b)
        self.app.call_from_thread(self.notify, f"cancel requested: {len(runs)} run(s) of {b.id}")
        self.face.refresh_home()

    @work(thread=True, group="control", exit_on_error=False, name="cancel")
    def cancel_run(self, rd: RunDir) -> None:
        run_control.cancel(rd)
        self.app.call_from_thread(self.notify, f"cancel requested: {rd.name}")
        self.face.refresh_home()

    def action_retry(self) -> None:
        run = self.browser.current_run()
        if run is None:
            return
        if run.state not in RETRIABLE_STATES:  # the CLI's rule (dstui retry); a done run: dstui retry --force
            self.notify(f"{run.name} is {run.state}; only failed, killed or skipped runs are retried "
                        "(a done run again: dstui retry --force)", severity="warning")  # fmt: skip
            return
        self.retry_run(run.dir)

    @work(thread=True, group="control", exit_on_error=False, name="retry")
    def retry_run(self, rd: RunDir) -> None:
        try:
            run_control.retry(rd, lambda text: self.app.call_from_thread(self.notify, text))
            self.face.refresh_home()
        except DstuiError as e:  # a screen's worker error never reaches the app's handler: said here
            self.app.call_from_thread(self.notify, str(e), title="not retried", severity="error", timeout=12)

    def action_launch(self) -> None:
        # a field marked ✗ in Compose is not in its spec: launching would run something else than it shows
        app = self.face
        why = app.compose_blocker()
        if why:
            self.notify(f"not launched: {why} (fix it in Compose: 1)", severity="error", timeout=8)
            return
        # the spec open in Compose: as edited there when it has unsaved edits (its file is not written)
        draft = app.compose_draft()
        spec = app.spec_path
        if draft is not None:
            spec = draft.origin or Path.cwd() / f"{draft.data.get('name') or 'experiment'}.yaml"
        if not spec:
            self.notify("open or compose a spec first (1, or ctrl+p: Open spec)", severity="warning")
            return
        self.notify(f"validating {Path(spec).name}{' (as edited, not saved)' if draft else ''} ...")
        self.check_launch(Path(spec), draft)

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
        self.check_launch(spec, resume=b.id)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, name="launch")
    def check_launch(self, spec: Path, draft=None, force: bool = False, resume: str | None = None) -> None:  # noqa: ANN001 - a SpecDraft (spec models load lazily)
        # the service `dstui run` uses, with its defaults: the checks first, nothing made yet
        say = lambda m: self.app.call_from_thread(self.notify, m)  # noqa: E731
        out = run_control.prepare(spec, self.face.options.parallel, say, draft, force=force, resume=resume)
        if isinstance(out, run_control.Refused):
            self.post_message(NeedsForce(spec, out.text, draft) if out.forceable else LaunchRefused(spec, out.text))
            return
        self.post_message(ReadyToLaunch(out))

    def on_ready_to_launch(self, message: ReadyToLaunch) -> None:
        """A launch starts runs on this machine (or a cluster's) for a while: asked first (issue 38.6)."""
        ready = message.ready

        def answer(yes: bool | None) -> None:
            if yes:
                self.start_launch(ready)
            else:
                self.notify("not launched")

        self.app.push_screen(ConfirmScreen(ready.question(), yes="Launch" if not ready.options.resume else "Resume"), answer)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, name="launch")
    def start_launch(self, ready: run_control.Ready) -> None:
        # folders, skips, a detached supervisor: as `dstui run` after its checks
        out = run_control.start(ready)
        if isinstance(out, run_control.Refused):
            self.post_message(LaunchRefused(ready.spec, out.text))
            return
        self.post_message(Launched(out))

    def on_needs_force(self, message: NeedsForce) -> None:
        text = message.text.replace(" (--force launches anyway)", "")

        def answer(yes: bool | None) -> None:
            if yes:  # the user has answered for these runs: no second question
                self.start_forced(message.spec, message.draft)

        self.app.push_screen(ConfirmScreen(f"{text}\n\nLaunch them anyway?"), answer)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, name="launch")
    def start_forced(self, spec: Path, draft=None) -> None:  # noqa: ANN001 - a SpecDraft
        say = lambda m: self.app.call_from_thread(self.notify, m)  # noqa: E731
        ready = run_control.prepare(spec, self.face.options.parallel, say, draft, force=True)
        out = run_control.start(ready) if isinstance(ready, run_control.Ready) else ready
        if isinstance(out, run_control.Refused):
            self.post_message(LaunchRefused(spec, out.text))
            return
        self.post_message(Launched(out))

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
        self.select_batch(out.batch_id)
        self.face.refresh_home(relist=True)  # the new batch within a moment, not at the next listing
