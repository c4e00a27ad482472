"""Each step once across the attempts of a run that Slurm requeued: the rule, in one place.

A Slurm job that goes back to the queue (``scontrol requeue``, a node failure or a
preemption with requeue, or dstui submitting it again) starts again in the same run
folder, appends to the same metrics file and keeps its MLflow run. Its script writes
an ``attempt`` record before the ranks start, so the file keeps every attempt's
records in order, each attempt opened by one.

A new attempt trains from step 1 again (or from a checkpoint), so it logs steps an
earlier attempt already logged. MLflow keeps every value it is sent and cannot replace
one, so the rule is **the first attempt to log a step wins**: a step record of a later
attempt is kept only beyond the highest step of all earlier attempts (a run resumed
from a checkpoint loses nothing; one that restarts from step 1 sends its steps from
there on). The repeats stay in the file, are counted (``repeated``), and are never
sent. Within an attempt nothing is left out (several records of one step all count),
except seed lines: a program whose ranks all print the seed's line (two ranks, one
stream) logs each step once per rank, so a seed line whose (epoch, step) is not past
the highest one of its attempt so far is a repeat too, counted and never sent (it
stored 30 steps twice).

The supervisor (:mod:`dstui.execute.ingest`, state saved in ``ingest.json``) and every
reader of a finished file (:func:`dstui.core.record_file.read_records`) and the TUI's live
series apply the same rule, so they read what MLflow holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dstui.core.records import ATTEMPT, SEED_SOURCE, STEP


@dataclass
class AttemptSteps:
    """Where a run's attempts stand while its records are read in order."""

    starts: int = 0  # attempt records seen: job starts (a local run writes none)
    floor: int | None = None  # the highest step of the earlier attempts: steps up to it were logged
    top: int | None = None  # the highest step kept so far
    repeated: int = 0  # step records left out: a later attempt's, or seed lines repeating a step of their attempt
    seed_top: tuple[int, int] | None = None  # the highest (epoch, step) of a seed line in this attempt

    def keep(self, rec: dict[str, Any]) -> bool:
        """Whether a record counts: False for an ``attempt`` record (it opens an attempt) and a repeat."""
        kind = rec.get("type")
        if kind == ATTEMPT:
            self.starts += 1
            if self.top is not None:
                self.floor = self.top
            self.seed_top = None
            return False
        if kind == STEP:
            step = rec.get("step")
            if not isinstance(step, int):
                return True
            if self.floor is not None and step <= self.floor:
                self.repeated += 1
                return False
            if rec.get(SEED_SOURCE) and isinstance(rec.get("epoch"), int):
                at = (rec["epoch"], step)
                if self.seed_top is not None and at <= self.seed_top:
                    self.repeated += 1
                    return False
                self.seed_top = at
            self.top = step if self.top is None else max(self.top, step)
        return True

    @property
    def requeues(self) -> int:
        """How often the run's job started again after its first start."""
        return max(self.starts - 1, 0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> AttemptSteps:
        """From ``ingest.json``; anything odd there starts afresh rather than raising."""
        if not isinstance(data, dict):
            return cls()
        ints = {k: data.get(k) for k in ("starts", "floor", "top", "repeated")}
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in ints.values()):
            return cls()
        seed = data.get("seed_top")
        seed_top = (seed[0], seed[1]) if isinstance(seed, list) and len(seed) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in seed) else None  # fmt: skip
        return cls(starts=ints["starts"] or 0, floor=ints["floor"], top=ints["top"], repeated=ints["repeated"] or 0,
                   seed_top=seed_top)  # fmt: skip
