"""The compose screen's form: one row per spec field, toggles for choices, comma lists for the rest.

The form does not hold the spec: it shows a mapping (:meth:`SpecForm.fill`)
and turns each edit into a message (:class:`SpecForm.FieldEdited`,
:class:`SpecForm.TopEdited`, :class:`SpecForm.Invalid`) that the screen
applies to the mapping it owns (dstui/tui/compose_model.py), so there is one
copy of the spec being edited.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widgets import Checkbox, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from dstui.core.paths import REPO_DIR
from dstui.tui import compose_model as cm
from dstui.tui.widgets.toggle import Toggle


def _repo_rel(p: Any) -> str:
    try:
        return str(p.relative_to(REPO_DIR))
    except ValueError:
        return str(p)


def _row(label: str, widget: Any) -> Horizontal:
    return Horizontal(Label(label, classes="form-label"), widget, classes="form-row")


class SpecForm(VerticalScroll):
    """Spec file path, the bundled specs, the fields, repeats, baseline and the revisions."""

    class FieldEdited(Message):
        """A settings field now has these values (one: a setting; several: an axis)."""

        def __init__(self, field: str, values: list[Any]) -> None:
            super().__init__()
            self.field = field
            self.values = values

    class TopEdited(Message):
        """A top-level key of the spec (name, repeats, baseline); None removes it."""

        def __init__(self, key: str, value: Any) -> None:
            super().__init__()
            self.key = key
            self.value = value

    class Invalid(Message):
        """An edit that cannot be read (e.g. 'micro batch: 'x' is not a whole number')."""

        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def compose(self) -> ComposeResult:
        yield Label("spec file (Enter opens or starts one)", classes="form-title")
        yield Input(placeholder="configs/experiments/my.yaml", id="path", compact=True)
        yield OptionList(*[Option(_repo_rel(p), id=str(p)) for p in cm.experiment_files()], id="files")
        yield _row("name", Input(id="name", compact=True))
        for field in cm.FORM_ORDER:
            if field in cm.CHOICES:
                boxes = [
                    Toggle(cm.choice_text(v), id=f"ck-{field}-{i}", classes="choice")
                    for i, v in enumerate(cm.CHOICES[field])
                ]
                yield _row(cm.LABELS[field], Horizontal(*boxes, classes="choices"))
            else:
                inp = Input(id=f"in-{field}", compact=True, placeholder="comma list")
                if field == "model":
                    inp.suggester = SuggestFromList(cm.model_presets())
                    inp.placeholder = "preset or hub id, comma list"
                yield _row(cm.LABELS[field], inp)
        yield _row("repeats", Input(id="repeats", compact=True, type="integer"))
        yield _row("baseline", Input(id="baseline", compact=True, placeholder="condition name"))
        yield Static(id="revisions")

    def fill(self, data: dict[str, Any]) -> None:
        """Show a spec mapping (no edit messages come of it)."""
        with self.prevent(Input.Changed, Checkbox.Changed):
            self.query_one("#name", Input).value = str(data.get("name", ""))
            for field in cm.FORM_ORDER:
                values = cm.values_of(data, field)
                if field in cm.CHOICES:
                    for i, v in enumerate(cm.CHOICES[field]):
                        self.query_one(f"#ck-{field}-{i}", Checkbox).value = v in values
                else:
                    self.query_one(f"#in-{field}", Input).value = cm.list_text(values)
            self.query_one("#repeats", Input).value = str(data.get("repeats", 1))
            self.query_one("#baseline", Input).value = str(data.get("baseline") or "")
        self.show_revisions(data)

    def show_revisions(self, data: dict[str, Any]) -> None:
        revs = [r for r in (data.get("revisions") or []) if isinstance(r, dict)]
        lines = [Text.assemble(("revisions", "bold"), ("  ctrl+e edits", "dim"))]
        lines += [Text(f"  {cm.revision_text(r)}") for r in revs]
        if not revs:
            lines.append(Text("  none: the installed DeepSpeed", style="dim"))
        self.query_one("#revisions", Static).update(Text("\n").join(lines))

    @on(Checkbox.Changed, ".choice")
    def _choice_changed(self, event: Checkbox.Changed) -> None:
        field = str(event.checkbox.id).split("-")[1]
        values = [v for i, v in enumerate(cm.CHOICES[field]) if self.query_one(f"#ck-{field}-{i}", Checkbox).value]
        self.post_message(self.FieldEdited(field, values))

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        wid = event.input.id or ""
        value = event.value.strip()
        try:
            if wid.startswith("in-"):
                self.post_message(self.FieldEdited(wid[3:], cm.parse_list(wid[3:], event.value)))
            elif wid == "name":
                self.post_message(self.TopEdited("name", value))
            elif wid == "repeats":
                self.post_message(self.TopEdited("repeats", int(value) if value else None))
            elif wid == "baseline":
                self.post_message(self.TopEdited("baseline", value or None))
        except ValueError as e:
            self.post_message(self.Invalid(str(e)))
