"""Compose: open or create a spec, pick axis values, see the expanded runs, save, launch.

Every edit re-runs :func:`dstui.spec.models.parse_spec` and :func:`dstui.spec.models.expand`
(pure and cheap), so the run list, its count and the first error (the CLI's
SpecError text) follow each keystroke. DeepSpeed's own config validation
imports deepspeed, so it runs in a thread worker after a short pause in typing;
a result for an older version of the spec is dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.suggester import SuggestFromList
from textual.timer import Timer
from textual.widgets import Checkbox, DataTable, Footer, Header, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from dstui.core.errors import DstuiError, SpecError
from dstui.core.paths import REPO_DIR
from dstui.spec.models import ExperimentSpec, RunSpec, dump_spec, expand, parse_spec, save_spec
from dstui.tui import compose_model as cm
from dstui.tui.widgets.toggle import Toggle

VALIDATE_DELAY_S = 0.6
RUN_COLUMNS = ("#", "run", "zero", "offload", "compile", "dtype", "mb", "seq", "ga", "gpus", "model")


def run_row(r: RunSpec) -> tuple:
    s = r.settings
    off = s.offload if s.offload_params == "none" else f"{s.offload}/{s.offload_params}"
    comp = "dc" if s.deepcompile else ("tc" if s.compile else "-")
    if s.kind == "command":
        comp = "cmd"
    return (
        str(r.order), r.name, f"z{s.zero_stage}", off, comp, s.dtype, str(s.micro_batch),
        str(s.seq_length), str(s.grad_accum), str(s.gpus * s.nodes), Path(s.model).name,
    )  # fmt: skip


def _repo_rel(p: Path) -> str:
    try:
        return str(p.relative_to(REPO_DIR))
    except ValueError:
        return str(p)


class Validated(Message):
    def __init__(self, generation: int, error: str | None, note: str = "") -> None:
        super().__init__()
        self.generation = generation
        self.error = error
        self.note = note


class ComposeScreen(Screen):
    TITLE = "Compose"
    HELP = """Open a spec (type a path and Enter, or pick one from the list) or type a new file name to start one.
