"""What ran beside a run: other runs on this machine while it lived, and the host's load.

Timings taken while another run computes on the same cores are not the run's
own (issue 38.2: 221 ± 188 ms/step against 26 for the same work). So every
local run records, while it lives, which other runs of any batch the machine's
ledger (:mod:`~dstui.execute.gpu_ledger`) showed live beside it, when, and at
which of its own steps; and the host's 1-minute load average while it trained
(another user's processes show there, not in the ledger). The record is in
status.json (``beside``, ``host_load``, ``overlap``) and, as the run ends, in
MLflow's tags ``dstui.overlapped`` (``true``: another run shared the machine
during its timed steps) and ``dstui.overlap`` (which runs, at which steps, the
load). Reports leave timings taken under overlap out of speed comparisons
unless asked (:mod:`dstui.analysis.stats`, ``dstui report --include-overlapped``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dstui.core.rundir import FINAL_STATES, RunDir
from dstui.execute.gpu_ledger import Holder
from dstui.tracking import tags as tag_keys

BESIDE = "beside"  # other run's folder -> {batch, run, from, to, steps: [first, last] of this run's steps_done}
HOST_LOAD = "host_load"  # {mean, max, samples, cores}: os.getloadavg()[0] while the run trained
OVERLAP = "overlap"  # {timed, steps, text}: the summary that the MLflow tags carry
MAX_BESIDE = 64  # a run beside hundreds of others is named by its first 64
LOOK_EVERY_S = 1.0


def host_load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def record(rd: RunDir, st: dict[str, Any], holders: Sequence[Holder], now: float, load: float | None, cores: int) -> dict[str, Any]:
    """One look at the machine for a live run: every other live run in the ledger is beside it now.

    An entry stays ``open`` while the other run is seen; the look that no longer
    sees it closes it at this run's steps then (the other ended between two looks).
    """
    me = str(rd.path)
    steps = _int(st.get("steps_done"))
    now_seen = {h.run_path: h for h in holders if h.run_path != me}
    beside: dict[str, Any] = {}
    for path, e in (st.get(BESIDE) or {}).items():
        if not isinstance(e, dict):
            continue
        if e.get("open") and path not in now_seen:
            e = {**e, "open": False, "steps": [_steps(e)[0], steps]}
        beside[path] = e
    for path, h in now_seen.items():
        e = beside.get(path)
        if e is not None:
            beside[path] = {**e, "to": now, "open": True, "steps": [_steps(e)[0], steps]}
        elif len(beside) < MAX_BESIDE:
            beside[path] = {"batch": h.batch, "run": h.run, "from": now, "to": now, "open": True, "steps": [steps, steps]}
    host = dict(st.get(HOST_LOAD) or {})
    if load is not None and st.get("state") == "running":
        n = _int(host.get("samples"))
        host = {"mean": (float(host.get("mean") or 0.0) * n + load) / (n + 1), "max": max(float(host.get("max") or 0.0), load),
                "samples": n + 1, "cores": cores}  # fmt: skip
    warmup = _int(rd.settings().get("warmup_steps"))
    summary = summarize(beside, host, warmup=warmup, total=_int(st.get("steps_total")))
    return {BESIDE: beside, HOST_LOAD: host, OVERLAP: {**summary.as_status(), "warmup": warmup}}


def _steps(e: dict[str, Any]) -> list[int]:
    s = e.get("steps")
    return [_int(s[0]), _int(s[1])] if isinstance(s, list) and len(s) == 2 else [0, 0]


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


@dataclass(frozen=True)
class Summary:
    """Whether other runs overlapped this run's timed steps, which steps, and in words."""

    timed: bool  # another run lived beside it during a step after warm-up: its step times are not its own
    steps: tuple[int, int] | None  # the first and last of its steps that another run overlapped
    text: str

    def as_status(self) -> dict[str, Any]:
        return {"timed": self.timed, "steps": list(self.steps) if self.steps else None, "text": self.text}


def summarize(beside: dict[str, Any], host: dict[str, Any], *, warmup: int, total: int, ended: bool = False) -> Summary:
    """The overlap in one line: 'steps 3-8 beside batch X (runs a, b); host load 3.4 mean, 5.1 max on 2 cores'.

    A look sees ``steps_done`` = k while step k+1 runs, and the other run may have
    started just after the previous look: steps k through (last look's) k+1 are
    counted as overlapped, never fewer. Once this run ``ended``, another run still
    open at its last look was beside it to its last step.
    """
    ranges = []
    names: dict[str, list[str]] = {}
    for e in beside.values():
        lo, hi = _steps(e)
        first, last = max(1, lo), (total if ended and e.get("open") and total else hi + 1)
        if total:
            last = min(last, total)
        if first <= last:
            ranges.append((first, last))
        names.setdefault(str(e.get("batch", "?")), []).append(str(e.get("run", "?")))
    steps = (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None
    timed = any(last > warmup for _, last in ranges)
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


def tags(st: dict[str, Any]) -> dict[str, str]:
    """The MLflow tags of a run's overlap record (none before the run was ever looked at)."""
    summary = st.get(OVERLAP)
    if not isinstance(summary, dict):
        return {}
    if st.get("state") in FINAL_STATES:  # what was still beside it at its last look stayed to its end
        summary = summarize(st.get(BESIDE) or {}, st.get(HOST_LOAD) or {}, warmup=_int(summary.get("warmup")),
                            total=_int(st.get("steps_total")), ended=True).as_status()  # fmt: skip
    return {tag_keys.OVERLAPPED: "true" if summary.get("timed") else "false", tag_keys.OVERLAP: str(summary.get("text", ""))[:500]}
