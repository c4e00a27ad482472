"""What the runs screen's keys do to batches, run in its thread workers (no textual here).

The services are the CLI's (:mod:`dstui.usecases`): the TUI launches, resumes,
cancels, retries and takes over exactly as `dstui run`, `dstui cancel`, `dstui
retry` and `dstui status` do, with the same defaults (``LaunchOptions``). This
module only turns their answers into what the screen shows: a launch is
:class:`Launched`, or :class:`Refused` with the one line `dstui run` prints
(and whether "launch anyway?" may be asked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dstui.core import paths
from dstui.core.errors import DstuiError
from dstui.core.rundir import BatchDir, RunDir, list_batches
from dstui.usecases.options import LaunchOptions

if TYPE_CHECKING:  # the spec models cost ~0.2 s to import: not on the TUI's start path
    from dstui.spec.loading import SpecDraft
    from dstui.usecases.takeover import Takeover

MAX_BATCHES = 30
TAKEOVER_EVERY_S = 30.0  # how often the runs screen looks for batches whose supervisor died


@dataclass
class Launched:
    batch_id: str
    runs: int
    resumed: dict[str, int] | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        how = ("resumed " if self.resumed is not None else "launched ") + self.batch_id
        counts = ", ".join(f"{v} {k}" for k, v in self.resumed.items()) if self.resumed else f"{self.runs} runs"
        skipped = f"; {len(self.skipped)} skipped: predicted OOM" if self.skipped else ""
        return f"{how}: {counts}{skipped}"


@dataclass
class Refused:
    text: str  # `dstui run`'s error line (the spec's path left out: the screen names the spec)
    forceable: bool = False  # runs this machine cannot do: the screen may ask "launch anyway?"


def supervised(b: BatchDir) -> bool:
    """Whether a live supervisor follows this unfinished batch."""
    if b.info().get("finalized"):
        return False
    from dstui.usecases import takeover  # lazily: not on the start path

    return takeover.supervised(b)


def launch(
    spec: Path,
    parallel: int,
    progress: Callable[[str], None],
    draft: SpecDraft | None = None,
    *,
    force: bool = False,
    resume: str | None = None,
) -> Launched | Refused:
    """Everything `dstui run SPEC` does before it follows: checks, folders, skips, a detached supervisor.

    ``draft``: a spec edited in Compose and not saved. It runs as edited, and its text is
    written as ``spec.yaml`` in the batch folder (batch.json's ``spec_path`` names that copy,
    ``edited_from`` the file it came from); the user's file is never written by a launch.
    ``resume``: a batch id to continue instead of a new batch (`dstui run SPEC --resume BATCH`).
    """
    from dstui.usecases import launch as service

    options = LaunchOptions(parallel=parallel, force=force, resume=resume)
    try:
        prepared = service.prepare(spec, options, progress=progress, data=draft.data if draft else None)
        started = service.start(prepared, options, draft=draft)
    except DstuiError as e:
        return Refused(service.refusal_text(e, spec), forceable=service.forceable(e))
    b = started.batch
    return Launched(b.id, started.runs, started.resumed, started.skipped, started.notes)


def resume_spec(b: BatchDir) -> Path | None:
    """The spec a batch was launched from (an edited one's kept copy), to resume it with."""
    spec = b.info().get("spec_path")
    return Path(spec) if spec and Path(spec).is_file() else None


def cancel(rd: RunDir) -> None:
    from dstui.usecases import control

    control.cancel([rd])


def unfinished(b: BatchDir) -> list[RunDir]:
    """The runs of a batch that a cancel would stop (queued, starting, running)."""
    from dstui.usecases import control

    return control.unfinished(b)


def cancel_batch(b: BatchDir) -> list[RunDir]:
    """Cancel every unfinished run of a batch, as `dstui cancel BATCH` does; returns them."""
    from dstui.usecases import control

    return control.cancel(b.runs())[0]


def retry(rd: RunDir, notify: Callable[[str], None]) -> None:
    """Queue a failed/killed/skipped run again (its old attempt kept), as `dstui retry` does."""
    from dstui.usecases import control

    control.requeue([rd])
    notify(f"queued again: {rd.name} (old attempt kept)")


def take_over(policy: Takeover) -> tuple[dict[str, bool], list[str], list[str]]:
    """Look after the newest batches by the one takeover rule: (live ids, restarted ids, notes for given-up ones)."""
    from dstui.usecases import takeover

    batches = {b.id: b for b in list_batches(paths.runs_dir())[:MAX_BATCHES]}
    verdicts = policy.look(batches.values())
    live = {bid: v in (takeover.SUPERVISED, takeover.RESTARTED) for bid, v in verdicts.items()}
    restarted = [bid for bid, v in verdicts.items() if v == takeover.RESTARTED]
    gave_up = [f"{bid}: {policy.gave_up_note(batches[bid])}" for bid, v in verdicts.items() if v == takeover.GAVE_UP]
    return live, restarted, gave_up


def new_takeover() -> Takeover:
    from dstui.usecases.takeover import Takeover

    return Takeover()

