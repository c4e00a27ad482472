"""The compose screen's revision editor: add, edit and remove the DeepSpeed revisions of a spec.

A modal over the compose screen. The list shows the spec's revisions; a row
picked with Enter fills the fields for editing. Every change is checked by the
spec's own :class:`~dstui.spec.experiment.Revision` model (through
:mod:`dstui.tui.compose_model`), so what the editor accepts ``dstui list`` accepts.
Escape (or "done") returns the new spec mapping to the compose screen.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Static

from dstui.tui import compose_model as cm


class RevisionEditor(ModalScreen[dict[str, Any]]):
    """Edit ``data['revisions']``; dismisses with the edited spec mapping."""

    BINDINGS = [
        Binding("escape", "done", "Done"),
        Binding("ctrl+n", "new", "New"),
        Binding("ctrl+d", "remove", "Remove"),
    ]
    DEFAULT_CSS = """
    RevisionEditor { align: center middle; }
    #rev-dialog { width: 90; max-width: 100%; height: auto; max-height: 90%; border: thick $accent; background: $surface; padding: 0 1; }
    #rev-table { height: auto; max-height: 10; }
    .rev-row { height: 1; margin: 0 0 1 0; }
    .rev-row Label { width: 10; }
    .rev-row Input { width: 1fr; }
    #rev-buttons { height: 3; }
    #rev-error { color: $error; height: auto; }
    """

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__()
        self.data = data
        self.editing: int | None = None  # index of the revision in the fields, None: a new one

    def compose(self) -> ComposeResult:
        with Vertical(id="rev-dialog"):
            yield Static(Text("DeepSpeed revisions (every condition runs against each)", style="bold"))
            yield DataTable(id="rev-table", cursor_type="row")
            yield Static(id="rev-mode")
            for key, label, hint in (
                ("name", "name", "e.g. stable"),
                ("source", "source", "pypi | git | path | installed"),
                ("value", "value", "version (pypi) or folder (git, path)"),
                ("ref", "ref", "branch, tag or commit (git only)"),
                ("install", "install", "auto | pip | source (git only: how its env is built)"),
            ):
                yield Horizontal(Label(label), Input(id=f"rev-{key}", placeholder=hint, compact=True), classes="rev-row")
            yield Static(id="rev-error")
            with Horizontal(id="rev-buttons"):
                yield Button("save revision", id="rev-save", variant="primary")
                yield Button("remove", id="rev-remove", variant="error")
                yield Button("new", id="rev-new")
                yield Button("done", id="rev-done")

    def on_mount(self) -> None:
        self.query_one("#rev-table", DataTable).add_columns("name", "source", "value", "ref", "install")
        self._fill()
        self.action_new()

    def _revs(self) -> list[dict[str, Any]]:
        return [r for r in (self.data.get("revisions") or []) if isinstance(r, dict)]

    def _fill(self) -> None:
        table = self.query_one("#rev-table", DataTable)
        table.clear()
        for r in self._revs():
            table.add_row(str(r.get("name")), *cm.revision_source(r), cm.revision_install(r))
        if not self._revs():
            table.add_row("(none)", "installed", "", "", "")

    def _set_fields(self, name: str, source: str, value: str, ref: str, install: str = "auto") -> None:
        for key, val in (("name", name), ("source", source), ("value", value), ("ref", ref), ("install", install)):
            self.query_one(f"#rev-{key}", Input).value = val
        mode = "new revision" if self.editing is None else f"editing '{name}'"
        self.query_one("#rev-mode", Static).update(Text(mode, style="dim"))
        self.query_one("#rev-error", Static).update("")

    @on(DataTable.RowSelected, "#rev-table")
    def _picked(self, event: DataTable.RowSelected) -> None:
        revs = self._revs()
        if event.cursor_row < len(revs):
            self.editing = event.cursor_row
            rev = revs[event.cursor_row]
            self._set_fields(str(rev.get("name")), *cm.revision_source(rev), cm.revision_install(rev))

    def action_new(self) -> None:
        self.editing = None
        self._set_fields("", "pypi", "", "")

    @on(Button.Pressed, "#rev-new")
    def _new_pressed(self) -> None:
        self.action_new()

    @on(Button.Pressed, "#rev-save")
    @on(Input.Submitted, ".rev-row Input")
    def save_revision(self) -> None:
        fields = {k: self.query_one(f"#rev-{k}", Input).value for k in ("name", "source", "value", "ref", "install")}
        try:
            rev = cm.make_revision(fields["name"], fields["source"], fields["value"], fields["ref"], fields["install"])
            self.data = cm.put_revision(self.data, rev, self.editing)
        except ValueError as e:
            self.query_one("#rev-error", Static).update(f"revision not saved: {e}")
            return
        self._fill()
        self.notify(f"revision {cm.revision_text(rev)}", timeout=3)
        self.action_new()

    def action_remove(self) -> None:
        table = self.query_one("#rev-table", DataTable)
        index = self.editing if self.editing is not None else table.cursor_row
        revs = self._revs()
        if not revs or index is None or index >= len(revs):
            return
        name = revs[index].get("name")
        self.data = cm.remove_revision(self.data, index)
        self._fill()
        self.action_new()
        self.notify(f"revision '{name}' removed", timeout=3)

    @on(Button.Pressed, "#rev-remove")
    def _remove_pressed(self) -> None:
        self.action_remove()

    @on(Button.Pressed, "#rev-done")
    def action_done(self) -> None:
        self.dismiss(self.data)
