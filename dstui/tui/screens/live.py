"""Live view: overlaid loss / iteration time / memory / system plots and a log tail.

A 1 s timer starts a thread worker that reads only the new bytes of each run's
metrics.jsonl, system.jsonl and the focused run's stdout.log (one
:class:`~dstui.core.records.Follower` per file); the parsed delta comes back as a
message and is appended on the main thread, which owns every buffer. A tick
that finds the previous read still going is skipped, so slow disks never pile
up work.

Which run's log is shown: the newest running one (it follows as runs start and
end) until the user picks one with ``n``; ``f`` goes back to following. At small
sizes the four charts are paged (``c``) so each stays legible.
"""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Log, Static

from dstui.core.phases import live_text
from dstui.core.records import Follower
from dstui.core.rundir import BatchDir, RunDir
from dstui.core.terminal import printable
from dstui.tui import live_draw
from dstui.tui.chart_pages import charts_per_page, grid_shape
from dstui.tui.face import face
from dstui.tui.series import Delta, RunSeries
from dstui.tui.widgets.charts import MetricPlot
from dstui.tui.widgets.fitting_footer import FittingFooter

LOG_TAIL_BYTES = 16384


class LiveData(Message):
    def __init__(self, deltas: list[Delta], statuses: list[dict], log_lines: list[str], log_run: str) -> None:
        super().__init__()
        self.deltas = deltas
        self.statuses = statuses
        self.log_lines = log_lines
        self.log_run = log_run


