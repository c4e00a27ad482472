"""The main screen: batches, their runs live from the run folders; launch, cancel, retry."""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from dstui.core import paths
from dstui.core.formatting import eta, fmt_bytes, fmt_num
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir, list_batches
from dstui.tui.screens.confirm import ConfirmScreen
from dstui.tui.widgets.bisect_progress import BisectProgress

STATE_STYLE = {
    "queued": "dim",
    "starting": "yellow",
    "running": "bold yellow",
    "done": "green",
    "failed": "bold red",
    "killed": "magenta",
    "skipped": "dim",
}
MAX_BATCHES = 30
TAKEOVER_GRACE_S = 30.0
RUN_COLUMNS = ("", "run", "state", "step", "ETA", "loss", "iter s", "tok/s", "peak mem", "reason")


def run_cells(st: dict, marked: bool) -> tuple:
    """One runs-table row from a status.json (pure, so it is cheap to compare)."""
    last = st.get("last") or {}
    state = st.get("state", "?")
    label = state + (f" {st['verdict']}" if st.get("verdict") else "")
    total = st.get("steps_total") or "?"
    diverged = (st.get("diverged") or {}).get("message")  # the guard's flag: the row turns red
    name = Text(st.get("name", "?"), style="bold red") if diverged else st.get("name", "?")
    return (
        "✓" if marked else " ",
        name,
        Text(label, style=STATE_STYLE.get(state, "")),
        f"{st.get('steps_done') or 0}/{total}",
        eta(st),
        fmt_num(last.get("loss")),
        fmt_num(last.get("iter_time"), ".3f"),
        fmt_num(last.get("tokens_per_s"), ".0f"),
        fmt_bytes(last.get("mem_peak")),
        Text((st.get("reason") or diverged)[:60], style="red") if diverged else (st.get("reason") or "")[:60],
    )


def batch_cells(b: BatchDir, live: bool) -> tuple:
    info = b.info()
    runs = b.runs()
    states = [r.state for r in runs]
    done = sum(s == "done" for s in states)
    bad = sum(s in ("failed", "killed") for s in states)
    active = sum(s not in FINAL_STATES for s in states)
    if info.get("finalized") and not active:
        where = Text("finished", style="green" if not bad else "red")
    elif live:
        where = Text("live", style="bold yellow")
    else:
        where = Text("unsupervised", style="magenta")
    created = time.strftime("%m-%d %H:%M", time.localtime(info.get("created", 0)))
    counts = f"{done}/{len(runs)} done" + (f", {bad} bad" if bad else "")
    return (b.id, counts, where, created)


def _supervised(b: BatchDir) -> bool:
    if b.info().get("finalized"):
        return False
    from dstui.execute.supervisor import is_supervised  # lazily: not on the start path

    return is_supervised(b)


class Launched(Message):
    def __init__(self, batch_id: str, n_runs: int) -> None:
        super().__init__()
        self.batch_id = batch_id
        self.n_runs = n_runs


class Supervised(Message):
    def __init__(self, live: dict[str, bool], restarted: list[str]) -> None:
        super().__init__()
        self.live = live
        self.restarted = restarted


