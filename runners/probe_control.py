"""A run's graceful stop request, and a hang injected for tests; read by the training loop between steps.

`dstui tune` stops a probe as soon as its step time is measured well enough: it
writes ``stop.request`` beside the run's metrics file (:data:`dstui.core.rundir.STOP_FILE`).
Only rank 0 looks (the file may live on one node); its answer rides the loss's
all-reduce that every logged step makes anyway, so all ranks leave the loop
after the same step and the run ends as one that finished (summary, exit 0).

``DSTUI_INJECT_HANG`` (tests only, like ``DSTUI_PARITY_INJECT``):
``key=value,...`` matched against the runner's arguments, plus ``step=N``
(default 1): a matching run sleeps after logging step N, as a deadlocked
collective would, so the supervisor's limits can be shown to stop it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from dstui.core.rundir import STOP_FILE

HANG_ENV = "DSTUI_INJECT_HANG"


class StopRequest:
    """Rank 0's view of the stop file; other ranks pass no metrics file and never ask."""

    def __init__(self, metrics_file: str | None) -> None:
        self.path = os.path.join(os.path.dirname(os.path.abspath(metrics_file)), STOP_FILE) if metrics_file else None

    def asked(self) -> bool:
        return bool(self.path) and os.path.exists(self.path)


def injected_hang_step(config: dict[str, Any]) -> int | None:
    """The step after which this run hangs, when ``DSTUI_INJECT_HANG`` matches its arguments; else None."""
    spec = os.environ.get(HANG_ENV, "").strip()
    if not spec:
        return None
    wanted = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
    step = int(wanted.pop("step", "1"))
    matches = all(str(config.get(k)).lower() == v.strip().lower() for k, v in wanted.items())
    return step if matches else None


def hang_if_injected(hang_step: int | None, step: int) -> None:
    if hang_step is not None and step == hang_step:
        print(f"{HANG_ENV}: hanging after step {step}", flush=True)
        while True:
            time.sleep(60)
