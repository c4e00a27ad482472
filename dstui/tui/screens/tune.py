"""Tune (ctrl+p "Tune current spec"): the same search as `dstui tune SPEC`, watched from the TUI.

It opens on the candidates (predicted step time, memory forecast, why one is
left out), as `dstui tune --dry-run` lists them; ``s`` starts the search, whose
lines and probe progress follow below. Both run :class:`dstui.tune.session.Session`
in a thread worker: the screen only shows what the service says. Leaving the
screen leaves the search running in this process; quitting dstui stops it
between two checks, and the same command (or this screen) resumes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Header, Log, Static

from dstui.analysis.time_fit import seconds_label
from dstui.core.formatting import fmt_gib
from dstui.tui.widgets.fitting_footer import FittingFooter


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"~{seconds_label(seconds)}"


class TuneScreen(Screen):
    TITLE = "Tune"
    HELP = (
        "The fastest DeepSpeed configuration of the spec's tune: space that fits this machine, found as "
        "`dstui tune SPEC` finds it. The table lists every candidate with its predicted step time and memory "
        "forecast, or why it is left out. s starts (or resumes) the search: probes are runs of one batch, "
        "visible in Runs; each stops once its step time ranks it. The winner's spec and the report section "
        "land in the search's folder, named at the end."
    )
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "start", "Start search"),
    ]

    def __init__(self, spec_path: Path) -> None:
        super().__init__()
        self.spec_path = spec_path
        self.started = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="tune-status")
        yield DataTable(id="tune-candidates", cursor_type="row", zebra_stripes=True)
        yield Log(id="tune-log", max_lines=5000, auto_scroll=True)
        yield FittingFooter()

    def on_mount(self) -> None:
        self.sub_title = str(self.spec_path)
        table = self.query_one("#tune-candidates", DataTable)
        for title in ("candidate", "step time", "memory/GPU", "status"):
            table.add_column(title, key=title)
        self._status("reading the spec, forecasting each candidate…")
        self.preview()

    def _status(self, text: str, style: str = "") -> None:
        self.query_one("#tune-status", Static).update(Text(text, style=style))

    def _session(self, **kw: Any) -> Any:
        from dstui.tune.session import Session

        return Session(self.spec_path, **kw)

    @work(thread=True, exclusive=True, exit_on_error=False, name="tune preview")
    def preview(self) -> None:
        try:
            doc = self._session(say=lambda _line: None).preview()
        except Exception as e:  # a bad spec: said on screen in one line, as `dstui tune` says it; nothing starts
            self.started = True
            self.app.call_from_thread(self._status, f"✗ {e}", "bold red")
            return
        self.app.call_from_thread(self._show_candidates, doc)

    def _show_candidates(self, doc: dict[str, Any]) -> None:
        table = self.query_one("#tune-candidates", DataTable)
        table.clear()
        rows = sorted(doc["candidates"], key=lambda r: (r["left_out"] is not None, r["predicted_s"] or 0.0))
        for r in rows:
            status = "probed" if r["probed"] else (r["left_out"] or "candidate")
            table.add_row(r["candidate"], _ms(r["predicted_s"]), fmt_gib(r["forecast_mem"], 1),
                          Text(status, style="dim" if r["left_out"] else ""), key=r["candidate"])  # fmt: skip
        n = sum(1 for r in rows if not r["left_out"])
        self._status(f"{len(rows)} candidates, {n} can run here; time model: {doc['model']} ({doc['machine']}). "
                     "s: start the search")  # fmt: skip

    def action_start(self) -> None:
        if not self.started:
            self.started = True
            self._status("searching… (probes are in Runs too)")
            self.search()

    def _line(self, text: str) -> None:
        self.app.call_from_thread(self.query_one("#tune-log", Log).write_line, text)

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "step" and event.get("mean_s"):
            self.app.call_from_thread(self._status, f"probe {event['candidate']}: {event['steps']} steps, "
                                                    f"{event['mean_s'] * 1e3:.4g} ms/step after warm-up")  # fmt: skip

    @work(thread=True, exclusive=True, exit_on_error=False, name="tune")
    def search(self) -> None:
        try:
            doc = self._session(say=self._line, on_event=self._event).run()
        except Exception as e:  # noqa: BLE001 - shown on the screen; the search resumes next time
            self.app.call_from_thread(self._status, f"✗ {e}", "bold red")
            return
        self.app.call_from_thread(self._done, doc)

    def _done(self, doc: dict[str, Any]) -> None:
        log = self.query_one("#tune-log", Log)
        for r in doc["ranking"]:
            mark = "*" if r["winner"] else " "
            measured = seconds_label(r["measured_s"]) if r["measured_s"] else "-"
            log.write_line(f"{mark} {r['candidate']}: measured {measured}, predicted {_ms(r['predicted_s'])}; {r['outcome']}")
        winner = doc.get("winner")
        text = f"winner: {winner}; its spec: {doc['winner_spec']}" if winner else f"no winner: {doc['stop_reason']}"
        self._status(f"{text}. report section: {doc['report']}", "bold green" if winner else "bold red")
