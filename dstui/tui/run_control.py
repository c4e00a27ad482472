"""What the runs screen's keys do to batches, run in its thread workers (no textual here).

The services are the CLI's (:mod:`dstui.usecases`): the TUI launches, resumes,
cancels, retries and takes over exactly as `dstui run`, `dstui cancel`, `dstui
retry` and `dstui status` do, with the same defaults (``LaunchOptions``). This
module only turns their answers into what the screen shows: a launch is checked
first (:func:`prepare`: :class:`Ready`, with the question the screen asks before
anything starts), then started (:func:`start`: :class:`Launched`); either may be
:class:`Refused` with the one line `dstui run` prints (and whether "launch
anyway?" may be asked).
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
    from dstui.usecases.launch import Prepared
    from dstui.usecases.takeover import Takeover

MAX_BATCHES = 30
TAKEOVER_EVERY_S = 30.0  # how often the app looks for batches whose supervisor died


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


@dataclass
class Ready:
    """A spec that passed `dstui run`'s checks; nothing exists yet. The screen asks :meth:`question` first."""

    spec: Path
    prepared: Prepared
    options: LaunchOptions
    draft: SpecDraft | None = None

    def question(self) -> str:
        runs = self.prepared.plan.runs
        edited = " (as edited in Compose, not saved)" if self.draft is not None else ""
        if self.options.resume:
            head = f"Resume batch {self.options.resume} from {self.spec.name}{edited}?"
        else:
            head = f"Launch {len(runs)} run(s) of {self.prepared.plan.spec.name} from {self.spec.name}{edited}?"
        names = ", ".join(r.name for r in runs[:6]) + (f", ... ({len(runs) - 6} more)" if len(runs) > 6 else "")
        what = "Done runs are kept; the others run again." if self.options.resume else "They start now and go on when you quit."
        return f"{head}\n\n{names}\n\n{what}"


def prepare(
    spec: Path,
    parallel: int,
    progress: Callable[[str], None],
    draft: SpecDraft | None = None,
    *,
    force: bool = False,
    resume: str | None = None,
) -> Ready | Refused:
    """`dstui run SPEC`'s checks before anything is made: the spec, DeepSpeed's configs, the backend's
    preflight, the forecast and this machine's capacity.

    ``draft``: a spec edited in Compose and not saved; it runs as edited (see :func:`start`).
    ``resume``: a batch id to continue instead of a new batch (`dstui run SPEC --resume BATCH`).
    """
    from dstui.usecases import launch as service

    options = LaunchOptions(parallel=parallel, force=force, resume=resume)
    try:
        prepared = service.prepare(spec, options, progress=progress, data=draft.data if draft else None)
    except DstuiError as e:
        return Refused(service.refusal_text(e, spec), forceable=service.forceable(e))
    return Ready(spec, prepared, options, draft)


def start(ready: Ready) -> Launched | Refused:
    """Everything `dstui run SPEC` does after its checks: folders, skips, a detached supervisor.

    An edited spec's text is written as ``spec.yaml`` in the batch folder (batch.json's
    ``spec_path`` names that copy, ``edited_from`` the file it came from); the user's file is
    never written by a launch.
    """
    from dstui.usecases import launch as service

    try:
        started = service.start(ready.prepared, ready.options, draft=ready.draft)
    except DstuiError as e:
        return Refused(service.refusal_text(e, ready.spec), forceable=service.forceable(e))
    b = started.batch
    return Launched(b.id, started.runs, started.resumed, started.skipped, started.notes)


def resume_spec(b: BatchDir) -> Path | None:
    """The spec a batch was launched from (an edited one's kept copy), to resume it with."""
    spec = b.info().get("spec_path")
    return Path(spec) if spec and Path(spec).is_file() else None


def cancel(rd: RunDir) -> None:
    from dstui.usecases import control

    control.cancel([rd])


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

