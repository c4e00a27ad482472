"""The MLflow tag keys of dstui's layout (docs/ARCHITECTURE.md, "MLflow layout"), spelled once.

The supervisor and the importer write them, analysis, reports and the TUI read
them and search by them: one constant per key keeps writer and readers on the
same spelling. Revision tags (``dstui.revision.*``) are written by
:meth:`dstui.revisions.resolved.ResolvedRevision.mlflow_tags`, which may not
import this stage; :data:`REVISION` is the one they share.
"""

from __future__ import annotations

PREFIX = "dstui."

# what a run is: the batch's parent run or one RunSpec's child run
ROLE = "dstui.role"
ROLE_BATCH = "batch"
ROLE_RUN = "run"

# the batch (parent run)
BATCH = "dstui.batch"
SPEC = "dstui.spec"
RUNS = "dstui.runs"
IMPORTED_FROM = "dstui.imported_from"
EXPERIMENT_DATE = "dstui.experiment_date"

# one run's identity (child run)
CONDITION = "dstui.condition"
REVISION = "dstui.revision"
REPEAT = "dstui.repeat"
ORDER = "dstui.order"
RUN_KEY = "dstui.run_key"
KIND = "dstui.kind"
RUN_DIR = "dstui.run_dir"  # the run folder: with ATTEMPT, finds a child created by a supervisor that died
ATTEMPT = "dstui.attempt"  # 1, 2, ...: a run queued again (retry, resume) gets a child per attempt
DATASET = "dstui.dataset"  # what a train run read (also logged as MLflow's dataset input)

# how it went
STATUS = "dstui.status"
REASON = "dstui.reason"
EXIT_CODE = "dstui.exit_code"
BAD_METRIC_LINES = "dstui.bad_metric_lines"
FIRST_BAD_LINE = "dstui.first_bad_line"  # "why: start of the line" of the first bad line (execute/ingest.py)
FILE_PROBLEMS = "dstui.file_problems"  # the run's files dstui refused to read: "metrics.jsonl is a FIFO: not read; ..."
VERDICT = "dstui.verdict"
EVIDENCE = "dstui.evidence"  # the verdict's numbers in one line (dstui.core.verdicts)
WORST = "dstui.worst"
TOLERANCE_BASIS = "dstui.tolerance_basis"
DIVERGED = "dstui.diverged"
SLURM_JOB = "dstui.slurm_job"
SLURM_STATE = "dstui.slurm_state"
NODES = "dstui.nodes"
REQUEUES = "dstui.requeues"  # how often Slurm requeued the run's job (or dstui submitted it again)
REPEATED_STEPS = "dstui.repeated_steps"  # step records of a later attempt not sent: that step was logged before
OVERLAPPED = "dstui.overlapped"  # "true": another run shared the machine during its timed steps (execute/overlap.py)
OVERLAP = "dstui.overlap"  # what ran beside it, at which of its steps, and the host's load, in words

# where and with what it ran (from the runner's header record)
HOSTNAME = "dstui.hostname"
DEVICE = "dstui.device"
GPU_NAME = "dstui.gpu_name"
TOKENS_PER_STEP = "dstui.tokens_per_step"
DEEPSPEED_GIT_SHA = "dstui.deepspeed_git_sha"

# imported seed logs
CMD = "dstui.cmd"
NOTE = "dstui.note"
WANDB_RUN = "dstui.wandb_run"
MALFORMED_LINES = "dstui.malformed_lines"
IMPORTED_STEPS = "dstui.imported_steps"
IMPORTED_LINES = "dstui.imported_lines"  # an import's batch run: lines read, files that could not be
UNREADABLE = "dstui.unreadable_files"

# MLflow's own tags that dstui writes or reads
PARENT = "mlflow.parentRunId"  # records made before children stopped nesting under their batch's run
DESCRIPTION = "mlflow.note.content"  # a run's or experiment's description (markdown)
RUN_COLOR = "mlflow.runColor"  # the colour MLflow's UI draws a run in (tables, charts, compare)
USER = "mlflow.user"
SOURCE_NAME = "mlflow.source.name"
SOURCE_TYPE = "mlflow.source.type"
EXPERIMENT_KIND = "mlflow.experimentKind"  # which of MLflow's layouts opens an experiment
SAVED_VIEW_PREFIX = "mlflow.sharedViewState."  # an experiment's saved views (MLflow's UI, "Views")
DATASET_CONTEXT = "mlflow.data.context"  # a dataset input's role: training, evaluation, ...

# bisect (dstui/bisect/)
BISECT = "dstui.bisect"
BISECT_COMMIT = "dstui.bisect.commit"
BISECT_VERDICT = "dstui.bisect.verdict"
BISECT_CHANGE = "dstui.bisect.change"
TUNE = "dstui.tune"  # `dstui tune`: the search's folder name, on its batch parent and every probe
TUNE_CANDIDATE = "dstui.tune.candidate"
TUNE_OUTCOME = "dstui.tune.outcome"
TUNE_WINNER = "dstui.tune.winner"
TUNE_STOP_REASON = "dstui.tune.stop_reason"


def split_run_dir(value: str) -> tuple[str, int | None]:
    """(run folder, attempt) of a :data:`RUN_DIR` value as records before :data:`ATTEMPT` wrote it
    (``<folder>#<attempt>``); the value and None when it carries no attempt number."""
    folder, sep, attempt = value.rpartition("#")
    if sep and folder and attempt.isdigit():
        return folder, int(attempt)
    return value, None


def run_attempt(tags: dict[str, str]) -> tuple[str, int | None]:
    """(run folder, attempt) of a child run's tags: :data:`RUN_DIR` and :data:`ATTEMPT`, or the older
    ``<folder>#<attempt>`` value of RUN_DIR alone; ('', None) for a run without a folder (imported)."""
    folder = tags.get(RUN_DIR, "") or ""
    attempt = str(tags.get(ATTEMPT, "") or "")
    if attempt.isdigit():
        return folder, int(attempt)
    return split_run_dir(folder)


def of(field: str) -> str:
    """The tag of a header field or setting: ``hostname`` -> ``dstui.hostname``."""
    return PREFIX + field


def version(package: str) -> str:
    """``deepspeed`` -> ``dstui.version.deepspeed`` (torch, transformers, python, dstui)."""
    return f"{PREFIX}version.{package}"


def runs_in(state: str) -> str:
    """The parent run's count of runs that ended in ``state``: ``dstui.runs_done``."""
    return f"{PREFIX}runs_{state}"


def search(key: str) -> str:
    """The key as an MLflow search filter names it: ``tags.`dstui.role```."""
    return f"tags.`{key}`"


# MLflow search filters of the two roles
RUN_FILTER = f"{search(ROLE)} = '{ROLE_RUN}'"
BATCH_FILTER = f"{search(ROLE)} = '{ROLE_BATCH}'"
