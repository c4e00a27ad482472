"""Live view: overlaid loss / iteration time / memory / system plots and a log tail.

A 1 s timer starts a thread worker that reads only the new bytes of each run's
metrics.jsonl, system.jsonl and the focused run's stdout.log (one
:class:`~dstui.core.records.Follower` per file); the parsed delta comes back as a
message and is appended on the main thread, which owns every buffer. A tick
that finds the previous read still going is skipped, so slow disks never pile
up work.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Log, Static

from dstui.commands._common import fmt_bytes, fmt_num
from dstui.core.records import Follower
from dstui.core.rundir import BatchDir, RunDir
from dstui.tui.series import Delta, RunSeries
from dstui.tui.widgets.charts import Curve, MetricPlot, color

LOG_TAIL_BYTES = 16384
SYSTEM_VIEWS = {
    "gpu_util": ("GPU util", "%", 1.0),
    "gpu_mem": ("GPU memory", "GB", 1024**3),
    "gpu_power": ("GPU power", "W", 1.0),
    "cpu": ("job CPU", "%", 1.0),
    "rss": ("job RSS", "GB", 1024**3),
}


def byte_scale(max_value: float) -> tuple[float, str]:
    for scale, unit in ((1024**3, "GB"), (1024**2, "MB"), (1024, "KB")):
        if max_value >= scale:
            return float(scale), unit
    return 1.0, "B"


def time_scale(max_value: float) -> tuple[float, str]:
    return (1e-3, "ms") if max_value < 1.0 else (1.0, "s")


class LiveData(Message):
    def __init__(self, deltas: list[Delta], statuses: list[dict], log_lines: list[str], log_run: str) -> None:
        super().__init__()
        self.deltas = deltas
        self.statuses = statuses
        self.log_lines = log_lines
        self.log_run = log_run


class LiveScreen(Screen):
    TITLE = "Live"
    HELP = """Overlaid live plots of the chosen runs, read from their run folders every second.
