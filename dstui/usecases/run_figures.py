"""The speed figures both faces show of a run: step time and tokens/s, and the time left.

A finished run's step time and tokens/s are its means over the steps after
warm-up, as the report computes them (issue 38.3: `dstui status` showed z0's
last step, ``0.348 s, 736 tok/s`` from one outlier, against a mean of 0.105 s
and 2441 tok/s): the runner's summary where it wrote one (``iter_time_mean``,
``tokens_per_s_mean``), else the run's own step records. A live run shows its
last step's, and says so (:attr:`Speed.mean` is False).

The time left of a running run is its wall time per step after warm-up times
the steps to go (the ``timeline`` of status.json: ``[time, steps_done]`` at each
look of the supervisor that saw the run move). Start-up, the op builds and the
warm-up steps are not steps: counting them made early ETAs 50-100x too high
(``16/300 8m``, done 8 s later). Before two looks after warm-up there is no
ETA; a run whose supervisor keeps no timeline gets its last step time times
the steps to go.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dstui.core.metric_catalogue import first_counted_step, warmup_count
from dstui.core.record_file import read_records
from dstui.core.records import STEP
from dstui.core.rundir import FINAL_STATES, RunDir

MAX_RECORDS_BYTES = 256 << 20  # a finished run's step records are averaged up to this size (else: its last step)


def _num(v: Any) -> float | None:
    """A finite number of a run's own file, else None (status.json is the run's: anything may be in it)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


@dataclass(frozen=True)
class Speed:
    iter_time: float | None  # seconds per optimizer step
    tokens_per_s: float | None
    mean: bool  # True: the means after warm-up (a finished run); False: the last step (a live run)


def warmup_of(settings: Mapping[str, Any]) -> int:
    """The run's warm-up steps (its settings' ``warmup_steps``, read by the catalogue's rule; 0 when none)."""
    return warmup_count(settings.get("warmup_steps")) or 0


def last_speed(st: Mapping[str, Any]) -> Speed:
    last = st.get("last") or {}
    return Speed(_num(last.get("iter_time")), _num(last.get("tokens_per_s")), mean=False)


def summary_speed(st: Mapping[str, Any]) -> Speed | None:
    """The runner's own means after warm-up (its summary record, kept in status.json), if it wrote them."""
    summary = st.get("summary") or {}
    it = _num(summary.get("iter_time_mean"))
    if it is None:
        return None
    return Speed(it, _num(summary.get("tokens_per_s_mean")), mean=True)


def mean_of_steps(steps: Sequence[Mapping[str, Any]], warmup: int) -> Speed | None:
    """Means over the step records after warm-up (:mod:`dstui.core.metric_catalogue`'s rule: counted from
    the first step a run can log; every step when all are warm-up); tokens/s as
    total tokens / total time, as the runners and the report compute it (a mean of per-step rates
    would overstate it whenever step times vary)."""
    numbered = [(n, s) for s in steps if (n := _num(s.get("step"))) is not None]
    first = first_counted_step(min((n for n, _ in numbered), default=1), warmup)  # the catalogue's warm-up rule
    timed = [s for n, s in numbered if n >= first] or list(steps)
    times = [t for s in timed if (t := _num(s.get("iter_time"))) is not None and t > 0]
    if not times:
        return None
    tokens = [(r * t) for s in timed if (r := _num(s.get("tokens_per_s"))) is not None and (t := _num(s.get("iter_time")))]
    rate = sum(tokens) / sum(times) if len(tokens) == len(times) else None
    return Speed(sum(times) / len(times), rate, mean=True)


def records_speed(rd: RunDir, warmup: int) -> Speed | None:
    """Means after warm-up from the run's own step records (a command's run: no summary)."""
    fmt = rd.settings().get("metrics_format", "jsonl")
    source = rd.metrics_file if fmt == "jsonl" else rd.log_file
    try:
        if os.stat(source).st_size > MAX_RECORDS_BYTES:
            return None
    except OSError:
        return None
    return mean_of_steps([r for r in read_records(source, fmt) if r.get("type") == STEP], warmup)


def speed(st: Mapping[str, Any], rd: RunDir | None = None, warmup: int | None = None) -> Speed:
    """What a face shows of a run's speed: the means after warm-up once it has ended, else its last step.

    ``rd`` lets a finished run without a summary be averaged from its step records (file I/O:
    call it off a UI thread); without it, such a run shows its last step (``mean`` False).
    """
    if st.get("state") in FINAL_STATES:
        found = summary_speed(st)
        if found is None and rd is not None:
            found = records_speed(rd, warmup_of(rd.settings()) if warmup is None else warmup)
        if found is not None:
            return found
    return last_speed(st)


def eta_s(st: Mapping[str, Any], warmup: int, now: float | None = None) -> float | None:
    """Seconds left of a running run, from its pace after warm-up; None before that pace is known."""
    done, total = _num(st.get("steps_done")) or 0, _num(st.get("steps_total")) or 0
    if st.get("state") != "running" or not total or done <= warmup or done >= total:
        return None
    now = time.time() if now is None else now
    pace = _pace(st.get("timeline"), warmup)
    if pace is not None:
        per_step, t_last, s_last, gap = pace
        # the time since the last look counts for at most one look's worth of steps: a run that stalls
        # keeps its steps to go, not an ETA counting down to "0s"
        return max(0.0, per_step * (total - s_last) - min(max(0.0, now - t_last), max(per_step, gap)))
    it = _num((st.get("last") or {}).get("iter_time"))
    return it * (total - done) if it else None


def _pace(timeline: Any, warmup: int) -> tuple[float, float, float, float] | None:
    """(seconds per step, time of the last look, its step, seconds between looks) over the looks after
    warm-up: from the first look that saw a step past warm-up to the last; None with fewer than two."""
    points = []
    for p in timeline if isinstance(timeline, (list, tuple)) else ():
        if isinstance(p, (list, tuple)) and len(p) == 2 and _num(p[0]) is not None and _num(p[1]) is not None:
            points.append((float(p[0]), float(p[1])))
    warm = [p for p in points if p[1] > warmup]
    if len(warm) < 2:
        return None
    (t0, s0), (t1, s1) = warm[0], warm[-1]
    if s1 <= s0 or t1 <= t0:
        return None
    return (t1 - t0) / (s1 - s0), t1, s1, (t1 - t0) / (len(warm) - 1)


def eta_text(st: Mapping[str, Any], warmup: int, now: float | None = None) -> str:
    """'40s', '8m', '2h' for a running run past warm-up; '-' otherwise."""
    left = eta_s(st, warmup, now)
    if left is None:
        return "-"
    if left < 120:
        return f"{left:.0f}s"
    return f"{left / 60:.0f}m" if left < 7200 else f"{left / 3600:.0f}h"
