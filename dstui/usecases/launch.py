"""Launching a batch: everything between a spec and a detached supervisor, for every face.

`dstui run`, `dstui list`, `dstui demo`, the TUI's launch (Runs ``l``, Compose
ctrl+r) and bisect used to hold their own copies of this, and the copies drifted:
the TUI made no Slurm preflight, never marked predicted-OOM runs skipped,
forecast without history and could not resume. Now there is one way:

1. :func:`make_plan`: the spec read, expanded and validated (models, DeepSpeed's
   configs), revisions resolved; a :class:`~dstui.core.errors.SpecError` in one line
   otherwise.
2. :func:`check`: the executor backend's preflight (Slurm: ``sbatch --test-only``),
   before any folder or job exists, the memory forecast with MLflow's history, held against the GPU, and
   the feasibility check that refuses runs this machine cannot do
   (:func:`forceable` tells the face it may ask "launch anyway?").
3. :func:`start`: a new batch or a resumed one, an edited spec's text kept beside it,
   runs predicted to run out of memory marked skipped, the GPUs other batches hold
   said, the supervisor spawned.

:func:`prepare` is 1 + 2. What `--dry-run` and `dstui list` print comes from
:func:`previews` (the backend's: a command, or Slurm's job script) and :func:`commands`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstui.analysis import forecast
from dstui.core import paths, run_status, startup_trace
from dstui.core.errors import DstuiError
from dstui.core.rundir import BatchDir, RunDir
from dstui.execute import backends, batch, control, core_share, feasibility, launch, sysmetrics
from dstui.spec import dsconfig
from dstui.usecases.options import LaunchOptions

if TYPE_CHECKING:
    from dstui.spec.experiment import ExperimentSpec, RunSpec
    from dstui.spec.loading import SpecDraft

DRAFT_FILE = "spec.yaml"  # an edited, unsaved spec's copy beside the batch it launched
# said as the batch starts: kind ("batch", "skipped", "note") and the line; the CLI prints it, the TUI toasts it
Say = Callable[[str, str], None]


def _mark(name: str) -> None:
    startup_trace.mark(name, "cli")


@dataclass
class Prepared:
    """A plan that passed every check before launch, and what the checks found."""

    plan: batch.Plan
    forecasts: dict[str, Any] = field(default_factory=dict)  # run name -> Forecast or None
    capacity: int | None = None  # the GPU memory the forecasts were held against
    skip_oom: bool = False  # runs forecast over ``capacity`` are marked skipped at start
    problems: list[Any] = field(default_factory=list)  # every run this machine cannot do (Infeasible)
    forced: list[Any] = field(default_factory=list)  # those launched anyway (--force)
    machine: str | None = None  # what they were held against, in words; None: a scheduler places the runs

    @property
    def runs(self) -> list[RunSpec]:
        return self.plan.runs

    @property
    def spec(self) -> ExperimentSpec:
        return self.plan.spec


@dataclass
class Started:
    """A batch handed to its supervisor."""

    batch: BatchDir
    runs: int
    resumed: dict[str, int] | None = None  # resuming: how many runs were kept, re-queued, new
    skipped: dict[str, str] = field(default_factory=dict)  # run name -> 'skipped: predicted OOM (...)'
    notes: list[str] = field(default_factory=list)  # e.g. GPUs other batches hold


def make_plan(
    spec: str | Path,
    options: LaunchOptions,
    *,
    resolve_revisions: bool = True,
    progress: Callable[[str], None] = print,
    data: dict[str, Any] | None = None,
) -> batch.Plan:
    """The spec (or ``data``: Compose's unsaved edits) expanded, validated, its revisions resolved."""
    overrides = options.slurm or {}
    return batch.plan(spec, validate=options.validate, resolve_revisions=resolve_revisions, progress=progress,
                      only=options.only, executor=options.executor, slurm=overrides, data=data)  # fmt: skip


def dry_plan(spec: str | Path, options: LaunchOptions, *, progress: Callable[[str], None] = print) -> batch.Plan:
    """`dstui run --dry-run`'s plan: :func:`make_plan` with each revision's env looked up, never built
    (``revisions`` then say ``cached`` and how a launch would make the env: issue 38.6, a 57 s pip build)."""
    p = make_plan(spec, options, resolve_revisions=False, progress=progress)
    if not p.spec.revisions:
        return p
    from dstui.revisions import envs

    return dataclasses.replace(p, revisions=envs.preview_all(p.spec.revisions))


def check(p: batch.Plan, options: LaunchOptions, *, refuse: bool = True, dry_run: bool = False) -> Prepared:
    """The checks `dstui run` makes before anything exists; ``refuse=False``: only find (`dstui list`).

    Refusing: the backend's preflight (Slurm: ``sbatch --test-only``), then runs that
    cannot work here raise ``InfeasibleRuns`` unless ``options.force`` (:func:`forceable`).
    ``dry_run``: nothing will be submitted, so the backend is not asked.
    """
    backend = backends.get(p.spec.executor)
    if refuse and not dry_run:
        backend.preflight(p)  # what it would refuse, before any folder or job exists
    forecasts, capacity = forecast.for_plan(p, sysmetrics.gpu_memory_total(), history=options.history)
    _mark("forecast_done")
    skip = options.skip_predicted_oom or p.spec.skip_predicted_oom
    machine = backend.capacity()  # None: a scheduler places the runs and judges them
    found = feasibility.problems(p.runs, machine, forecasts=forecasts, capacity=capacity)
    forced: list[Any] = []
    if refuse and machine is not None:
        forced = feasibility.refuse_infeasible(p, force=options.force, machine=machine, forecasts=forecasts,
                                               capacity=capacity, skip_predicted_oom=skip)  # fmt: skip
    _mark("feasibility_done")
    return Prepared(p, forecasts, capacity, skip, found, forced, machine.describe() if machine is not None else None)


def prepare(
    spec: str | Path,
    options: LaunchOptions,
    *,
    refuse: bool = True,
    resolve_revisions: bool = True,
    progress: Callable[[str], None] = print,
    data: dict[str, Any] | None = None,
) -> Prepared:
    """:func:`make_plan` then :func:`check`: what the TUI's launch, `dstui list` and the demo call."""
    p = make_plan(spec, options, resolve_revisions=resolve_revisions, progress=progress, data=data)
    _mark("plan_done")
    return check(p, options, refuse=refuse)


def forceable(e: BaseException) -> bool:
    """A refusal that ``force`` overrides (runs this machine cannot do), not a fault of the spec."""
    return isinstance(e, feasibility.InfeasibleRuns)


def plan_of(spec_path: Path, spec: ExperimentSpec, runs: list[RunSpec], revisions: dict[str, dict]) -> Prepared:
    """Runs made by the caller (bisect: one commit's repeats), their configs built; no further checks."""
    configs = {r.name: dsconfig.build(r, spec_dir=spec_path.parent, file=str(spec_path)) for r in runs}
    return Prepared(batch.Plan(spec_path, spec, runs, configs, revisions))


# -- what --dry-run and `dstui list` show ------------------------------------------------


def placeholder_root() -> Path:
    """Where the runs of a batch not yet made are shown to live."""
    return paths.runs_dir() / "<batch>"


def commands(p: batch.Plan, *, root: Path, with_python: bool = True, shown: bool = True) -> list[tuple[RunSpec, list[str]]]:
    """Each run's exact argv (``shown``: as cmd.txt shows it, secrets masked) under ``root``."""
    out = []
    for r in p.runs:
        python = (p.revisions.get(r.revision) or {}).get("python") if with_python else None
        argv = launch.build_argv(r, RunDir(root / r.name), python=python)
        out.append((r, launch.shown_command(r, argv) if shown else argv))
    return out


def previews(prepared: Prepared) -> list[tuple[RunSpec, Any]]:
    """--dry-run: what would start for each run, as its backend shows it (a command; Slurm: the job script)."""
    backend = backends.get(prepared.spec.executor)
    root = placeholder_root()
    return [(r, backend.preview(prepared.plan, r, RunDir(root / r.name))) for r in prepared.runs]


# -- starting ----------------------------------------------------------------------------


def start(
    prepared: Prepared,
    options: LaunchOptions,
    *,
    draft: SpecDraft | None = None,
    runs_root: Path | None = None,
    on_created: Callable[[BatchDir], None] | None = None,
    say: Say | None = None,
) -> Started:
    """Lay out the batch (or resume one), mark predicted-OOM runs skipped, spawn its supervisor.

    ``on_created`` runs once the batch exists and before its supervisor starts
    (bisect records the batch id there: a restart must find it). ``say`` hears
    each step as it happens, in the order `dstui run` prints them.
    """
    say = say or (lambda kind, text: None)
    p = prepared.plan
    resumed = None
    if options.resume:
        b, resumed = batch.resume(p, runs_root=runs_root, parallel=options.parallel, partial=bool(options.only),
                                  batch_ref=options.resume_ref)  # fmt: skip
        say("batch", f"resuming batch {b.id}: " + ", ".join(f"{v} {k}" for k, v in resumed.items()))
    else:
        b = batch.create(p, runs_root=runs_root, parallel=options.parallel)
        say("batch", f"batch {b.id}: {len(p.runs)} runs in {b.path}")
    _mark("batch_created")
    if draft is not None:
        keep_draft(b, draft)
    if on_created is not None:
        on_created(b)
    skipped = skip_predicted_oom(b, prepared) if prepared.skip_oom else {}
    for name, reason in skipped.items():
        say("skipped", f"{name}: {reason}")
    if options.overlap:
        core_share.allow_overlap(b)
    notes = gpu_notes(b)
    for note in notes:
        say("note", note)
    _mark("gpu_notes_done")
    control.spawn(b)
    _mark("supervisor_up")
    return Started(b, len(p.runs), resumed, skipped, notes)


def keep_draft(b: BatchDir, draft: SpecDraft) -> None:
    """An edited spec's text beside its batch (batch.json names it); the user's file is never written."""
    from dstui.spec.loading import save_spec_text

    copy = b.path / DRAFT_FILE
    save_spec_text(copy, draft.text)
    b.update_info(spec_path=str(copy), edited_from=str(draft.origin) if draft.origin else None)


def skip_predicted_oom(b: BatchDir, prepared: Prepared) -> dict[str, str]:
    """Mark queued runs whose forecast exceeds the GPU as skipped, before the supervisor sees them."""
    skipped = {}
    for name, fc in prepared.forecasts.items():
        rd = RunDir(b.path / name)
        reason = forecast.oom_reason(fc, prepared.capacity)
        if reason and rd.state == "queued":
            run_status.skipped(rd, reason)
            skipped[name] = reason
    return skipped


def gpu_notes(b: BatchDir) -> list[str]:
    """What the batch's backend says before its runs start (other batches hold this machine's GPUs, ...)."""
    return backends.get(b.info().get("executor")).launch_notes(b)


def demo_spec() -> Path:
    """`dstui demo`'s spec: smoke.yaml on CPU; on GPUs smoke_gpu.yaml, or smoke.yaml sized to the GPUs there are."""
    smoke = paths.CONFIGS_DIR / "experiments" / "smoke.yaml"
    smoke_gpu = paths.CONFIGS_DIR / "experiments" / "smoke_gpu.yaml"
    n = sysmetrics.gpu_count()
    if n == 0:
        return smoke
    from dstui.spec.loading import load_spec, save_spec

    spec = load_spec(smoke_gpu if smoke_gpu.is_file() else smoke)
    spec.settings["gpus"] = min(int(spec.settings.get("gpus", 2)), n)  # a 1-GPU box runs 1 rank
    spec.settings["dtype"] = "bf16"
    spec.name = "smoke-gpu"
    out = paths.runs_dir() / "_specs" / "smoke-gpu.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    save_spec(spec, out)
    return out


def refusal_text(e: DstuiError, spec: Path | None = None) -> str:
    """The one line a face shows for a refused launch: the CLI's text, without the spec's own path
    where the face already names the spec (``spec``)."""
    text = str(e)
    if spec is not None and getattr(e, "file", None) and Path(str(e.file)).resolve() == Path(spec).resolve():
        text = text.removeprefix(f"{e.file}: ")  # type: ignore[attr-defined]
    return text
