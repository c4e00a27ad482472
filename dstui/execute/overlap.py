"""What ran beside a run: other runs on this machine while it lived, and the host's load.

Timings taken while another run computes on the same cores are not the run's
own (issue 38.2: 221 ± 188 ms/step against 26 for the same work). So every
local run records, while it lives, which other runs of any batch the machine's
ledger (:mod:`~dstui.execute.gpu_ledger`) shows live beside it or ended since it
started, when, and at which of its own steps; and the host's 1-minute load
average while it trained (another user's processes show there, not in the
ledger). The record is in status.json (``beside``, ``timeline``, ``host_load``,
``overlap``) and, as the run ends, in MLflow's tags ``dstui.overlapped``
(``true``: another run shared the machine during its timed steps) and
``dstui.overlap`` (which runs, at which steps, the load). Reports leave timings
taken under overlap out of speed comparisons unless asked
(:mod:`dstui.analysis.stats`, ``dstui report --include-overlapped``).

Which steps another run overlapped comes from the times: the other's life (from
the ledger: its launch, its end) against this run's ``timeline`` (its
``steps_done`` at each look, once a second). Both ends are taken wide: the step
running at the look before the other started, to the step running at the first
look after it ended. A run too short to be seen by one look is still found: an
ended run stays in the ledger's ``recent.json``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dstui.core.metric_catalogue import first_counted_step, warmup_count
from dstui.core.rundir import FINAL_STATES, RunDir
from dstui.execute.gpu_ledger import Ended, Holder
from dstui.tracking import tags as tag_keys

BESIDE = "beside"  # other run's folder -> {batch, run, from, to, open}: its time beside this run
TIMELINE = "timeline"  # [[time, steps_done], ...]: where this run was at each look that saw it move
HOST_LOAD = "host_load"  # {mean, max, samples, cores}: os.getloadavg()[0] while the run trained
OVERLAP = "overlap"  # {timed, steps, text, warmup, final}: the summary that the MLflow tags carry
MAX_BESIDE = 64  # a run beside hundreds of others is named by its first 64
MAX_TIMELINE = 256  # points kept; beyond, every other one is dropped (the ends stay)
LOOK_EVERY_S = 1.0


def host_load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def record(
    rd: RunDir, st: dict[str, Any], live: Sequence[Holder], ended: Sequence[Ended], now: float, load: float | None, cores: int,
) -> dict[str, Any]:  # fmt: skip
    """One look at the machine for a run: the other runs live now or ended since it started; its step now."""
    me, start = str(rd.path), _num(st.get("started")) or _num(st.get("starting")) or now
    steps = _int(st.get("steps_done"))
    beside: dict[str, Any] = {p: e for p, e in (st.get(BESIDE) or {}).items() if isinstance(e, dict)}
    for e in ended:
        if e.run_path != me and e.end >= start and e.start <= now:
            _put(beside, e.run_path, e.batch, e.run, max(e.start, start), min(e.end, now), still=False)
    for h in live:
        if h.run_path != me:
            _put(beside, h.run_path, h.batch, h.run, max(h.since or start, start), now, still=True)
    timeline = [p for p in (st.get(TIMELINE) or []) if isinstance(p, list) and len(p) == 2]
    if not timeline or timeline[-1][1] != steps:
        timeline = _thin([*timeline, [now, steps]])
    host = dict(st.get(HOST_LOAD) or {})
    if load is not None and st.get("state") == "running":
        n = _int(host.get("samples"))
        host = {"mean": (float(host.get("mean") or 0.0) * n + load) / (n + 1), "max": max(float(host.get("max") or 0.0), load),
                "samples": n + 1, "cores": cores}  # fmt: skip
    warmup = warmup_count(rd.settings().get("warmup_steps")) or 0
    summary = summarize(beside, timeline, host, warmup=warmup, total=_int(st.get("steps_total")), steps_now=steps)
    return {BESIDE: beside, TIMELINE: timeline, HOST_LOAD: host, OVERLAP: {**summary.as_status(), "warmup": warmup}}


def _put(beside: dict[str, Any], path: str, batch: str, run: str, start: float, end: float, *, still: bool) -> None:
    e = beside.get(path)
    if e is None:
        if len(beside) >= MAX_BESIDE:
            return
        beside[path] = {"batch": batch, "run": run, "from": start, "to": end, "open": still}
    else:
        beside[path] = {**e, "from": min(_num(e.get("from")) or start, start), "to": max(_num(e.get("to")) or end, end), "open": still}


def _thin(points: list[list[Any]]) -> list[list[Any]]:
    if len(points) <= MAX_TIMELINE:
        return points
    return [*points[:-1:2], points[-1]]


@dataclass(frozen=True)
class Summary:
    """Whether other runs overlapped this run's timed steps, which steps, and in words."""

    timed: bool  # another run lived beside it during a step after warm-up: its step times are not its own
    steps: tuple[int, int] | None  # the first and last of its steps that another run overlapped
    text: str

    def as_status(self) -> dict[str, Any]:
        return {"timed": self.timed, "steps": list(self.steps) if self.steps else None, "text": self.text}


