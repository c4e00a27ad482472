"""Which metric names a run may write: not dstui's own, and not without end.

A run's records become MLflow metrics under the names the run chose. Two kinds of
name are refused, each a counted bad line:

- a name under a prefix dstui writes itself (:data:`RESERVED_PREFIXES`): ``system/``
  (MLflow's system metrics: the supervisor's host and GPU readings), ``summary.``
  (the summary record's values) and ``time/`` (the run's time breakdown). A run
  writing ``system/gpu_0_memory_usage_megabytes`` would mix its numbers into the
  readings every report and chart trusts;
- a name beyond the first :data:`MAX_METRIC_NAMES` distinct ones of the run: a job
  that wrote 10,000 names made every MLflow page of it and every report load slowly.
  The bundled runners write about 40.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RESERVED_PREFIXES = ("system/", "summary.", "time/")
MAX_METRIC_NAMES = 256


@dataclass
class MetricNames:
    """The distinct metric names a run has written so far (kept in ingest.json with the offsets)."""

    names: set[str] = field(default_factory=set)

    def admit(self, values: dict[str, float], prefix: str = "") -> tuple[dict[str, float], list[str]]:
        """(the values whose names may be stored, the refused names each with why). ``prefix``: what
        dstui puts before the names (``summary.``); the run's own name is what must not be reserved."""
        kept: dict[str, float] = {}
        refused: list[str] = []
        for name, value in values.items():
            if name.startswith(RESERVED_PREFIXES):
                refused.append(f"{name[:40]} (a name dstui reserves)")
                continue
            full = prefix + name
            if full not in self.names:
                if len(self.names) >= MAX_METRIC_NAMES:
                    refused.append(f"{name[:40]} (over {MAX_METRIC_NAMES} metric names)")
                    continue
                self.names.add(full)
            kept[name] = value
        return kept, refused

    def to_json(self) -> list[str]:
        return sorted(self.names)

    @classmethod
    def from_json(cls, data: object) -> MetricNames:
        if not isinstance(data, list):
            return cls()
        return cls({n for n in data[:MAX_METRIC_NAMES] if isinstance(n, str)})
