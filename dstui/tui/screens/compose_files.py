"""Compose's file side: open, save, save as, the unsaved-edits question, the spec to launch.

A spec file is the user's. Nothing here writes one except a save the user asks
for (ctrl+s, or save as: ctrl+t then Enter); Enter in 'spec file' otherwise only
opens. A save changes only the edited keys
(:func:`dstui.spec.loading.updated_text`) and is refused for dstui's own specs
(:func:`dstui.spec.loading.is_shipped`), which are saved under a new name.
Launching edits that are not saved hands :meth:`SpecFileActions.draft` to the
launch (dstui/tui/run_control.py), which keeps its text beside the batch.

A mixin of :class:`~dstui.tui.screens.compose.ComposeScreen`: it uses the
screen's spec state (``path``, ``original``, ``base``, ``data``, ``read_only``,
``invalid``) and its form.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dstui.core.errors import SpecError
from dstui.spec import bounded_yaml
from dstui.spec.expand import expand
from dstui.spec.loading import (
    SpecDraft,
    is_shipped,
    parse_spec,
    plain_text,
    read_spec_text,
    save_spec_text,
    updated_text,
)
from dstui.tui import compose_model as cm
from dstui.tui.face import face

SAVE_AS_KEY = "ctrl+t"
SAVE_AS_HINT = f"{SAVE_AS_KEY} saves them under a new name first"


class SpecFileActions:
    """Opening and saving the spec a Compose screen edits."""

    path: Path | None
    original: str | None
    base: dict[str, Any]
    data: dict[str, Any]
    read_only: bool
    invalid: dict[str, str]
    path_mode: str  # what Enter in the path field does: "open" or "save as"

    def load(self, path: Path) -> None:
        """Edit ``path`` (a new spec named after it when there is no such file); unsaved edits are dropped."""
        path = Path(path).resolve()
        if path.is_file():
            try:
                text = read_spec_text(path)
                data = bounded_yaml.load(text, file=str(path))
            except SpecError as e:
                self.notify(str(e), severity="error")
                return
            if not isinstance(data, dict):
                self.notify(f"{path}: a spec must be a YAML mapping", severity="error")
                return
            self.original, self.base = text, data
            self.read_only = is_shipped(path)
            if self.read_only:
                self.notify(f"{path.name} is one of dstui's own specs: read-only, save it under a new name", timeout=5)
        else:
            self.original, self.base, self.read_only = None, cm.new_spec(path.stem), False
            self.notify(f"new spec {path.name}: ctrl+s saves it", timeout=4)
        self.path, self.path_mode = path, "open"
        face(self).spec_path = path  # type: ignore[arg-type]  (a mixin of a Screen)
        self.data = copy.deepcopy(self.base)
        self.invalid.clear()
        self.path_input.value = str(self._rel(path))
        self._fill_form()
        self.recompute()

    def ask_discard(self, what: str, then: Callable[[], object]) -> None:
        """Run ``then`` at once without unsaved edits, else after the user agrees to lose them.

        The question names a key that can keep the edits: ctrl+s cannot write a read-only
        (shipped) spec or a spec with no file, so there it is save as.
        """
        if not self.dirty:
            then()
            return
        from dstui.tui.screens.confirm import ConfirmScreen

        name = self.path.name if self.path else "the new spec"
        if self.invalid:  # no save key works while a field is marked ✗
            keep = "a field marked ✗ must be fixed before they can be saved"
        else:
            keep = SAVE_AS_HINT if self.read_only or self.path is None else "ctrl+s saves them first"
        self.app.push_screen(
            ConfirmScreen(f"{name} has unsaved edits.\nDiscard your edits and {what}? ({keep})"),
            lambda yes: then() if yes else None,
        )

    def request_open(self, path: Path) -> None:
        path = Path(path).resolve()
        if path == self.path and not self.dirty:
            self.path_input.value = str(self._rel(path))
            self.notify(f"{self._rel(path)} is open already")
            return
        what = f"reopen {self._rel(path)} as it is on disk" if path == self.path else f"open {self._rel(path)}"
        if not path.is_file():
            what = f"start a new spec {self._rel(path)}"
        self.ask_discard(what, lambda: self.load(path))

    def action_new(self) -> None:
        def start() -> None:
            self.path, self.original, self.read_only = None, None, False
            self.base = cm.new_spec("experiment")
            self.data = copy.deepcopy(self.base)
            self.invalid.clear()
            self.path_input.value = ""
            self.path_mode = "open"
            self._fill_form()
            self.recompute()
            self.path_input.focus()

        self.ask_discard("start a new spec", start)

    def action_open(self) -> None:
        """ctrl+o: the path field, for a path to open (Enter opens it; nothing is saved)."""
        self.path_mode = "open"
        self._show_path()
        self._focus_path()

    def action_save_as(self) -> None:
        """The path field, for a path to save to (Enter writes there)."""
        self.path_mode = "save as"
        if self.path is None or self.read_only:
            self.path_input.value = str(self._rel(self._suggest_path()))
        self._show_path()
        self._focus_path()

    def _focus_path(self) -> None:
        inp = self.path_input
        inp.focus()
        inp.select_all()  # typing replaces the path shown

    def path_entered(self, value: str) -> None:
        """Enter in 'spec file' does what its title says: open that path, or (save as) write the spec there.

        Opening never writes: a path that exists is opened (asking first when there are unsaved
        edits), one that does not starts a new spec named after it. Writing is only ever asked for
        with a save key (ctrl+s, save as), so Enter after ctrl+o cannot overwrite the file meant to
        be opened.
        """
        text = value.strip()
        if not text:
            return
        target = Path(text).expanduser().resolve()
        if self.path_mode == "save as":
            self.save_to(target)
        else:
            self.request_open(target)

    def path_left(self) -> None:
        """Focus left the path field: it shows the file being edited again, ready to open another."""
        self.path_mode = "open"
        self.path_input.value = str(self._rel(self.path)) if self.path else ""
        self._show_path()

    def _suggest_path(self) -> Path:
        """Where a copy of a read-only spec could go: NAME.yaml here, else NAME-2.yaml, ..."""
        name = str(self.data.get("name") or "experiment")
        for n in range(1, 100):
            p = Path.cwd() / (f"{name}.yaml" if n == 1 else f"{name}-{n}.yaml")
            if not p.exists():
                return p
        return Path.cwd() / f"{name}-copy.yaml"

    def _ask_for_path(self, why: str) -> None:
        self.path_mode = "save as"
        self.path_input.value = str(self._rel(self._suggest_path()))
        self._show_path()
        self._focus_path()
        self.notify(f"{why}: Enter saves as the path in 'spec file'", severity="warning", timeout=6)

    def save_to(self, target: Path, *, overwrite: bool = False) -> bool:
        """Write the spec to ``target`` (only the edited keys change); False when it was not written."""
        if self.invalid:
            self.notify(f"not saved: {next(iter(self.invalid.values()))}", severity="error", timeout=8)
            return False
        if is_shipped(target):
            self._ask_for_path(f"{target.name} is one of dstui's own specs")
            return False
        same = target == self.path
        if same and not self.dirty and self.original is not None:
            self.notify("no changes to save")
            return True
        if not same and target.exists() and not overwrite:
            from dstui.tui.screens.confirm import ConfirmScreen

            self.app.push_screen(
                ConfirmScreen(f"{self._rel(target)} exists.\nOverwrite it with this spec?"),
                lambda yes: self.save_to(target, overwrite=True) if yes else None,
            )
            return False
        try:
            spec = parse_spec(self.data, file=str(target))
            expand(spec, file=str(target))
            text = self._text_for(target, same)
            save_spec_text(target, text)
        except SpecError as e:
            self.notify(f"not saved: {e}", severity="error", timeout=8)
            return False
        except OSError as e:
            self.notify(f"not saved: {target}: {e.strerror or e}", severity="error", timeout=8)
            return False
        self.path, self.original, self.read_only = target, text, False
        self.path_mode = "open"
        self.base = copy.deepcopy(self.data)
        face(self).spec_path = target  # type: ignore[arg-type]
        self.path_input.value = str(self._rel(target))
        self._show_path()
        self.notify(f"saved {self._rel(target)}: {len(self.runs)} runs")
        return True

    def _text_for(self, target: Path, same: bool) -> str:
        """The file's text with the edits; under a new name, plain YAML when the layout cannot be kept."""
        try:
            return updated_text(self.original, self.data, file=str(target))
        except SpecError as e:
            if same:
                raise
            self.notify(f"{e.message.split(';')[0]}: written as plain YAML, without its comments", severity="warning", timeout=8)
            return plain_text(self.data)

    def action_save(self) -> None:
        """ctrl+s: the spec to its own file; where that cannot be (read-only, no file yet), save as.

        In save-as mode it writes to the path typed there, as Enter does: the path field is
        never read otherwise, so a path typed to open is not where a save goes.
        """
        if self.path_mode == "save as":
            self.path_entered(self.path_input.value)
            return
        if self.read_only:
            self._ask_for_path(f"{self.path.name if self.path else 'this spec'} is one of dstui's own specs")
            return
        if self.path is None:
            self._ask_for_path("this spec has no file yet")
            return
        self.save_to(self.path)

    def draft(self) -> SpecDraft | None:
        """The spec as edited when that is not its file (unsaved edits, or a named spec not saved yet); else None."""
        if not self.dirty and (self.path is None or self.original is not None):
            return None  # its file as it is, or a new spec nobody has touched (nothing to launch)
        try:
            text = updated_text(self.original, self.data)
        except SpecError:
            text = plain_text(self.data)  # a copy to launch from: its layout matters less than the runs
        return SpecDraft(copy.deepcopy(self.data), text, self.path if self.original is not None else None)
