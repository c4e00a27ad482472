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
RUN_DIR = "dstui.run_dir"  # run folder + '#attempt': finds a child created by a supervisor that died

# how it went
STATUS = "dstui.status"
REASON = "dstui.reason"
EXIT_CODE = "dstui.exit_code"
BAD_METRIC_LINES = "dstui.bad_metric_lines"
FIRST_BAD_LINE = "dstui.first_bad_line"  # "why: start of the line" of the first bad line (execute/ingest.py)
VERDICT = "dstui.verdict"
WORST = "dstui.worst"
TOLERANCE_BASIS = "dstui.tolerance_basis"
DIVERGED = "dstui.diverged"
SLURM_JOB = "dstui.slurm_job"
SLURM_STATE = "dstui.slurm_state"
NODES = "dstui.nodes"
REQUEUES = "dstui.requeues"  # how often Slurm requeued the run's job (or dstui submitted it again)
REPEATED_STEPS = "dstui.repeated_steps"  # step records of a later attempt not sent: that step was logged before

# where and with what it ran (from the runner's header record)
HOSTNAME = "dstui.hostname"
DEVICE = "dstui.device"
GPU_NAME = "dstui.gpu_name"
GPU_COUNT = "dstui.gpu_count"
TOKENS_PER_STEP = "dstui.tokens_per_step"
DEEPSPEED_GIT_SHA = "dstui.deepspeed_git_sha"

# imported seed logs
CMD = "dstui.cmd"
NOTE = "dstui.note"
WANDB_RUN = "dstui.wandb_run"
MALFORMED_LINES = "dstui.malformed_lines"
IMPORTED_STEPS = "dstui.imported_steps"

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
    """(run folder, attempt) of a :data:`RUN_DIR` value (``<folder>#<attempt>``, written by
    dstui.execute.mlflow_runs.attempt_ref); the value and None when it carries no attempt number."""
    folder, sep, attempt = value.rpartition("#")
    if sep and folder and attempt.isdigit():
        return folder, int(attempt)
    return value, None


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
