"""The compose screen's form: a row for every part of a spec.

The form does not hold the spec: it shows a mapping (:meth:`SpecForm.fill`)
and turns each edit into a message (:class:`SpecForm.FieldEdited`,
:class:`SpecForm.TopEdited`, :class:`SpecForm.Invalid`) that the screen
applies to the mapping it owns (dstui/tui/compose_model.py), so there is one
copy of the spec being edited.

Every Settings field has a row, its widget chosen by the field's type
(:func:`dstui.tui.compose_model.field_kind`): toggles, a comma list, or a
YAML/JSON text (``ds_overrides``, ``command``, ``launcher``, ...). The main
fields come first; the others sit under "more settings". Exclusions, explicit
conditions and the run options (executor, slurm, guard, ...) are YAML texts.
A text that does not read, or does not fit its field, is reported with
:class:`SpecForm.Invalid` and never reaches the mapping.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widget import Widget
from textual.widgets import Checkbox, Collapsible, Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from dstui.core.paths import REPO_DIR
from dstui.tui import compose_model as cm
from dstui.tui import compose_texts as ct
from dstui.tui.widgets.toggle import Toggle

# YAML texts of the spec itself (not Settings fields): widget id -> (label, hint)
SPEC_TEXTS = {
    "tx-exclude": ("exclusions", "- {zero_stage: 0, offload: cpu}"),
    "tx-conditions": ("explicit conditions", "- {name: fast, micro_batch: 4}"),
    "tx-options": ("run options", "executor: slurm / guard: {rtol: 0.05} / gpu_memory_gib: 80"),
}


BAD_MARK = "✗ "  # before the label of a field whose value is not used or is refused
CHOICE_WIDTH = 29  # the form's columns beside the label (see #form and .form-label in dstui.tcss)


def _repo_rel(p: Any) -> str:
    try:
        return str(p.relative_to(REPO_DIR))
    except ValueError:
        return str(p)


def _row(label: str, widget: Any) -> Horizontal:
    return Horizontal(Label(label, classes="form-label"), widget, classes="form-row")


def _text_area(wid: str, hint: str) -> TextArea:
    area = TextArea(id=wid, classes="yaml-text", soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
    area.placeholder = hint
    return area


class SpecForm(VerticalScroll):
    """Spec file path, the bundled specs, every field, repeats, baseline, revisions, exclusions, conditions."""

    class FieldEdited(Message):
        """A settings field now has these values (one: a setting; several: an axis)."""

        def __init__(self, field: str, values: list[Any], source: str) -> None:
            super().__init__()
            self.field = field
            self.values = values
            self.source = source

    class TopEdited(Message):
        """A top-level key of the spec (name, repeats, baseline, exclude, conditions); None removes it."""

        def __init__(self, key: str, value: Any, source: str) -> None:
            super().__init__()
            self.key = key
            self.value = value
            self.source = source

    class Invalid(Message):
        """An edit that cannot be read (e.g. 'micro batch: 'x' is not a whole number'); not applied."""

        def __init__(self, source: str, error: str) -> None:
            super().__init__()
            self.source = source
            self.error = error

    def compose(self) -> ComposeResult:
        yield Static(id="path-title", classes="form-title")
        yield Input(placeholder="configs/experiments/my.yaml", id="path", compact=True)
        yield OptionList(*[Option(_repo_rel(p), id=str(p)) for p in cm.experiment_files()], id="files")
        yield _row("name", Input(id="name", compact=True))
        for field in cm.FORM_ORDER:
            yield from self._field_row(field)
        yield _row("repeats", Input(id="repeats", compact=True, type="integer"))
        yield _row("baseline", Input(id="baseline", compact=True, placeholder="condition name"))
        yield Static(id="revisions")
        for wid in ("tx-exclude", "tx-conditions"):
            label, hint = SPEC_TEXTS[wid]
            yield Label(label, classes="form-section")
            yield _text_area(wid, hint)
        with Collapsible(title=f"more settings ({len(cm.MORE_ORDER)})", id="more", collapsed=True):
            for field in cm.MORE_ORDER:
                yield from self._field_row(field)
            label, hint = SPEC_TEXTS["tx-options"]
            yield Label(label, classes="form-section")
            yield _text_area("tx-options", hint)

    def _field_row(self, field: str) -> ComposeResult:
        kind = cm.field_kind(field)
        label = cm.label_of(field)
        if kind == "choice":
            # toggles side by side, on more lines when they do not fit beside the label
            lines: list[list[Toggle]] = [[]]
            used = 0
            for i, v in enumerate(cm.choices_of(field)):
                text = cm.choice_text(v)
                if lines[-1] and used + len(text) + 4 > CHOICE_WIDTH:  # '[x]', the text, its padding
                    lines.append([])
                    used = 0
                lines[-1].append(Toggle(text, id=f"ck-{field}-{i}", classes="choice"))
                used += len(text) + 6  # and the space before the next
            for n, boxes in enumerate(lines):
                yield _row(label if n == 0 else "", Horizontal(*boxes, classes="choices"))
        elif kind == "list":
            # an emptied field is not nothing: the run uses the default, so the field says which
            d = cm.default(field)
            inp = Input(id=f"in-{field}", compact=True, placeholder=f"{'none' if d is None else d} (default)")
            if field == "model":
                inp.suggester = SuggestFromList(cm.model_presets())
            yield _row(label, inp)
        else:
            yield Label(f"{label} (YAML/JSON)", classes="form-title")
            yield _text_area(f"tx-{field}", "YAML or JSON; a list of values: an axis")

    def fill(self, data: dict[str, Any]) -> None:
        """Show a spec mapping (no edit messages come of it)."""
        self.clear_marks()
        with self.prevent(Input.Changed, Checkbox.Changed, TextArea.Changed):
            self.query_one("#name", Input).value = str(data.get("name", ""))
            for field in cm.FORM_ORDER + cm.MORE_ORDER:
                values = cm.values_of(data, field)
                kind = cm.field_kind(field)
                if kind == "choice":
                    for i, v in enumerate(cm.choices_of(field)):
                        self.query_one(f"#ck-{field}-{i}", Checkbox).value = v in values
                elif kind == "list":
                    self.query_one(f"#in-{field}", Input).value = cm.list_text([v for v in values if v is not None])
                else:
                    self.query_one(f"#tx-{field}", TextArea).load_text(ct.yaml_text(values[0] if len(values) == 1 else values))
            self.query_one("#repeats", Input).value = str(data.get("repeats", 1))
            self.query_one("#baseline", Input).value = str(data.get("baseline") or "")
            self.query_one("#tx-exclude", TextArea).load_text(ct.yaml_text(data.get("exclude")))
            self.query_one("#tx-conditions", TextArea).load_text(ct.yaml_text(data.get("conditions")))
            self.query_one("#tx-options", TextArea).load_text(ct.yaml_text(ct.run_options(data)))
        self.show_revisions(data)

    def show_path(self, text: str) -> None:
        """The path field's title: what Enter does now, read-only and unsaved marks."""
        self.query_one("#path-title", Static).update(Text.from_markup(text))

    def show_revisions(self, data: dict[str, Any]) -> None:
        revs = [r for r in (data.get("revisions") or []) if isinstance(r, dict)]
        lines = [Text.assemble(("revisions", "bold"), ("  ctrl+e edits", "dim"))]
        lines += [Text(f"  {cm.revision_text(r)}") for r in revs]
        if not revs:
            lines.append(Text("  none: the installed DeepSpeed", style="dim"))
        self.query_one("#revisions", Static).update(Text("\n").join(lines))

    def mark(self, source: str, bad: bool) -> None:
        """Mark (or unmark) the field an Invalid came from, so the eye finds what blocks save and launch."""
        if source.startswith("ck-"):
            n = len(cm.choices_of(source[3:]))
            widgets: list[Widget] = list(dict.fromkeys(self.query_one(f"#{source}-{i}").parent for i in range(n)))
        else:
            widgets = list(self.query(f"#{source}"))
        for w in list(widgets):
            row = w.parent
            if isinstance(row, Widget) and row.has_class("form-row"):
                widgets.extend(row.query(".form-label"))
        for w in widgets:
            w.set_class(bad, "-bad")
            if isinstance(w, Label):
                self._mark_label(w, bad)

    @staticmethod
    def _mark_label(label: Label, bad: bool) -> None:
        """'✗ model': the mark reads without colour too (a monochrome terminal, a screen reader)."""
        text = str(label.content).removeprefix(BAD_MARK)
        label.update(BAD_MARK + text if bad and text else text)

    def clear_marks(self) -> None:
        for w in list(self.query(".-bad")):
            w.remove_class("-bad")
            if isinstance(w, Label):
                self._mark_label(w, False)

    @on(Checkbox.Changed, ".choice")
    def _choice_changed(self, event: Checkbox.Changed) -> None:
        wid = str(event.checkbox.id)
        field = wid.split("-")[1]
        values = [
            v for i, v in enumerate(cm.choices_of(field)) if self.query_one(f"#ck-{field}-{i}", Checkbox).value
        ]
        if not values:  # no value is not "the default": say so, and keep the runs off this edit until one is checked
            why = f"{cm.label_of(field)}: nothing checked; check at least one (every run needs one)"
            self.post_message(self.Invalid(f"ck-{field}", why))
            return
        self.post_message(self.FieldEdited(field, values, f"ck-{field}"))

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        wid = event.input.id or ""
        value = event.value.strip()
        try:
            if wid.startswith("in-"):
                self.post_message(self.FieldEdited(wid[3:], cm.parse_list(wid[3:], event.value), wid))
            elif wid == "name":
                self.post_message(self.TopEdited("name", value, wid))
            elif wid == "repeats":
                self.post_message(self.TopEdited("repeats", int(value) if value else None, wid))
            elif wid == "baseline":
                self.post_message(self.TopEdited("baseline", value or None, wid))
        except ValueError as e:
            self.post_message(self.Invalid(wid, str(e)))

    @on(TextArea.Changed, ".yaml-text")
    def _text_changed(self, event: TextArea.Changed) -> None:
        wid = event.text_area.id or ""
        text = event.text_area.text
        try:
            if wid == "tx-exclude":
                self.post_message(self.TopEdited("exclude", ct.parse_exclusions(text) or None, wid))
            elif wid == "tx-conditions":
                self.post_message(self.TopEdited("conditions", ct.parse_conditions(text) or None, wid))
            elif wid == "tx-options":
                self.post_message(self.TopEdited("run options", ct.parse_run_options(text), wid))
            else:
                self.post_message(self.FieldEdited(wid[3:], ct.parse_yaml_field(wid[3:], text), wid))
        except ValueError as e:
            self.post_message(self.Invalid(wid, str(e)))