class LiveScreen(Screen):
    TITLE = "Live"
    # one string per paragraph: the help screen wraps them to its width (a hard-wrapped line would break twice)
    HELP = (
        "Overlaid live plots of the chosen runs, read from their run folders every second. "
        "Plots are decimated to the widget width (min/max per column), so long runs stay cheap to draw.\n"
        "Smoothing (s) draws an EMA over the dimmed raw curve. System readings: GPU util/memory/power "
        "when the run has GPUs, else the job's CPU% and RSS (y cycles).\n"
        "The y-axis is set from the steps after each run's warm-up (warmup_steps), so a first step's compile "
        "spike does not flatten the rest; w hides the warm-up steps, l switches to a log scale.\n"
        "Runs with identical values are drawn once as a line, the others as markers (x + o ...) on it, "
        "and the chart title and legend say which runs coincide.\n"
        "The log pane follows the newest running run; n picks another run (the legend underlines it), "
        "f follows the running run again. Small terminals show fewer charts at once: c pages through them."
    )

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "smooth", "Smooth"),
        Binding("l", "log_scale", "Log y"),
        Binding("w", "warmup", "Warm-up"),
        Binding("c", "next_charts", "Charts"),
        Binding("n", "next_log", "Next log"),
        Binding("f", "follow", "Follow"),
        Binding("o", "open_log", "Full log"),
        Binding("m", "memory", "Peak/alloc memory", show=False),
        Binding("y", "system", "System metric", show=False),
    ]

    def __init__(self, batch: BatchDir, runs: list[RunDir]) -> None:
        super().__init__()
        self.batch = batch
        self.runs = runs
        self.series = [RunSeries(rd) for rd in runs]
        self.statuses: list[dict] = [{} for _ in runs]
        self.smooth = False
        self.mem_key = "mem_peak"
        self.system_key: str | None = None
        self.log_index = 0
        self.follow = True  # the log pane shows the newest running run until the user picks one
        self.log_y = False
        self.hide_warmup = False
        self.chart_page = 0
        self._log_follower: Follower | None = None
        self._log_for = ""
        self._busy = False
        self._need_log_reset = True

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="legend")
        with Grid(id="plots"):
            for p in live_draw.PLOTS:
                yield MetricPlot(p.title, xlabel=p.xlabel, id=p.id)
        yield Static(id="log-title")
        yield Log(id="log-tail", max_lines=400, auto_scroll=True)
        yield FittingFooter()

    def on_mount(self) -> None:
        self.sub_title = self.batch.id
        self._poll()
        self.set_interval(face(self).options.watch_s, self._poll)

    PLOT_IDS = tuple(f"#{p.id}" for p in live_draw.PLOTS)

    def on_resize(self) -> None:
        # on 80x24 every row counts: a shorter log tail leaves the plots readable
        self.query_one("#log-tail", Log).styles.height = 4 if self.size.height < 30 else 7
        self._layout_charts()

    def plots(self) -> list[MetricPlot]:
        return [self.query_one(pid, MetricPlot) for pid in self.PLOT_IDS]

    def _layout_charts(self) -> None:
        """Show as many charts as the size keeps legible (4, 2 or 1), the current page of them."""
        per = charts_per_page(self.size.width, self.size.height)
        pages = (len(self.PLOT_IDS) + per - 1) // per
        self.chart_page %= pages
        shown = range(self.chart_page * per, (self.chart_page + 1) * per)
        for i, plot in enumerate(self.plots()):
            plot.display = i in shown
        cols, rows = grid_shape(per, self.size.width, self.size.height)
        grid = self.query_one("#plots", Grid)
        grid.styles.grid_size_columns = cols
        grid.styles.grid_size_rows = rows
        self.refresh_bindings()
        self._show_log_title()

    def visible_plots(self) -> list[MetricPlot]:
        return [p for p in self.plots() if p.display]

    def page_text(self) -> str:
        per = charts_per_page(self.size.width, self.size.height)
        pages = (len(self.PLOT_IDS) + per - 1) // per
        return f"{self.chart_page + 1}/{pages}" if pages > 1 else ""

    # -- reading (worker thread) --------------------------------------------

    def _poll(self) -> None:
        if self._busy:
            return  # the previous read is still going: skip this tick
        self._busy = True
        reset = self._need_log_reset
        self._need_log_reset = False
        self.read_folders(self.log_index, reset)

    @work(thread=True, exclusive=False, group="live-read", exit_on_error=False, name="live view")
    def read_folders(self, log_index: int, reset_log: bool) -> None:
        try:
            import numpy  # noqa: F401 - the charts' plans need it: imported here, not on the UI thread

            deltas = [s.read_new() for s in self.series]
            statuses = [rd.status() for rd in self.runs]
            rd = self.runs[log_index] if self.runs else None
            lines: list[str] = []
            if rd is not None:
                if reset_log or self._log_follower is None:
                    size = rd.log_file.stat().st_size if rd.log_file.exists() else 0
                    self._log_follower = Follower(rd.log_file, max(0, size - LOG_TAIL_BYTES))
                    lines.append("\x00reset")
                got = self._log_follower.read_lines(max_bytes=LOG_TAIL_BYTES * 4)
                lines.extend(line for line, _ in got)
            self.post_message(LiveData(deltas, statuses, lines, rd.name if rd else ""))
        finally:
            self._busy = False

    # -- drawing (main thread) ----------------------------------------------

    def on_live_data(self, message: LiveData) -> None:
        changed = False
        for s, d in zip(self.series, message.deltas, strict=True):
            changed |= s.apply(d)
        status_changed = message.statuses != self.statuses
        self.statuses = message.statuses
        if changed:
            self.redraw()
        if status_changed and self.follow:
            self._follow_running()
        # a run in a phase ('building op shm 12s'): its seconds count on every read, though its status did not change
        counting = any(live_text(st) and not st.get("steps_done") for st in self.statuses)
        if changed or status_changed or counting or message.log_lines[:1] == ["\x00reset"]:
            self._update_legend(message.log_run if message.log_lines[:1] == ["\x00reset"] else self._log_for)
        log = self.query_one("#log-tail", Log)
        lines = message.log_lines
        if lines and lines[0] == "\x00reset":
            log.clear()
            lines = lines[1:]
            self._log_for = message.log_run
        if message.log_lines[:1] == ["\x00reset"] or status_changed:
            self._show_log_title()
        if lines:
            log.write_lines([printable(line, one_line=True) for line in lines])

    def _update_legend(self, log_run: str) -> None:
        marks = {d.label: d for d in self.query_one("#plot-loss", MetricPlot).drawn}
        self.query_one("#legend", Static).update(live_draw.legend(self.series, self.statuses, marks, log_run))

    def _show_log_title(self) -> None:
        """The focused run's name, whether it follows the running run, and its time breakdown once it has ended."""
        status = next((st for rd, st in zip(self.runs, self.statuses, strict=True) if rd.name == self._log_for), None)
        running = live_draw.newest_running(self.statuses) is not None
        title = live_draw.log_title(self._log_for, status, following=self.follow, running=running, page=self.page_text())
        self.query_one("#log-title", Static).update(title)

    def _follow_running(self) -> None:
        """Point the log pane at the newest running run (the one started last), if it is not there yet."""
        idx = live_draw.newest_running(self.statuses)
        if idx is not None and idx != self.log_index:
            self.log_index = idx
            self._need_log_reset = True
            self._poll()

    def redraw(self) -> None:
        choices = live_draw.LiveChoices(self.smooth, self.mem_key, self._system_key())
        for p, plot in zip(live_draw.PLOTS, self.plots(), strict=True):
            p.draw(plot, self.series, choices)

    def available_system(self) -> list[str]:
        return live_draw.available_system(self.series)

    def _system_key(self) -> str | None:
        avail = self.available_system()
        if not avail:
            return None
        if self.system_key not in avail:
            self.system_key = avail[0]  # gpu_util when there are GPUs, else cpu
        return self.system_key

    # -- keys ------------------------------------------------------------------

    def action_smooth(self) -> None:
        self.smooth = not self.smooth
        self.notify("smoothing " + ("on (EMA 0.1; raw dimmed)" if self.smooth else "off"), timeout=2)
        self.redraw()

    def action_memory(self) -> None:
        self.mem_key = "mem_alloc" if self.mem_key == "mem_peak" else "mem_peak"
        self.redraw()

    def action_system(self) -> None:
        avail = self.available_system()
        if not avail:
            self.notify("no system readings yet", severity="warning")
            return
        cur = self._system_key()
        self.system_key = avail[(avail.index(cur) + 1) % len(avail)] if cur in avail else avail[0]
        self.redraw()

    def action_log_scale(self) -> None:
        self.log_y = not self.log_y
        for plot in self.plots():
            plot.set_options(log_y=self.log_y)
        self.notify("log scale " + ("on" if self.log_y else "off"), timeout=2)

    def action_warmup(self) -> None:
        self.hide_warmup = not self.hide_warmup
        for plot in self.plots():
            plot.set_options(hide_warmup=self.hide_warmup)
        self.notify("warm-up steps " + ("hidden" if self.hide_warmup else "shown"), timeout=2)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_charts":  # c only where the charts are paged (hidden from the footer otherwise)
            return charts_per_page(self.size.width, self.size.height) < len(self.PLOT_IDS)
        return True

    def action_next_charts(self) -> None:
        self.chart_page += 1
        self._layout_charts()

    def action_next_log(self) -> None:
        if not self.runs:
            return
        self.follow = False
        self.log_index = (self.log_index + 1) % len(self.runs)
        self._need_log_reset = True
        self._poll()

    def action_follow(self) -> None:
        self.follow = True
        self._show_log_title()
        self._follow_running()

    def action_open_log(self) -> None:
        from dstui.tui.screens.log import LogScreen

        if self.runs:
            self.app.push_screen(LogScreen(self.runs[self.log_index]))
