"""A modal with a title and a block of text (e.g. the command that starts the MLflow UI)."""

from __future__ import annotations

import shlex

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class TextScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close")]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical(id="text-box"):
            yield Static(Text(self.title_text, style="bold"))
            yield Static(self.body, id="text-body")
            yield Static(Text("escape closes", style="dim"))


def mlflow_ui_screen() -> TextScreen:
    """The command that serves these runs' MLflow UI, and how to reach it over SSH."""
    from dstui.core import paths
    from dstui.tracking import client as tracking

    argv = tracking.run_ui_command(paths.tracking_uri())
    body = (
        f"{shlex.join(argv)}\n\n"
        "over SSH: ssh -L 5000:127.0.0.1:5000 <this host>, then open http://127.0.0.1:5000\n"
        "(`dstui ui --start` runs it)"
    )
    return TextScreen("MLflow UI for these runs", body)
