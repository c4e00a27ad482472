"""`?`: the keys of the screen underneath, plus what the screen is for."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

GLOBAL_HELP = (
    "1 compose · 2 runs · 3 results · ctrl+p command palette · q quit (runs keep going; "
    "start dstui again to watch them)"
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(self._content())

    def _content(self) -> Table:
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold cyan", no_wrap=True)
        t.add_column()
        doc = (getattr(self.under, "HELP", "") or "").strip()
        title = getattr(self.under, "TITLE", None) or type(self.under).__name__
        t.add_row(Text(str(title), style="bold"), Text(doc))
        t.add_row("", "")
        seen = set()
        for binding in [*getattr(self.under, "BINDINGS", []), *self.app.BINDINGS]:
            if not isinstance(binding, Binding):
                continue
            key = binding.key_display or binding.key
            if key in seen or not binding.description:
                continue
            seen.add(key)
            t.add_row(key.replace("question_mark", "?"), binding.description)
        t.add_row("", "")
        t.add_row("", Text(GLOBAL_HELP, style="dim"))
        return t
