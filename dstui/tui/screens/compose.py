"""Compose: open or create a spec, pick axis values, see the expanded runs, save, launch.

Every edit re-runs :func:`dstui.spec.models.parse_spec` and :func:`dstui.spec.models.expand`
(pure and cheap), so the run list, its count and the first error (the CLI's
SpecError text) follow each keystroke. DeepSpeed's own config validation and
the memory forecast per GPU import deepspeed, so they run in a thread worker
(dstui/tui/compose_check.py) after a short pause in typing; a result for an
older version of the spec is dropped.

The form is :class:`~dstui.tui.widgets.spec_form.SpecForm` (it reports edits,
this screen owns the spec mapping); the right side is
:class:`~dstui.tui.widgets.run_preview.RunPreview`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Input, OptionList

from dstui.core.errors import DstuiError, SpecError
from dstui.spec.models import ExperimentSpec, RunSpec, dump_spec, expand, parse_spec, save_spec
from dstui.tui import compose_check
from dstui.tui import compose_model as cm
from dstui.tui.compose_check import CheckResult
from dstui.tui.widgets.run_preview import RunPreview
from dstui.tui.widgets.spec_form import SpecForm

VALIDATE_DELAY_S = 0.6


class Validated(Message):
    def __init__(self, generation: int, result: CheckResult) -> None:
        super().__init__()
        self.generation = generation
        self.result = result


class ComposeScreen(Screen):
    TITLE = "Compose"
    HELP = """Open a spec (type a path and Enter, or pick one from the list) or type a new file name to start one.