Plots are decimated to the widget width (min/max per column), so long runs stay cheap to draw.
Smoothing (s) draws an EMA over the dimmed raw curve. System readings: GPU util/memory/power
when the run has GPUs, else the job's CPU% and RSS (y cycles)."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "smooth", "Smooth"),
        Binding("m", "memory", "Peak/alloc"),
        Binding("y", "system", "System metric"),
        Binding("n", "next_log", "Next log"),
        Binding("o", "open_log", "Full log"),
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
        self._log_follower: Follower | None = None
        self._log_for = ""
        self._busy = False
        self._need_log_reset = True

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="legend")
        with Grid(id="plots"):
            yield MetricPlot("loss", id="plot-loss")
            yield MetricPlot("iteration time", id="plot-iter")
            yield MetricPlot("peak memory", id="plot-mem")
            yield MetricPlot("system", xlabel="seconds", id="plot-sys")
        yield Static(id="log-title")
        yield Log(id="log-tail", max_lines=400, auto_scroll=True)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.batch.id
        self._poll()
        self.set_interval(getattr(self.app, "watch_s", 1.0), self._poll)

    def on_resize(self) -> None:
        # on 80x24 every row counts: a shorter log tail leaves the plots readable
        self.query_one("#log-tail", Log).styles.height = 4 if self.size.height < 30 else 7

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
        if changed or status_changed:
            self.update_legend()
        log = self.query_one("#log-tail", Log)
        lines = message.log_lines
        if lines and lines[0] == "\x00reset":
            log.clear()
            lines = lines[1:]
            self.query_one("#log-title", Static).update(
                Text.assemble(("log ", "dim"), (message.log_run, "bold"), ("  (n: next run, o: full log)", "dim"))
            )
        if lines:
            log.write_lines(lines)

    def redraw(self) -> None:
        key_src = "smooth" if self.smooth else "steps"
        # loss and iteration time: raw (dimmed when smoothing) plus EMA
        for plot_id, key, label in (("#plot-loss", "loss", "loss"), ("#plot-iter", "iter_time", "iteration time")):
            curves: list[Curve] = []
            top = 0.0
            for i, s in enumerate(self.series):
                raw = s.steps[key]
                if self.smooth:
                    curves.append(Curve(s.name, i, raw.x, raw.y, raw=True))
                sm = getattr(s, key_src)[key]
                curves.append(Curve(s.name, i, sm.x, sm.y))
                if len(raw):
                    top = max(top, max(raw.y[-50:]))
            plot = self.query_one(plot_id, MetricPlot)
            if not any(len(c.x) for c in curves):
                plot.set_empty("waiting for data")
                continue
            scale, unit = (1.0, "") if key == "loss" else time_scale(top)
            title = label + (" (EMA)" if self.smooth else "")
            plot.set_curves(curves, scale=scale, unit=unit, title=title)
        # memory
        curves = []
        top = 0.0
        for i, s in enumerate(self.series):
            buf = s.steps[self.mem_key]
            curves.append(Curve(s.name, i, buf.x, buf.y))
            if len(buf):
                top = max(top, max(buf.y))
        scale, unit = byte_scale(top)
        title = "peak memory" if self.mem_key == "mem_peak" else "allocated memory"
        plot = self.query_one("#plot-mem", MetricPlot)
        plot.title = title
        if not any(len(c.x) for c in curves):
            plot.set_empty("waiting for data")
        else:
            plot.set_curves(curves, scale=scale, unit=unit, title=title)
        # system readings
        key = self._system_key()
        plot = self.query_one("#plot-sys", MetricPlot)
        if key is None:
            plot.set_empty("no system readings yet")
        else:
            name, unit, sc = SYSTEM_VIEWS[key]
            curves = [Curve(s.name, i, s.system[key].x, s.system[key].y) for i, s in enumerate(self.series)]
            plot.set_curves(curves, scale=sc, unit=unit, title=name)

    def available_system(self) -> list[str]:
        have = {k for s in self.series for k, b in s.system.items() if len(b)}
        return [k for k in SYSTEM_VIEWS if k in have]

    def _system_key(self) -> str | None:
        avail = self.available_system()
        if not avail:
            return None
        if self.system_key not in avail:
            self.system_key = avail[0]  # gpu_util when there are GPUs, else cpu
        return self.system_key

    def update_legend(self) -> None:
        parts: list[Text | str | tuple[str, str]] = []
        for i, (s, st) in enumerate(zip(self.series, self.statuses, strict=True)):
            rgb = color(i)
            last = st.get("last") or {}
            loss = s.steps["loss"].y[-1] if len(s.steps["loss"]) else last.get("loss")
            mem = s.steps["mem_peak"].y[-1] if len(s.steps["mem_peak"]) else last.get("mem_peak")
            sysl = s.system_last
            if "gpu_util" in sysl:
                sys_text = f" gpu {sysl['gpu_util']:.0f}%"
                if "gpu_power" in sysl:
                    sys_text += f" {sysl['gpu_power']:.0f}W"
            elif "cpu" in sysl:
                sys_text = f" cpu {sysl['cpu']:.0f}%"
            else:
                sys_text = ""
            parts += [
                (f"■ {s.name} ", f"bold rgb({rgb[0]},{rgb[1]},{rgb[2]})"),
                (f"{st.get('state', '?')} {st.get('steps_done') or 0}/{st.get('steps_total') or '?'}", "dim"),
                f" loss {fmt_num(loss)} mem {fmt_bytes(mem)}{sys_text}",
            ]
            diverged = (st.get("diverged") or {}).get("message")
            if diverged:  # the guard flagged this run (dstui/execute/guard.py): say so in red
                parts.append((f" {diverged}", "bold red"))
            parts.append("   ")
        self.query_one("#legend", Static).update(Text.assemble(*parts))

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

    def action_next_log(self) -> None:
        if not self.runs:
            return
        self.log_index = (self.log_index + 1) % len(self.runs)
        self._need_log_reset = True
        self._poll()

    def action_open_log(self) -> None:
        from dstui.tui.screens.log import LogScreen

        if self.runs:
            self.app.push_screen(LogScreen(self.runs[self.log_index]))