class RunsScreen(Screen):
    TITLE = "Runs"
    HELP = """Batches (top) and the runs of the highlighted batch, read live from their run folders.
Runs go on when you quit; start dstui again to watch them. Launch uses the spec open in Compose
(or `dstui tui SPEC`). Mark runs with space, then v opens the live view on them (no marks: the batch)."""

    BINDINGS = [
        Binding("l", "launch", "Launch"),
        Binding("v,enter", "live", "Live"),
        Binding("space", "mark", "Mark"),
        Binding("a", "mark_all", "Mark all", show=False),
        Binding("c", "cancel", "Cancel"),
        Binding("r", "retry", "Retry"),
        Binding("o", "log", "Log"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.batch: BatchDir | None = None
        self.marked: set[str] = set()
        self._rows: dict[str, tuple] = {}
        self._batch_rows: dict[str, tuple] = {}
        self._live: dict[str, bool] = {}
        self._last_batches = 0.0
        self._last_takeover = time.monotonic()

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="runs-body"):
            yield Static(id="spec-line")
            yield BisectProgress(id="bisect")
            yield DataTable(id="batches", cursor_type="row", zebra_stripes=False)
            yield DataTable(id="runs", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        bt = self.query_one("#batches", DataTable)
        bt.add_columns("batch", "runs", "state", "created")
        rt = self.query_one("#runs", DataTable)
        rt.add_columns(*RUN_COLUMNS)
        self._show_spec()
        self.refresh_batches(force=True)
        app = self.app
        if getattr(app, "start_batch", None):
            self.select_batch(app.start_batch)  # type: ignore[attr-defined]
        self.refresh_runs()
        rt.focus()
        if getattr(app, "supervise", True):
            self.take_over()
        self.set_interval(getattr(app, "watch_s", 1.0), self._tick)
        if getattr(app, "start_live", False) and self.batch is not None:
            app.start_live = False  # type: ignore[attr-defined]
            self.call_after_refresh(self.action_live)

    def on_screen_resume(self) -> None:
        self._show_spec()

    def _show_spec(self) -> None:
        spec = getattr(self.app, "spec_path", None)
        line = self.query_one("#spec-line", Static)
        if spec:
            try:
                shown = Path(spec).relative_to(Path.cwd())
            except ValueError:
                shown = spec
            line.update(Text.assemble(("spec ", "dim"), str(shown), ("  l launches it", "dim")))
        else:
            line.update(Text("no spec open: 1 composes or opens one (ctrl+p: Open spec ...)", style="dim"))

    # -- reading the folders -------------------------------------------------

    def _tick(self) -> None:
        self.query_one(BisectProgress).refresh_from(paths.runs_dir())
        self.refresh_batches()
        self.refresh_runs()
        now = time.monotonic()
        if getattr(self.app, "supervise", True) and now - self._last_takeover > TAKEOVER_GRACE_S:
            self._last_takeover = now
            self.take_over()  # a supervisor that died while we watch is replaced too

    def refresh_batches(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_batches < 5.0:
            return
        self._last_batches = now
        batches = list_batches(paths.runs_dir())[:MAX_BATCHES]
        self._live = {b.id: _supervised(b) for b in batches}
        table = self.query_one("#batches", DataTable)
        ids = [b.id for b in batches]
        if ids != list(self._batch_rows):
            keep = self.batch.id if self.batch else None
            table.clear()
            self._batch_rows = {}
            for b in batches:
                cells = batch_cells(b, self._live.get(b.id, False))
                table.add_row(*cells, key=b.id)
                self._batch_rows[b.id] = cells
            if keep in self._batch_rows:
                table.move_cursor(row=ids.index(keep), animate=False)
            elif batches:
                self.batch = batches[0]
        else:
            for b in batches:
                self._update_row(table, b.id, self._batch_rows, batch_cells(b, self._live.get(b.id, False)))
        if self.batch is None and batches:
            self.batch = batches[0]

    def _update_row(self, table: DataTable, key: str, cache: dict, cells: tuple) -> None:
        old = cache.get(key)
        if old == cells:
            return
        for i, (a, b) in enumerate(zip(old or (), cells, strict=False)):
            if a != b:
                table.update_cell(key, table.ordered_columns[i].key, b)
        cache[key] = cells

    def refresh_runs(self) -> None:
        table = self.query_one("#runs", DataTable)
        runs = self.batch.runs() if self.batch else []
        names = [r.name for r in runs]
        if names != list(self._rows):
            table.clear()
            self._rows = {}
            for rd in runs:
                cells = run_cells({"name": rd.name, **rd.status()}, rd.name in self.marked)
                table.add_row(*cells, key=rd.name)
                self._rows[rd.name] = cells
            return
        for rd in runs:
            cells = run_cells({"name": rd.name, **rd.status()}, rd.name in self.marked)
            self._update_row(table, rd.name, self._rows, cells)

    def select_batch(self, batch_id: str) -> None:
        b = BatchDir(paths.runs_dir() / batch_id)
        if not b.batch_file.exists():
            return
        self.refresh_batches(force=True)
        self.batch = b
        self.marked.clear()
        table = self.query_one("#batches", DataTable)
        if batch_id in self._batch_rows:
            table.move_cursor(row=list(self._batch_rows).index(batch_id), animate=False)
        self.refresh_runs()

    @on(DataTable.RowHighlighted, "#batches")
    def _batch_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key and (self.batch is None or self.batch.id != key):
            self.batch = BatchDir(paths.runs_dir() / key)
            self.marked.clear()
            self.refresh_runs()

    @on(DataTable.RowSelected, "#batches")
    def _batch_selected(self, event: DataTable.RowSelected) -> None:
        self.query_one("#runs", DataTable).focus()

    # -- selection -----------------------------------------------------------

    def current_run(self) -> RunDir | None:
        table = self.query_one("#runs", DataTable)
        if self.batch is None or table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:
            return None
        return RunDir(self.batch.path / str(key)) if key else None

    def action_mark(self) -> None:
        rd = self.current_run()
        if rd is None:
            return
        self.marked.symmetric_difference_update({rd.name})
        self.refresh_runs()
        table = self.query_one("#runs", DataTable)
        table.action_cursor_down()

    def action_mark_all(self) -> None:
        names = set(self._rows)
        self.marked = set() if self.marked >= names else names
        self.refresh_runs()

    # -- actions ---------------------------------------------------------------

    def action_live(self) -> None:
        from dstui.tui.screens.live import LiveScreen

        if self.batch is None:
            self.notify("no batch yet: l launches the open spec", severity="warning")
            return
        runs = [rd for rd in self.batch.runs() if rd.name in self.marked]
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
        rd = self.current_run()
        if rd is None:
            return
        if rd.state in FINAL_STATES:
            self.notify(f"{rd.name} is already {rd.state}", severity="warning")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.cancel_run(rd)

        self.app.push_screen(
            ConfirmScreen(f"Cancel {rd.name}? Its whole process group is killed."), answer
        )

    @work(thread=True, group="control", exit_on_error=False, name="cancel")
    def cancel_run(self, rd: RunDir) -> None:
        from dstui.execute import supervisor

        supervisor.request_cancel(rd)
        self.app.call_from_thread(self.notify, f"cancel requested: {rd.name}")

    def action_retry(self) -> None:
        rd = self.current_run()
        if rd is None:
            return
        if rd.state not in ("failed", "killed"):
            self.notify(f"{rd.name} is {rd.state}; only failed or killed runs are retried", severity="warning")
            return
        self.retry_run(rd)

    @work(thread=True, group="control", exit_on_error=False, name="retry")
    def retry_run(self, rd: RunDir) -> None:
        from dstui.execute import batch, supervisor

        batch.retry(rd)
        self.app.call_from_thread(self.notify, f"queued again: {rd.name} (old attempt kept)")
        # a supervisor that was just finishing the batch may exit without seeing the
        # re-queued run; make sure someone picks it up
        for _ in range(20):
            time.sleep(0.5)
            if rd.state != "queued":
                return
        if not supervisor.is_supervised(rd.batch):
            supervisor.spawn(rd.batch)

    def action_launch(self) -> None:
        spec = getattr(self.app, "spec_path", None)
        if not spec:
            self.notify("open or compose a spec first (1, or ctrl+p: Open spec)", severity="warning")
            return
        self.notify(f"validating {Path(spec).name} ...")
        self.launch(Path(spec))

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, name="launch")
    def launch(self, spec: Path) -> None:
        # the same functions as `dstui run`: validate everything, lay out folders, detach
        from dstui.execute import batch, supervisor

        p = batch.plan(spec, progress=lambda m: self.app.call_from_thread(self.notify, m))
        b = batch.create(p, parallel=getattr(self.app, "parallel", 1))
        supervisor.spawn(b)
        self.post_message(Launched(b.id, len(p.runs)))

    def on_launched(self, message: Launched) -> None:
        self.notify(f"launched {message.batch_id}: {message.n_runs} runs")
        self._live[message.batch_id] = True
        self.select_batch(message.batch_id)

    @work(thread=True, exclusive=True, group="supervise", exit_on_error=False, name="take over")
    def take_over(self) -> None:
        """Restart supervisors of unfinished batches (leave and come back)."""
        from dstui.execute import supervisor

        live: dict[str, bool] = {}
        restarted = []
        for b in list_batches(paths.runs_dir())[:MAX_BATCHES]:
            info = b.info()
            if info.get("finalized") and b.is_finished():
                continue
            if time.time() - info.get("created", 0) < TAKEOVER_GRACE_S:
                continue  # just launched (e.g. by `dstui demo`): its supervisor may still be starting
            if supervisor.ensure_supervised(b):
                restarted.append(b.id)
            live[b.id] = True
        self.post_message(Supervised(live, restarted))

    def on_supervised(self, message: Supervised) -> None:
        self._live.update(message.live)
        if message.restarted:
            self.notify("took over: " + ", ".join(message.restarted))
        self.refresh_batches(force=True)