def _step_range(e: dict[str, Any], timeline: list[list[Any]], steps_now: int, total: int, ended: bool) -> tuple[int, int]:
    """This run's steps during another run's [from, to]: the step running at the last look before ``from``
    to the step running at the first look after ``to`` (or to its last step, when it was still beside at the end)."""
    t0, t1 = _num(e.get("from")) or 0.0, _num(e.get("to")) or 0.0
    before = [s for t, s in timeline if t <= t0]
    after = [s for t, s in timeline if t >= t1]
    first = (before[-1] if before else 0) + 1
    last = (after[0] if after else steps_now) + 1
    if ended and e.get("open"):
        last = total or last
    return first, min(last, total) if total else last


def summarize(
    beside: dict[str, Any], timeline: list[list[Any]], host: dict[str, Any], *, warmup: int, total: int, steps_now: int,
    ended: bool = False,
) -> Summary:  # fmt: skip
    """The overlap in one line: 'steps 3-8 beside batch X (runs a, b); host load 3.4 mean, 5.1 max on 2 cores'."""
    ranges = [r for e in beside.values() if (r := _step_range(e, timeline, steps_now, total, ended))[0] <= r[1]]
    names: dict[str, list[str]] = {}
    for e in beside.values():
        names.setdefault(str(e.get("batch", "?")), []).append(str(e.get("run", "?")))
    steps = (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None
    timed = any(last >= first_counted_step(1, warmup) for _, last in ranges)  # the runners count steps from 1
    load = _load_text(host)
    if not beside:
        return Summary(False, None, "no other run beside it" + (f"; {load}" if load else ""))
    who = ", ".join(f"batch {b} (run{'s' if len(r) > 1 else ''} {', '.join(r[:3])}{f', +{len(r) - 3}' if len(r) > 3 else ''})"
                    for b, r in names.items())  # fmt: skip
    where = f"steps {steps[0]}-{steps[1]}" if steps else "before its first step"
    return Summary(timed, steps, f"{where} beside {who}" + (f"; {load}" if load else ""))


def _load_text(host: dict[str, Any]) -> str:
    if not host.get("samples"):
        return ""
    return f"host load {float(host['mean']):.1f} mean, {float(host['max']):.1f} max on {host.get('cores', '?')} cores"


def at_last_step(st: dict[str, Any]) -> bool:
    """The timeline's last point is at the steps status.json counts (an end seen before the last lines were read is not)."""
    timeline = [p for p in (st.get(TIMELINE) or []) if isinstance(p, list) and len(p) == 2]
    return bool(timeline) and timeline[-1][1] == _int(st.get("steps_done"))


def settled(st: dict[str, Any]) -> dict[str, Any] | None:
    """An ended run's final summary (what was still beside it at its last look stayed to its end); None: nothing to settle."""
    summary = st.get(OVERLAP)
    if st.get("state") not in FINAL_STATES or not isinstance(summary, dict) or summary.get("final"):
        return None
    timeline = [p for p in (st.get(TIMELINE) or []) if isinstance(p, list) and len(p) == 2]
    final = summarize(st.get(BESIDE) or {}, timeline, st.get(HOST_LOAD) or {}, warmup=_int(summary.get("warmup")),
                      total=_int(st.get("steps_total")), steps_now=_int(st.get("steps_done")), ended=True)  # fmt: skip
    return {**final.as_status(), "warmup": summary.get("warmup"), "final": True}


def tags(st: dict[str, Any]) -> dict[str, str]:
    """The MLflow tags of a run's overlap record (none before the run was ever looked at)."""
    summary = settled(st) or st.get(OVERLAP)
    if not isinstance(summary, dict):
        return {}
    return {tag_keys.OVERLAPPED: "true" if summary.get("timed") else "false", tag_keys.OVERLAP: str(summary.get("text", ""))[:500]}
