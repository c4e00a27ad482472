"""The supervisor's side of the divergence guard: one guard per run, the baseline's losses from disk.

The guard logic itself is pure (:mod:`dstui.execute.guard`); this module
knows the batch: which run is the baseline for which, where its
``metrics.jsonl`` is, whether it has ended. The baseline for a run is the
spec's baseline condition (``guard.baseline``, else the spec's ``baseline``)
under the same revision and repeat, falling back to repeat 0; runs of
another kind than the baseline's (a ``verify`` run beside ``train`` runs)
get only the NaN check.

The guard reads each run's losses from its own metrics file (NaN included,
which ingestion drops), so the supervisor's whole hook is :meth:`BatchGuard.after_ingest`
after each pass over a run, :func:`stopped_outcome` where a run is settled and
:func:`tags_of` with its final MLflow tags. A flag is kept in the run's
``status.json`` (``diverged``), so a supervisor that takes over re-reads the
curves but never flags a run twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dstui.core.errors import SpecError
from dstui.core.records import STEP, Follower, parse_json_line, parse_seed_line
from dstui.core.rundir import ACTIVE_STATES, FINAL_STATES, BatchDir, RunDir
from dstui.execute.guard import DivergenceGuard, Flag, GuardConfig
from dstui.spec.experiment import ExperimentSpec, RunSpec
from dstui.tracking import tags as tag_keys


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
class _Curve:
    """A run's losses by step, read incrementally from its metrics (jsonl, or the seed's log lines)."""

    follower: Follower
    seed_format: bool = False
    losses: dict[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, rd: RunDir) -> _Curve:
        seed = rd.settings().get("metrics_format") == "seed"
        return cls(Follower(rd.log_file if seed else rd.metrics_file), seed)

    def read_new(self) -> dict[int, float]:
        """The steps read by this call (NaN and inf included: ingestion drops them, the guard needs them)."""
        new: dict[int, float] = {}
        while lines := self.follower.read_lines():
            for line, _ in lines:
                rec = parse_seed_line(line) if self.seed_format else parse_json_line(line)
                if rec and rec["type"] == STEP and rec.get("loss") is not None:
                    new[int(rec["step"])] = float(rec["loss"])
        self.losses.update(new)
        return new


def tags_of(st: dict[str, Any]) -> dict[str, str]:
    """The MLflow tag of a flagged run, from its status: ``dstui.diverged = "step N (Δ=…)"``."""
    flag = st.get("diverged")
    return {tag_keys.DIVERGED: flag["message"].removeprefix("diverged at ")} if flag else {}


def stopped_outcome(st: dict[str, Any]) -> dict[str, Any] | None:
    """How a run the guard ended settles: killed, reason ``diverged at step N (…)``; else None."""
    if st.get("guard_stop") and st.get("diverged"):
        return {"state": "killed", "reason": st["diverged"]["message"]}
    return None


def _kind(rd: RunDir) -> str:
    return str(rd.settings().get("kind", "train"))


class BatchGuard:
    """Guards of a batch's runs, fed by the supervisor as it ingests step records."""

    def __init__(self, batch: BatchDir) -> None:
        self.batch = batch
        self.config = config_of(batch.info().get("spec") or {})
        self.guards: dict[str, DivergenceGuard] = {}
        self.curves: dict[str, _Curve] = {}  # every run's own losses and its baseline's, by run name
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

    def _curve(self, rd: RunDir) -> _Curve:
        if rd.name not in self.curves:
            self.curves[rd.name] = _Curve.of(rd)
        return self.curves[rd.name]

    def check(self, rd: RunDir) -> Flag | None:
        """Read the run's new steps and decide them; the run's new flag, if this call raised one.

        The guard reads the run's metrics itself (not the ingested points: those
        leave NaN out), so it needs nothing from ingestion but this call.
        """
        g = self.guard(rd)
        if g.flag is not None:
            return None
        for step, loss in self._curve(rd).read_new().items():
            g.observe(step, loss)
        if not g.pending:
            return None
        if rd.name not in self._baselines:
            base = None if g.is_baseline else self._baseline_of(rd)
            if base is not None and _kind(base) != _kind(rd):
                base = None  # a verify run's loss is another runner's curve: only its NaN check applies
            self._baselines[rd.name] = base
        base_rd = self._baselines[rd.name]
        if base_rd is None:
            return g.check(None, baseline_ended=True)
        ended = base_rd.state in FINAL_STATES  # read after the state: a final state means a complete file
        curve = self._curve(base_rd)
        curve.read_new()
        return g.check(curve.losses, baseline_ended=ended)

    def after_ingest(
        self, rd: RunDir, *, kill: Callable[[dict[str, Any]], None], tag: Callable[[dict[str, str]], None]
    ) -> Flag | None:
        """The supervisor's one call after ingesting a run's new records.

        A new flag goes to status.json (``diverged``) and MLflow (``tag``); with
        ``stop_on`` the run is marked ``guard_stop`` and ``kill`` ends its job, so
        that it settles as :func:`stopped_outcome` says.
        """
        flag = self.check(rd)
        if flag is None:
            return None
        st = rd.update_status(diverged=flag.as_dict())
        if self.guard(rd).should_stop and st.get("state") in ACTIVE_STATES:
            st = rd.update_status(guard_stop=True)
            kill(st)
        tag(tags_of(st))
        return flag
