"""How a batch is launched: the options both faces pass, with one set of defaults.

Light on purpose (no spec models, no execute modules): the TUI's app reads the
default ``parallel`` at start-up, before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dstui.execute.gpu_share import AUTO

# `dstui run --resume` without a batch: the newest batch of the spec
NEWEST = "newest"


@dataclass
class LaunchOptions:
    """What `dstui run`'s flags say; the TUI passes the same object (its own defaults are these)."""

    # runs at a time (0 = auto: as many as fit on disjoint GPUs; one at a time without GPUs)
    parallel: int = AUTO
    force: bool = False  # launch runs that cannot work on this machine
    skip_predicted_oom: bool = False  # or the spec's skip_predicted_oom
    validate: bool = True  # DeepSpeed's config validation and the model check
    history: bool = True  # the memory forecast reads earlier GPU runs from MLflow
    only: list[str] | None = None  # run or condition patterns
    executor: str | None = None  # overrides the spec's
    slurm: dict[str, Any] = field(default_factory=dict)  # partition, account, time_limit, max_jobs (set ones win)
    resume: str | None = None  # None: a new batch; NEWEST or a batch id/folder: continue that batch
    overlap: bool = False  # start runs while other batches use this machine's cores (recorded, kept out of speed ratios)

    @property
    def resume_ref(self) -> str | None:
        """The batch ``resume`` names; None for the spec's newest (or no resume)."""
        return None if self.resume in (None, NEWEST) else self.resume


DEFAULT_PARALLEL = LaunchOptions().parallel
