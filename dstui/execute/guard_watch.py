"""The supervisor's side of the divergence guard: one guard per run, the baseline's losses from disk.

The guard logic itself is pure (:mod:`dstui.execute.guard`); this module
knows the batch: which run is the baseline for which, where its
``metrics.jsonl`` is, whether it has ended. The baseline for a run is the
spec's baseline condition (``guard.baseline``, else the spec's ``baseline``)
under the same revision and repeat, falling back to repeat 0; runs of
another kind than the baseline's (a ``verify`` run beside ``train`` runs)
get only the NaN check.

A flag is kept in the run's ``status.json`` (``diverged``), so a supervisor
that takes over does not flag a run twice; steps ingested before a takeover
are not re-checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dstui.core.errors import SpecError
from dstui.core.records import STEP, Follower, parse_json_line
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute.guard import DivergenceGuard, Flag, GuardConfig
from dstui.spec.models import ExperimentSpec, RunSpec


def check_spec(spec: ExperimentSpec, runs: list[RunSpec], *, file: str | None = None) -> None:
    """A guard with a tolerance needs a baseline that is one of the spec's conditions."""
    cfg = config_of(spec.model_dump(mode="json"))
    names = sorted({r.condition for r in runs})
    if spec.guard.baseline and spec.guard.baseline not in names:
        raise SpecError(f"no condition '{spec.guard.baseline}'; conditions: {', '.join(names)}",
                        file=file, field="guard.baseline")  # fmt: skip
    if (cfg.rtol is not None or cfg.atol is not None) and not cfg.baseline:
        raise SpecError("a loss tolerance needs a baseline condition (guard.baseline or baseline)",
                        file=file, field="guard")  # fmt: skip


def config_of(spec: dict[str, Any]) -> GuardConfig:
    """The guard settings of a spec as batch.json keeps it."""
    g = spec.get("guard") or {}
    return GuardConfig(
        baseline=g.get("baseline") or spec.get("baseline"),
        rtol=g.get("rtol"),
        atol=g.get("atol"),
        stop_on=tuple(g.get("stop_on") or ()),
    )


@dataclass
class _BaselineCurve:
    follower: Follower
    losses: dict[int, float] = field(default_factory=dict)

    def read(self) -> dict[int, float]:
        while lines := self.follower.read_lines():
            for line, _ in lines:
                rec = parse_json_line(line)
                if rec and rec["type"] == STEP and rec.get("loss") is not None:
                    self.losses[int(rec["step"])] = float(rec["loss"])
        return self.losses


def _kind(rd: RunDir) -> str:
    return str((rd.spec().get("settings") or {}).get("kind", "train"))


class BatchGuard:
    """Guards of a batch's runs, fed by the supervisor as it ingests step records."""

    def __init__(self, batch: BatchDir) -> None:
        self.batch = batch
        self.config = config_of(batch.info().get("spec") or {})
        self.guards: dict[str, DivergenceGuard] = {}
        self.curves: dict[str, _BaselineCurve] = {}
        self._baselines: dict[str, RunDir | None] = {}  # run name -> its baseline run (specs never change)

    def _baseline_of(self, rd: RunDir) -> RunDir | None:
        name = self.config.baseline
        if not name:
            return None
        spec = rd.spec()
        candidates = [r for r in self.batch.runs() if r.spec().get("condition") == name]
        for want in (spec.get("repeat"), 0):
            for r in candidates:
                if r.spec().get("revision") == spec.get("revision") and r.spec().get("repeat") == want:
                    return r
        return None

    def guard(self, rd: RunDir) -> DivergenceGuard:
        g = self.guards.get(rd.name)
        if g is None:
            is_base = rd.spec().get("condition") == self.config.baseline
            g = DivergenceGuard(self.config, is_baseline=is_base)
            known = rd.status().get("diverged")
            if known:  # flagged by an earlier supervisor: stay flagged, never flag twice
                g.flag = Flag(int(known["step"]), str(known["kind"]), float(known["loss"]), known.get("baseline"))
            self.guards[rd.name] = g
        return g

    def observe(self, rd: RunDir, rec: dict[str, Any]) -> None:
        """One step record of ``rd``, as ingested."""
        self.guard(rd).observe(rec["step"], rec.get("loss"))

    def check(self, rd: RunDir) -> Flag | None:
        """The run's new flag, if this call raised one."""
        g = self.guard(rd)
        if g.flag is not None or not g.pending:
            return None
        if rd.name not in self._baselines:
            base = None if g.is_baseline else self._baseline_of(rd)
            if base is not None and _kind(base) != _kind(rd):
                base = None  # a verify run's loss is another runner's curve: only its NaN check applies
            self._baselines[rd.name] = base
        base_rd = self._baselines[rd.name]
        if base_rd is None:
            return g.check(None, baseline_ended=True)
        curve = self.curves.get(base_rd.name)
        if curve is None:
            curve = self.curves[base_rd.name] = _BaselineCurve(Follower(base_rd.metrics_file))
        ended = base_rd.state in FINAL_STATES  # read after the state: a final state means a complete file
        return g.check(curve.read(), baseline_ended=ended)
