"""What a screen may ask of the app: one typed interface instead of attribute probes.

Screens used to probe the app (``getattr(self.app, "watch_s", 1.0)``,
``hasattr(self.app, "compose_draft")``: 19 of them), so a renamed attribute
silently fell back to a default. :class:`AppFace` is what
:class:`dstui.tui.app.DstuiApp` offers them, and :func:`face` is the one
checked way to reach it (a screen cannot import the app: the app imports the
screens).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dstui.usecases.options import DEFAULT_PARALLEL

if TYPE_CHECKING:  # the spec models cost ~0.2 s to import: not on the TUI's start path
    from textual.dom import DOMNode

    from dstui.spec.loading import SpecDraft
    from dstui.tui.home_snapshot import HomeSnapshot


@dataclass(frozen=True)
class StartOptions:
    """How the TUI was started (`dstui tui`, `dstui demo`); fixed for its life."""

    batch_id: str | None = None  # the batch the Runs screen shows first
    live: bool = False  # ... with its Live view open
    parallel: int = DEFAULT_PARALLEL  # for batches launched here: `dstui run --parallel` (0 = auto)
    supervise: bool = True  # take over unfinished batches whose supervisor died (off in snapshots)
    watch_s: float = 1.0  # how often the runs home and the live view are read


@runtime_checkable
class AppFace(Protocol):
    options: StartOptions
    spec_path: Path | None  # the current spec: Compose shows it, l launches it
    home: HomeSnapshot | None  # the newest snapshot of the runs home (None before the first)

    def refresh_home(self, *, relist: bool = False) -> None:
        """Read the runs home now (after a launch, a cancel); ``relist``: look for new batches too."""

    def compose_draft(self) -> SpecDraft | None:
        """The spec open in Compose when it has unsaved edits (launch that, not its file); else None."""

    def compose_blocker(self) -> str | None:
        """Why the spec open in Compose must not be launched (a field marked ✗); else None."""

    def launch_current(self) -> None:
        """Launch the current spec from the Runs screen."""

    def on_worker_state_changed(self, event: object) -> None:
        """A screen's worker that failed: said in a toast (Textual does not bubble it to the app)."""


def face(node: DOMNode) -> AppFace:
    """The app a widget or screen runs in, as the interface screens may use."""
    app = node.app
    if not isinstance(app, AppFace):
        raise TypeError(f"{type(app).__name__} is not a dstui app (a screen of dstui needs AppFace)")
    return app