A field with one value is a base setting; several values (toggles, or a comma list) make an axis,
and the run list is their product. Errors are the same as `dstui list` prints.
mem/GPU: the memory forecast per GPU of each run, green when it fits the GPU's memory (the spec's
gpu_memory_gib, else this machine's GPU), yellow above 90%, red when it is predicted to run out.
ctrl+e edits the DeepSpeed revisions (add, edit, remove); every condition runs against each.
ctrl+s saves the spec as YAML; ctrl+r saves and launches it in the Runs screen."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+r", "launch", "Save+launch"),
        Binding("ctrl+o", "open", "Open"),
        Binding("ctrl+e", "revisions", "Revisions"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.path: Path | None = None
        self.data: dict[str, Any] = cm.new_spec("experiment")
        self.spec: ExperimentSpec | None = None
        self.runs: list[RunSpec] = []
        self.error: str | None = None
        self.generation = 0
        self._validate_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="compose-body"):
            yield SpecForm(id="form")
            yield RunPreview(id="preview")
        yield Footer()

    @property
    def form(self) -> SpecForm:
        return self.query_one(SpecForm)

    @property
    def preview(self) -> RunPreview:
        return self.query_one(RunPreview)

    @staticmethod
    def _rel(p: Path) -> Path:
        try:
            return p.relative_to(Path.cwd())
        except ValueError:
            return p

    def on_mount(self) -> None:
        self.preview.setup()
        spec = getattr(self.app, "spec_path", None)
        if spec:
            self.load(Path(spec))
        else:
            self._fill_form()
            self.recompute()

    # -- loading and saving ----------------------------------------------------

    def load(self, path: Path) -> None:
        path = Path(path)
        self.path = path.resolve()
        self.query_one("#path", Input).value = str(self._rel(self.path))
        if path.is_file():
            try:
                data = yaml.safe_load(path.read_text())
            except yaml.YAMLError as e:
                self.notify(f"{path}: invalid YAML: {e}", severity="error")
                return
            if not isinstance(data, dict):
                self.notify(f"{path}: a spec must be a YAML mapping", severity="error")
                return
            self.data = data
        else:
            self.data = cm.new_spec(path.stem)
            self.notify(f"new spec {path.name}: ctrl+s saves it", timeout=4)
        self._fill_form()
        self.recompute()

    def _fill_form(self) -> None:
        self.form.fill(self.data)
        extras = [k for k in ("conditions", "exclude") if self.data.get(k)]
        if extras:
            self.notify("kept as they are: " + ", ".join(extras) + " (edit the YAML for those)", timeout=4)

    def action_revisions(self) -> None:
        from dstui.tui.screens.revisions import RevisionEditor

        self.app.push_screen(RevisionEditor(self.data), self._revisions_edited)

    def _revisions_edited(self, data: dict[str, Any] | None) -> None:
        if data is None or data == self.data:
            return
        self.data = data
        self.form.show_revisions(data)
        self.recompute()

    def action_open(self) -> None:
        self.query_one("#path", Input).focus()

    @on(Input.Submitted, "#path")
    def _path_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.app.spec_path = Path(event.value.strip()).resolve()  # type: ignore[attr-defined]
            self.load(Path(event.value.strip()))

    @on(OptionList.OptionSelected, "#files")
    def _file_picked(self, event: OptionList.OptionSelected) -> None:
        path = Path(str(event.option.id))
        self.app.spec_path = path.resolve()  # type: ignore[attr-defined]
        self.load(path)

    def save(self) -> Path | None:
        text = self.query_one("#path", Input).value.strip()
        if not text:
            self.notify("type a file name in 'spec file' first", severity="warning")
            self.query_one("#path", Input).focus()
            return None
        path = Path(text).resolve()
        try:
            spec = parse_spec(self.data, file=str(path))
            expand(spec, file=str(path))
        except SpecError as e:
            self.notify(f"not saved: {e}", severity="error", timeout=8)
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        save_spec(spec, path)
        self.path = path
        self.app.spec_path = path  # type: ignore[attr-defined]
        # what is on disk is what we edit from now on (normalised by the model)
        self.data = yaml.safe_load(dump_spec(spec))
        self.notify(f"saved {self._rel(path)}: {len(self.runs)} runs")
        return path

    def action_save(self) -> None:
        self.save()

    def action_launch(self) -> None:
        if self.save() is not None:
            self.app.launch_current()  # type: ignore[attr-defined]

    # -- editing -------------------------------------------------------------

    def on_spec_form_field_edited(self, message: SpecForm.FieldEdited) -> None:
        self.data = cm.set_values(self.data, message.field, message.values)
        self.recompute()

    def on_spec_form_top_edited(self, message: SpecForm.TopEdited) -> None:
        self.data = cm.set_top(self.data, message.key, message.value)
        self.recompute()

    def on_spec_form_invalid(self, message: SpecForm.Invalid) -> None:
        self.preview.show_error(message.error)

    def recompute(self) -> None:
        """parse_spec + expand on the current mapping; update the run list and count."""
        self.generation += 1
        file = str(self.path) if self.path else None
        try:
            self.spec = parse_spec(self.data, file=file)
            self.runs = expand(self.spec, file=file)
            self.error = None
        except DstuiError as e:
            self.spec, self.runs, self.error = None, [], str(e)
        self.preview.show_runs(self.spec, self.runs)
        self.preview.show_error(self.error)
        self._schedule_validation()

    # -- DeepSpeed validation and memory forecast (thread) ---------------------

    def _schedule_validation(self) -> None:
        if self._validate_timer is not None:
            self._validate_timer.stop()
        self.preview.check_pending(bool(self.runs))
        if self.runs:
            self._validate_timer = self.set_timer(VALIDATE_DELAY_S, self._start_validation)

    def _start_validation(self) -> None:
        if self.runs:
            spec_dir = self.path.parent if self.path else Path.cwd()
            declared = self.spec.gpu_memory_gib if self.spec else None
            self.validate_ds(self.generation, list(self.runs), str(self.path) if self.path else None, spec_dir, declared)

    @work(thread=True, exclusive=True, group="ds-validate", exit_on_error=False, name="DeepSpeed check")
    def validate_ds(
        self, generation: int, runs: list[RunSpec], file: str | None, spec_dir: Path, declared_gib: float | None = None
    ) -> None:
        self.post_message(Validated(generation, compose_check.check(runs, file, spec_dir, declared_gib)))

    def on_validated(self, message: Validated) -> None:
        if message.generation != self.generation:
            return  # an older version of the spec: stale
        self.preview.show_check(message.result)