A field with one value is a base setting; several values (toggles, or a comma list) make an axis,
and the run list is their product. Errors are the same as `dstui list` prints.
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
        self._validated: tuple[int, str | None] = (-1, None)

    # -- layout ----------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="compose-body"):
            with VerticalScroll(id="form"):
                yield Label("spec file (Enter opens or starts one)", classes="form-title")
                yield Input(placeholder="configs/experiments/my.yaml", id="path", compact=True)
                yield OptionList(*[Option(_repo_rel(p), id=str(p)) for p in cm.experiment_files()], id="files")
                yield self._row("name", Input(id="name", compact=True))
                for field in cm.FORM_ORDER:
                    if field in cm.CHOICES:
                        boxes = [
                            Toggle(cm.choice_text(v), id=f"ck-{field}-{i}", classes="choice")
                            for i, v in enumerate(cm.CHOICES[field])
                        ]
                        yield self._row(cm.LABELS[field], Horizontal(*boxes, classes="choices"))
                    else:
                        inp = Input(id=f"in-{field}", compact=True, placeholder="comma list")
                        if field == "model":
                            inp.suggester = SuggestFromList(cm.model_presets())
                            inp.placeholder = "preset or hub id, comma list"
                        yield self._row(cm.LABELS[field], inp)
                yield self._row("repeats", Input(id="repeats", compact=True, type="integer"))
                yield self._row("baseline", Input(id="baseline", compact=True, placeholder="condition name"))
                yield Static(id="revisions")
            with Vertical(id="preview"):
                yield Static(id="count")
                yield Static(id="error")
                yield Static(id="dsvalid")
                yield DataTable(id="runlist", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def _row(self, label: str, widget: Any) -> Horizontal:
        return Horizontal(Label(label, classes="form-label"), widget, classes="form-row")

    @staticmethod
    def _rel(p: Path) -> Path:
        try:
            return p.relative_to(Path.cwd())
        except ValueError:
            return p

    def on_mount(self) -> None:
        self.query_one("#runlist", DataTable).add_columns(*RUN_COLUMNS)
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
        d = self.data
        with self.prevent(Input.Changed, Checkbox.Changed):
            self.query_one("#name", Input).value = str(d.get("name", ""))
            for field in cm.FORM_ORDER:
                values = cm.values_of(d, field)
                if field in cm.CHOICES:
                    for i, v in enumerate(cm.CHOICES[field]):
                        self.query_one(f"#ck-{field}-{i}", Checkbox).value = v in values
                else:
                    self.query_one(f"#in-{field}", Input).value = cm.list_text(values)
            self.query_one("#repeats", Input).value = str(d.get("repeats", 1))
            self.query_one("#baseline", Input).value = str(d.get("baseline") or "")
        self._show_revisions()
        extras = [k for k in ("conditions", "exclude") if d.get(k)]
        if extras:
            self.notify("kept as they are: " + ", ".join(extras) + " (edit the YAML for those)", timeout=4)

    def _show_revisions(self) -> None:
        revs = [r for r in (self.data.get("revisions") or []) if isinstance(r, dict)]
        lines = [Text.assemble(("revisions", "bold"), ("  ctrl+e edits", "dim"))]
        lines += [Text(f"  {cm.revision_text(r)}") for r in revs]
        if not revs:
            lines.append(Text("  none: the installed DeepSpeed", style="dim"))
        self.query_one("#revisions", Static).update(Text("\n").join(lines))

    def action_revisions(self) -> None:
        from dstui.tui.screens.revisions import RevisionEditor

        self.app.push_screen(RevisionEditor(self.data), self._revisions_edited)

    def _revisions_edited(self, data: dict[str, Any] | None) -> None:
        if data is None or data == self.data:
            return
        self.data = data
        self._show_revisions()
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

    @on(Checkbox.Changed, ".choice")
    def _choice_changed(self, event: Checkbox.Changed) -> None:
        field = str(event.checkbox.id).split("-")[1]
        values = [
            v
            for i, v in enumerate(cm.CHOICES[field])
            if self.query_one(f"#ck-{field}-{i}", Checkbox).value
        ]
        self.data = cm.set_values(self.data, field, values)
        self.recompute()

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        wid = event.input.id or ""
        try:
            if wid.startswith("in-"):
                field = wid[3:]
                self.data = cm.set_values(self.data, field, cm.parse_list(field, event.value))
            elif wid == "name":
                self.data = cm.set_top(self.data, "name", event.value.strip())
            elif wid == "repeats":
                value = event.value.strip()
                self.data = cm.set_top(self.data, "repeats", int(value) if value else None)
            elif wid == "baseline":
                self.data = cm.set_top(self.data, "baseline", event.value.strip() or None)
            else:
                return
        except ValueError as e:
            self._show_error(str(e))
            return
        self.recompute()

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
        self._show_runs()
        self._show_error(self.error)
        self._schedule_validation()

    def _show_runs(self) -> None:
        table = self.query_one("#runlist", DataTable)
        table.clear()
        for r in self.runs:
            table.add_row(*run_row(r), key=r.name)
        count = self.query_one("#count", Static)
        if self.spec is not None:
            n_cond = len({r.condition for r in self.runs})
            n_rev = max(1, len(self.spec.revisions))
            count.update(
                Text.assemble(
                    (f"{len(self.runs)} runs", "bold"),
                    f" = {n_cond} conditions × {n_rev} revision{'s' if n_rev > 1 else ''}"
                    f" × {self.spec.repeats} repeat{'s' if self.spec.repeats > 1 else ''}",
                )
            )
        else:
            count.update(Text("0 runs", style="bold"))

    def _show_error(self, text: str | None) -> None:
        box = self.query_one("#error", Static)
        box.update(Text(f"✗ {text}", style="bold red") if text else "")
        box.display = bool(text)

    # -- DeepSpeed validation (thread) ---------------------------------------

    def _schedule_validation(self) -> None:
        if self._validate_timer is not None:
            self._validate_timer.stop()
        dsv = self.query_one("#dsvalid", Static)
        if not self.runs:
            dsv.update("")
            return
        dsv.update(Text("DeepSpeed check: pending…", style="dim"))
        self._validate_timer = self.set_timer(VALIDATE_DELAY_S, self._start_validation)

    def _start_validation(self) -> None:
        if self.runs:
            spec_dir = self.path.parent if self.path else Path.cwd()
            self.validate_ds(self.generation, list(self.runs), str(self.path) if self.path else None, spec_dir)

    @work(thread=True, exclusive=True, group="ds-validate", exit_on_error=False, name="DeepSpeed check")
    def validate_ds(self, generation: int, runs: list[RunSpec], file: str | None, spec_dir: Path) -> None:
        from dstui.spec import dsconfig

        try:
            dsconfig.build_and_validate(runs, file=file, spec_dir=spec_dir)
        except SpecError as e:
            if "not installed" in e.message:
                self.post_message(Validated(generation, None, "DeepSpeed not installed: config not checked"))
            else:
                self.post_message(Validated(generation, str(e)))
            return
        self.post_message(Validated(generation, None))

    def on_validated(self, message: Validated) -> None:
        if message.generation != self.generation:
            return  # an older version of the spec: stale
        dsv = self.query_one("#dsvalid", Static)
        if message.error:
            dsv.update(Text(f"✗ {message.error}", style="bold red"))
        elif message.note:
            dsv.update(Text(message.note, style="yellow"))
        else:
            dsv.update(Text("✓ DeepSpeed configs valid", style="green"))
