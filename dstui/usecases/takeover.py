"""Who starts a batch's supervisor, and when: one rule for every watcher.

A batch's supervisor lives in its own session and holds ``supervisor.lock``; when
it dies, the runs go on and someone must start another. That decision used to
be made in seven places with seven rules (`dstui run`'s follow loop after a
second's doubt and at most three times, `dstui status` at once, the TUI after
30 s of a batch's life, its retry after 10 s, bisect on every poll, `dstui
retry`'s kick, ...). Now every face asks :class:`Takeover`:

- a batch needs a supervisor when no live process holds its lock and it is not
  both finalized and finished (a cut-short creation is settled first, so the
  new supervisor sees every run);
- one seen without a supervisor is looked at again :data:`CONFIRM_S` later (a
  supervisor just spawned by whoever launched the batch may still be starting)
  and only then started;
- a watcher restarts a batch's supervisor at most :data:`MAX_RESTARTS` times: one that
  keeps dying is reported (its log), not restarted forever.

After runs are queued again (retry), :func:`after_requeue` waits for a supervisor
that was finishing to let go of the lock, then applies the same rule.

The stdlib-only run wrapper (dstui/execute/injob/wrap.py) also wakes a supervisor for an
orphaned batch when one of its jobs ends; it cannot import this module (it runs
inside the job) and only ever starts one where the lock is free.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dstui.core.rundir import BatchDir
from dstui.execute import control, creation
from dstui.execute.batch_lock import is_supervised

CONFIRM_S = 1.0  # a missing supervisor is looked for again this much later: it may be starting
MAX_RESTARTS = 3  # per watcher and batch: a supervisor that keeps dying is reported, not restarted forever
REQUEUE_SETTLE_S = 3.0  # after a retry: how long a finishing supervisor may hold the lock

# how a batch is looked after (what `dstui status` prints beside it)
SUPERVISED = "supervised"
FINISHED = "finished"
NOT_RUNNING = "supervisor not running"
RESTARTED = "supervisor restarted (took over)"
GAVE_UP = "supervisor keeps stopping"


def supervised(b: BatchDir) -> bool:
    """Whether a live supervisor holds the batch's lock."""
    return is_supervised(b)


def needs_supervisor(b: BatchDir, *, settle: bool = True) -> bool:
    """An unfinished batch that no live supervisor holds (``settle``: a cut-short creation is finished first)."""
    if is_supervised(b):
        return False
    if settle:
        creation.settle(b)
    return not (b.info().get("finalized") and b.is_finished())


@dataclass
class Takeover:
    """The takeover policy of one watcher (a `dstui status`, a follow loop, the TUI, a bisect)."""

    enabled: bool = True  # False: only say how batches are looked after (`dstui status --no-takeover`)
    writes: bool = True  # False: a home that cannot be written (full, read-only): nothing settled or started
    confirm_s: float = CONFIRM_S
    max_restarts: int = MAX_RESTARTS
    restarts: dict[str, int] = field(default_factory=dict)

    def look(self, batches: Iterable[BatchDir]) -> dict[str, str]:
        """How each batch is looked after, supervisors started where the rule says: batch id -> verdict."""
        batches = list(batches)
        gone = [b for b in batches if needs_supervisor(b, settle=self.writes)]
        if gone and self.enabled and self.writes and self.confirm_s > 0:
            time.sleep(self.confirm_s)
            gone = [b for b in gone if needs_supervisor(b)]
        missing = {b.id for b in gone}
        out = {b.id: SUPERVISED if b.id not in missing and supervised(b) else FINISHED for b in batches}
        for b in gone:
            out[b.id] = self._restart(b)
        return out

    def look_one(self, b: BatchDir) -> str:
        return self.look([b])[b.id]

    def _restart(self, b: BatchDir) -> str:
        if not (self.enabled and self.writes):
            return NOT_RUNNING
        n = self.restarts.get(b.id, 0)
        if n >= self.max_restarts:
            return GAVE_UP
        self.restarts[b.id] = n + 1
        control.spawn(b)
        return RESTARTED

    def gave_up_note(self, b: BatchDir) -> str:
        return f"the supervisor stopped {self.restarts.get(b.id, 0) + 1} times; see {b.log_file}"


def after_requeue(b: BatchDir, *, settle_s: float = REQUEUE_SETTLE_S) -> str:
    """Runs of ``b`` were queued again: make sure a supervisor picks them up.

    A live supervisor in its main loop sees them by itself; one that was just
    finishing may already have looked, so its lock is given ``settle_s`` to go
    free before the rule above decides (without its doubt: the lock was seen).
    """
    deadline = time.monotonic() + settle_s
    while supervised(b):
        if time.monotonic() > deadline:
            return SUPERVISED  # a supervisor in its main loop: it will see the queued runs
        time.sleep(0.1)
    return Takeover(confirm_s=0).look_one(b)


def settle_all(runs_root: Path | None = None) -> list[str]:
    """Batches a killed `dstui run` left half-made: their missing runs become failed ones, so every run is listed."""
    return creation.settle_all(runs_root)
