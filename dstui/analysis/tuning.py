"""A tuning search's outcome as the report reads it: typed rows out of its ``tune.json``.

The document comes from a file or an MLflow artifact, so it is read as
untrusted input: only known fields, numbers that are finite numbers, strings
cut to a bounded length, at most :data:`MAX_ROWS` rows per table. Anything
else is dropped and counted (``dropped``), never a traceback.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

MAX_ROWS = 500
MAX_TEXT = 300


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _text(v: Any) -> str:
    return "" if v is None else str(v)[:MAX_TEXT]


@dataclass(frozen=True)
class Ranked:
    """One probe: prediction, measurement, how it ended."""

    candidate: str
    predicted_s: float | None
    predicted_log_sd: float | None
    measured_s: float | None
    measured_half_s: float | None
    timed_steps: int
    tokens_per_s: float | None
    mem_peak: float | None
    forecast_mem: float | None
    error_pct: float | None
    outcome: str
    wall_s: float | None
    winner: bool
    within_noise: bool


@dataclass(frozen=True)
class LeftOut:
    candidate: str
    reason: str
    predicted_s: float | None = None  # for the unprobed: the prediction, and its optimistic end
    optimistic_s: float | None = None


@dataclass
class TuneSummary:
    experiment: str = ""
    machine: str = ""
    winner: str | None = None
    stop_reason: str = ""
    candidates: int = 0
    ranking: list[Ranked] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    not_probed: list[LeftOut] = field(default_factory=list)
    cost: dict[str, float] = field(default_factory=dict)
    model_source: str = ""
    model_sd: float | None = None
    winner_spec: str = ""
    dropped: int = 0

    @property
    def errors(self) -> list[float]:
        return [abs(r.error_pct) for r in self.ranking if r.error_pct is not None]

    def error_summary(self) -> tuple[float, float] | None:
        """(median, worst) absolute prediction error of the probes, in %."""
        e = self.errors
        return (statistics.median(e), max(e)) if e else None


def _ranked(r: dict[str, Any]) -> Ranked:
    steps = r.get("timed_steps")
    return Ranked(
        candidate=_text(r.get("candidate")), predicted_s=_num(r.get("predicted_s")),
        predicted_log_sd=_num(r.get("predicted_log_sd")), measured_s=_num(r.get("measured_s")),
        measured_half_s=_num(r.get("measured_half_s")), timed_steps=steps if isinstance(steps, int) else 0,
        tokens_per_s=_num(r.get("tokens_per_s")), mem_peak=_num(r.get("mem_peak")),
        forecast_mem=_num(r.get("forecast_mem")), error_pct=_num(r.get("error_pct")), outcome=_text(r.get("outcome")),
        wall_s=_num(r.get("wall_s")), winner=r.get("winner") is True, within_noise=r.get("within_noise_of_winner") is True,
    )  # fmt: skip


def _rows(value: Any, make: Any, summary: TuneSummary) -> list[Any]:
    if not isinstance(value, list):
        summary.dropped += value is not None
        return []
    out = []
    for item in value[:MAX_ROWS]:
        if isinstance(item, dict) and item.get("candidate"):
            out.append(make(item))
        else:
            summary.dropped += 1
    summary.dropped += max(0, len(value) - MAX_ROWS)
    return out


def summary_of(doc: Any) -> TuneSummary:
    """The typed summary of a :func:`dstui.tune.result.document` (or whatever a file claims is one)."""
    s = TuneSummary()
    if not isinstance(doc, dict):
        s.dropped = 1
        return s
    s.experiment, s.machine = _text(doc.get("experiment")), _text(doc.get("machine"))
    s.winner = _text(doc.get("winner")) or None
    s.stop_reason, s.winner_spec = _text(doc.get("stop_reason")), _text(doc.get("winner_spec"))
    s.candidates = doc.get("candidates") if isinstance(doc.get("candidates"), int) else 0
    s.ranking = _rows(doc.get("ranking"), _ranked, s)
    s.left_out = _rows(doc.get("left_out"), lambda r: LeftOut(_text(r.get("candidate")), _text(r.get("reason"))), s)
    s.not_probed = _rows(doc.get("not_probed"), lambda r: LeftOut(
        _text(r.get("candidate")), "", _num(r.get("predicted_s")), _num(r.get("optimistic_s"))), s)  # fmt: skip
    cost = doc.get("cost") if isinstance(doc.get("cost"), dict) else {}
    s.cost = {k: v for k, v in ((k, _num(v)) for k, v in cost.items() if isinstance(k, str)) if v is not None}
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    s.model_source, s.model_sd = _text(model.get("source")), _num(model.get("model_sd"))
    return s


MAX_DOC_BYTES = 5_000_000


def from_parents(parents: dict[str, Any]) -> TuneSummary | None:
    """The search of a report's batches: the ``tune/tune.json`` artifact of a parent tagged ``dstui.tune``."""
    from types import SimpleNamespace

    from dstui.analysis.fetch import read_artifact
    from dstui.tracking import tags as tag_keys

    for parent in parents.values():
        tags = getattr(getattr(parent, "data", None), "tags", None) or {}
        if tag_keys.TUNE not in tags:
            continue
        ref = SimpleNamespace(artifact_uri=parent.info.artifact_uri, run_id=parent.info.run_id)
        text = read_artifact(ref, "tune/tune.json")  # type: ignore[arg-type] - it reads these two fields
        if not text or len(text) > MAX_DOC_BYTES:
            continue
        try:
            return summary_of(json.loads(text))
        except ValueError:
            continue
    return None
