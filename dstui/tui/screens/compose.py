"""Compose: open or create a spec, edit every part of it, see the expanded runs, save, launch.

The spec is edited in memory: a plain mapping as PyYAML reads it (what ``dstui
run`` sees). The file is the user's: it is written only by a save (ctrl+s, or
save as: ctrl+t, a path, Enter); Enter in the path field otherwise opens, never
writes. A save changes only the edited keys
(comments, order and layout kept: :func:`dstui.spec.loading.updated_text`).
dstui's own specs (configs/experiments/, the installed copies) open read-only
and are saved under a new name. Launching an unchanged spec launches its file;
launching edits not saved launches them as they are and keeps their text
beside the batch (dstui/tui/run_control.py), the file untouched. Quitting or
opening another spec with unsaved edits asks first.

Every edit re-runs :func:`dstui.spec.loading.parse_spec` and :func:`dstui.spec.expand.expand`
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

import contextlib
import copy
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Header, Input, OptionList

from dstui.core.errors import DstuiError
from dstui.spec.expand import expand
from dstui.spec.experiment import ExperimentSpec, RunSpec
from dstui.spec.loading import parse_spec
from dstui.tui import compose_check
from dstui.tui import compose_model as cm
from dstui.tui import compose_texts as ct
from dstui.tui.compose_check import CheckResult
from dstui.tui.face import face
from dstui.tui.screens.compose_files import SAVE_AS_KEY, SpecFileActions
from dstui.tui.widgets.fitting_footer import FittingFooter
from dstui.tui.widgets.run_preview import RunPreview
from dstui.tui.widgets.spec_form import SpecForm

VALIDATE_DELAY_S = 0.6
# a baseline naming no condition is refused (dstui.spec.loading), yet the runs are still worth showing
BASELINE_FIELDS = ("baseline", "guard.baseline")


class Validated(Message):
    def __init__(self, generation: int, result: CheckResult) -> None:
        super().__init__()
        self.generation = generation
        self.result = result


class ComposeScreen(SpecFileActions, Screen):
    TITLE = "Compose"
    # one string per paragraph: the help screen wraps them to its width (a hard-wrapped line would break twice)
    HELP = (
        "Open a spec: ctrl+o, type its path and Enter, or pick one from the list; ctrl+n starts a new one. "
        "Enter in 'spec file' opens the path typed there (a path with no file starts a new spec named after it); "
        "with unsaved edits it asks before discarding them. It never writes a file.\n"
        "A field with one value is a base setting; several values (toggles, or a comma list) make an axis, "
        "and the run list is their product. An empty field uses the default it shows. Every choice row keeps "
        "at least one value checked. Mappings and lists (ds_overrides, command, launcher, ...), exclusions, "
        "explicit conditions and run options are YAML or JSON texts; a list of values is an axis.\n"
        "Errors are the same as `dstui list` prints. A field marked ✗ (a text that does not read, a row with "
        "nothing checked) is not used: the run list is the spec before that edit, and save and launch are "
        "refused until it is fixed. After a pause in typing the spec is checked as `dstui run` checks it "
        "(each model exists, DeepSpeed accepts each config, the memory forecast, this machine): what it "
        "refuses is said above the run list, the model field is marked ✗ for an unknown model, and launch "
        "waits for a fix.\n"
        "mem/GPU: the memory forecast per GPU of each run, green when it fits the GPU's memory (the spec's "
        "gpu_memory_gib, else this machine's GPU), yellow above 90%, red when it is predicted to run out.\n"
        "step: the predicted time per optimizer step ('~': a prediction), from the time model of this machine: "
        "first principles (FLOPs, ZeRO's communication, offload traffic) calibrated on its finished runs in MLflow.\n"
        "ctrl+e edits the DeepSpeed revisions (add, edit, remove); every condition runs against each.\n"
        f"ctrl+s saves to the spec's own file (only the edited keys change; comments stay). {SAVE_AS_KEY} saves "
        "as: type a path in 'spec file' and Enter (asking before overwriting). dstui's own specs are read-only: "
        "ctrl+s on one asks for a new name.\n"
        "ctrl+r launches the spec as it is in the Runs screen: an edited spec is not saved by launching; "
        "its text is kept in the batch folder (spec.yaml). Quitting with unsaved edits asks first."
    )

    BINDINGS = [
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+r", "launch", "Launch"),
        Binding("ctrl+o", "open", "Open"),
        Binding(SAVE_AS_KEY, "save_as", "Save as"),
        Binding("ctrl+n", "new", "New"),
        Binding("ctrl+e", "revisions", "Revisions"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.path: Path | None = None  # the file being edited (None: a new spec with no name yet)
        self.original: str | None = None  # its text when opened or last saved (None: not on disk)
        self.base: dict[str, Any] = cm.new_spec("experiment")  # what that text means
        self.data: dict[str, Any] = copy.deepcopy(self.base)  # the spec as edited
        self.read_only = False  # one of dstui's own specs
        self.path_mode = "open"  # what Enter in the path field does: "open", or "save as" (ctrl+t, or a save that needs a path)
        self.invalid: dict[str, str] = {}  # form widget -> why its text is not used
        self.spec: ExperimentSpec | None = None
        self.runs: list[RunSpec] = []
        self.error: str | None = None
        self.generation = 0
        self._validate_timer: Timer | None = None
        self.refused: str | None = None  # what the check of the current spec refused (`dstui run` would too)
        self._refused_row: str | None = None  # the form row marked for it

    def on_worker_state_changed(self, event) -> None:  # noqa: ANN001 - Worker.StateChanged (does not bubble)
        face(self).on_worker_state_changed(event)  # a failure said, not swallowed

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="compose-body"):
            yield SpecForm(id="form")
            yield RunPreview(id="preview")
        yield FittingFooter()

    @property
    def form(self) -> SpecForm:
        return self.query_one(SpecForm)

    @property
    def preview(self) -> RunPreview:
        return self.query_one(RunPreview)

    @property
    def path_input(self) -> Input:
        return self.query_one("#path", Input)

    @property
    def dirty(self) -> bool:
        """Edits not saved: the mapping differs from what the file (or the new spec) held."""
        return self.data != self.base

    @staticmethod
    def _rel(p: Path) -> Path:
        try:
            return p.relative_to(Path.cwd())
        except ValueError:
            return p

    def on_mount(self) -> None:
        self.preview.setup()
        spec = face(self).spec_path
        if spec:
            self.load(Path(spec))
        else:
            self._fill_form()
            self.recompute()

    def _fill_form(self) -> None:
        self.form.fill(self.data)
        self._show_path()

    def _show_path(self) -> None:
        """The path field's title says what Enter there does now, and which key saves."""
        if self.path_mode == "save as":
            text = "[bold]save as[/]: Enter writes the spec to this path (asks before overwriting)"
        elif self.read_only:
            edits = ", [bold yellow]● unsaved[/]" if self.dirty else ""
            text = f"spec file [yellow]read-only (dstui's own)[/]{edits}: {SAVE_AS_KEY} saves a copy; Enter opens"
        elif self.dirty:
            text = f"spec file [bold yellow]● unsaved[/]: ctrl+s saves, {SAVE_AS_KEY} saves as; Enter opens"
        else:
            text = "spec file (Enter opens the path typed here)"
        self.form.show_path(text)

    def action_revisions(self) -> None:
        from dstui.tui.screens.revisions import RevisionEditor

        self.app.push_screen(RevisionEditor(self.data), self._revisions_edited)

    def _revisions_edited(self, data: dict[str, Any] | None) -> None:
        if data is None or data == self.data:
            return
        self.data = data
        self.form.show_revisions(data)
        self.recompute()

    @on(Input.Submitted, "#path")
    def _path_submitted(self, event: Input.Submitted) -> None:
        self.path_entered(event.value)

    @on(Input.Blurred, "#path")
    def _path_blurred(self, event: Input.Blurred) -> None:
        if self.app.screen is self:  # not a question on top (the field is still in use under it)
            self.path_left()

    @on(OptionList.OptionSelected, "#files")
    def _file_picked(self, event: OptionList.OptionSelected) -> None:
        self.request_open(Path(str(event.option.id)))

    def launch_blocker(self) -> str | None:
        """Why the spec as shown cannot be launched: a field marked ✗ (its edit is not in the
        mapping, so a launch would run something else than the form shows), a spec error, or
        what the check refused (`dstui run` refuses it too: an unknown model, a bad config)."""
        return self._first_error() or self.refused

    def action_launch(self) -> None:
        why = self.launch_blocker()
        if why:
            self.notify(f"not launched: {why}", severity="error", timeout=8)
            return
        app = face(self)
        if self.path is not None and self.original is not None and not self.dirty:
            app.spec_path = self.path
        app.launch_current()  # launches self.draft() when edited

    # -- editing -------------------------------------------------------------

    def _valid_again(self, source: str) -> None:
        if self.invalid.pop(source, None) is not None:
            self.form.mark(source, False)

    def on_spec_form_field_edited(self, message: SpecForm.FieldEdited) -> None:
        self._valid_again(message.source)
        self.data = cm.set_values(self.data, message.field, message.values)
        self.recompute()

    def on_spec_form_top_edited(self, message: SpecForm.TopEdited) -> None:
        self._valid_again(message.source)
        if message.key == "run options":
            self.data = ct.set_run_options(self.data, message.value)
        else:
            self.data = cm.set_top(self.data, message.key, message.value)
        self.recompute()

    def on_spec_form_invalid(self, message: SpecForm.Invalid) -> None:
        self.invalid[message.source] = message.error
        self.form.mark(message.source, True)
        self.preview.show_error(self._first_error())
        self.preview.show_blocked(bool(self.invalid))
        # the DeepSpeed check said something about the spec before this edit: not about what is typed now
        if self._validate_timer is not None:
            self._validate_timer.stop()
        self.generation += 1
        self.preview.check_pending(False)
        self._show_path()

    def _first_error(self) -> str | None:
        return next(iter(self.invalid.values()), None) or self.error

    def recompute(self) -> None:
        """parse_spec + expand on the current mapping; update the run list and count."""
        self.generation += 1
        self.refused = None  # the check said it of the spec before this edit; it runs again
        file = str(self.path) if self.path else None
        try:
            self.spec = parse_spec(self.data, file=file)
            self.runs = expand(self.spec, file=file)
            self.error = None
        except DstuiError as e:
            self.spec, self.runs, self.error = None, [], str(e)
            if getattr(e, "field", None) in BASELINE_FIELDS:
                self._runs_despite_baseline(file)
        self.preview.show_runs(self.spec, self.runs)
        self.preview.show_blocked(bool(self.invalid))
        self.preview.show_error(self._first_error())
        self._show_path()
        self._schedule_validation()

    def _runs_despite_baseline(self, file: str | None) -> None:
        """The runs of a spec whose only fault is a baseline that names no condition, the error kept.

        Dropping ZeRO 0 from a spec whose baseline is z0 is one click; the run list
        going blank for it would hide what the edit did. The error still blocks the
        launch (:meth:`launch_blocker`) and says which conditions the baseline can name.
        """
        data = copy.deepcopy(self.data)
        data.pop("baseline", None)
        if isinstance(data.get("guard"), dict):
            data["guard"].pop("baseline", None)
        with contextlib.suppress(DstuiError):
            self.runs = expand(parse_spec(data, file=file), file=file)

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
        executor = self.spec.executor if self.spec is not None else "local"
        self.post_message(Validated(generation, compose_check.check(runs, file, spec_dir, declared_gib, executor)))

    def on_validated(self, message: Validated) -> None:
        if message.generation != self.generation:
            return  # an older version of the spec: stale
        result = message.result
        self.preview.show_check(result)
        # what `dstui run` would refuse (an unknown model, a config DeepSpeed rejects) blocks launch here too,
        # and the field it names is marked, as a text that does not read is
        self.refused = result.error
        self._mark_refused(result.error_field if result.error else None)

    def _mark_refused(self, field: str | None) -> None:
        """Mark the settings field the check refused (its row ✗), unmark the one it refused before."""
        shown = f"in-{field}" if field else None
        if self._refused_row and self._refused_row != shown and self._refused_row not in self.invalid:
            self.form.mark(self._refused_row, False)
        self._refused_row = None
        if shown and self.form.query(f"#{shown}"):
            self.form.mark(shown, True)
            self._refused_row = shown
