"""Live series of a run, read incrementally from its folder; decimation and EMA.

No textual here: the live view's worker fills these from the run folder and the
chart widgets only draw what :func:`decimate` hands them, so drawing cost
depends on the widget's width, not on how many steps a run has logged.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.core.attempt_steps import AttemptSteps
from dstui.core.metric_catalogue import LIVE, names_in, shown_in, warmup_count
from dstui.core.records import STEP, SUMMARY, Follower, line_parser
from dstui.core.rundir import RunDir

STEP_KEYS = names_in(LIVE)
SYSTEM_KEYS = ("cpu", "rss", "gpu_util", "gpu_mem", "gpu_power")
SMOOTHED = tuple(m.name for m in shown_in(LIVE) if m.smoothed)
EMA_ALPHA = 0.1


class Buffer:
    """Growable float arrays for x and y (array('d'): compact, fast to append)."""

    __slots__ = ("x", "y")

    def __init__(self) -> None:
        self.x = array("d")
        self.y = array("d")

    def append(self, x: float, y: float) -> None:
        self.x.append(x)
        self.y.append(y)

    def extend(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.x.extend(xs)
        self.y.extend(ys)

    def __len__(self) -> int:
        return len(self.x)


def decimate(xs: Sequence[float], ys: Sequence[float], columns: int) -> tuple[list[float], list[float]]:
    """At most ~2 points per column: the min and the max of each column's x-bin, in x order.

    Drawn as a line, this keeps every spike and dip visible (an envelope) while
    plotting O(columns) points however long the run is.
    """
    n = len(xs)
    columns = max(1, int(columns))
    if n <= 2 * columns:
        return list(xs), list(ys)
    import numpy as np

    x = np.frombuffer(xs, dtype=float) if isinstance(xs, array) else np.asarray(xs, dtype=float)
    y = np.frombuffer(ys, dtype=float) if isinstance(ys, array) else np.asarray(ys, dtype=float)
    lo, hi = x[0], x[-1]
    if hi <= lo:
        return [float(x[-1])], [float(y[-1])]
    # x is (nearly always) increasing: bin edges by searchsorted keep it O(n) and vectorised
    edges = np.linspace(lo, hi, columns + 1)
    starts = np.searchsorted(x, edges[:-1], side="left")
    starts = np.unique(np.clip(starts, 0, n - 1))
    # NaN-aware (fmin/fmax ignore a NaN unless the whole bin is NaN)
    mins = np.fmin.reduceat(y, starts)
    maxs = np.fmax.reduceat(y, starts)
    bx = x[starts]
    out_x = np.repeat(bx, 2)
    out_y = np.empty(2 * len(starts))
    out_y[0::2] = mins
    out_y[1::2] = maxs
    return out_x.tolist(), out_y.tolist()


def ema(values: Sequence[float], alpha: float, start: float | None = None) -> list[float]:
    """Exponential moving average (NaNs carry the previous value)."""
    out = []
    prev = start
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(prev if prev is not None else float("nan"))
            continue
        prev = v if prev is None else alpha * v + (1 - alpha) * prev
        out.append(prev)
    return out


@dataclass
class RunSeries:
    """Everything the live view draws for one run; grown by :meth:`poll`."""

    rd: RunDir
    fmt: str = "jsonl"
    steps: dict[str, Buffer] = field(default_factory=lambda: {k: Buffer() for k in STEP_KEYS})
    system: dict[str, Buffer] = field(default_factory=lambda: {k: Buffer() for k in SYSTEM_KEYS})
    smooth: dict[str, Buffer] = field(default_factory=lambda: {k: Buffer() for k in SMOOTHED})
    system_last: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    t0: float | None = None
    warmup: float = 0.0  # the run's warmup_steps: left out of the charts' y-range (or hidden)
    _metrics: Follower | None = None
    _sys: Follower | None = None

    def _open(self) -> None:
        """The run's settings (its metrics format, its warm-up) and its files: read by the first
        :meth:`read_new`, in the reading thread (a series is made on the UI thread, which reads no file)."""
        settings = self.rd.settings()
        fmt = settings.get("metrics_format", "jsonl")
        self.fmt = fmt
        self.warmup = float(warmup_count(settings.get("warmup_steps")) or 0)
        source = self.rd.metrics_file if fmt == "jsonl" else self.rd.log_file
        self._metrics = Follower(source)
        self._attempts = AttemptSteps()
        self._sys = Follower(self.rd.system_file)

    @property
    def name(self) -> str:
        return self.rd.name

    def read_new(self) -> Delta:
        """Parse what was appended since the last call (worker thread; touches no buffers)."""
        if self._metrics is None:
            self._open()
        assert self._metrics is not None and self._sys is not None
        d = Delta()
        parse = line_parser(self.fmt)
        for line, _ in self._metrics.read_lines():
            rec = parse(line)
            if rec is None or not self._attempts.keep(rec):  # a requeued job's repeats: drawn once, as in MLflow
                continue
            if rec.get("type") == STEP:
                step = float(rec["step"])
                for key in STEP_KEYS:
                    v = rec.get(key)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        xs, ys = d.steps.setdefault(key, ([], []))
                        xs.append(step)
                        ys.append(float(v))
            elif rec.get("type") == SUMMARY:
                d.summary = rec
        for line, _ in self._sys.read_lines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            t = rec.get("time")
            if not isinstance(t, (int, float)):
                continue
            for key, v in system_readings(rec).items():
                xs, ys = d.system.setdefault(key, ([], []))
                xs.append(float(t))
                ys.append(v)
        return d

    def apply(self, d: Delta) -> bool:
        """Append a delta (main thread: the only writer of the buffers). True if anything new."""
        for key, (xs, ys) in d.steps.items():
            self.steps[key].extend(xs, ys)
            if key in SMOOTHED:
                buf = self.smooth[key]
                start = buf.y[-1] if len(buf) else None
                buf.extend(xs, ema(ys, EMA_ALPHA, start))
        for key, (xs, ys) in d.system.items():
            if self.t0 is None:
                self.t0 = xs[0]
            self.system[key].extend([x - self.t0 for x in xs], ys)
            self.system_last[key] = ys[-1]
        if d.summary is not None:
            self.summary = d.summary
        return not d.empty

    def poll(self) -> bool:
        """read_new + apply in one go (tests, benchmarks, single-threaded callers)."""
        return self.apply(self.read_new())


@dataclass
class Delta:
    steps: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    system: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    summary: dict[str, Any] | None = None

    @property
    def empty(self) -> bool:
        return not self.steps and not self.system and self.summary is None


def system_readings(rec: dict[str, Any]) -> dict[str, float]:
    """GPU util/mem/power (summed over the run's GPUs) when present, else job CPU%/RSS."""
    out: dict[str, float] = {}
    util = [v for k, v in rec.items() if k.startswith("gpu") and k.endswith("_util_percent")]
    mem = [v for k, v in rec.items() if k.startswith("gpu") and k.endswith("_mem_used_bytes")]
    power = [v for k, v in rec.items() if k.startswith("gpu") and k.endswith("_power_w")]
    if util:
        out["gpu_util"] = sum(util) / len(util)
    if mem:
        out["gpu_mem"] = float(sum(mem))
    if power:
        out["gpu_power"] = float(sum(power))
    cpu = rec.get("job_cpu_percent", rec.get("cpu_percent"))
    if isinstance(cpu, (int, float)):
        out["cpu"] = float(cpu)
    rss = rec.get("job_rss_bytes")
    if isinstance(rss, (int, float)):
        out["rss"] = float(rss)
    return out
