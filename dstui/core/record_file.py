"""A run's whole metrics file read back once the run is over: reports, import, bisect, tune and tests.

Its own module, not :mod:`dstui.core.records`: it reads through
:class:`~dstui.core.attempt_steps.AttemptSteps`, which reads the record types of
``records`` (so records cannot import it back).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dstui.core import run_files
from dstui.core.attempt_steps import AttemptSteps
from dstui.core.records import MAX_LINE_BYTES, line_parser


def read_records(path: str | Path, fmt: str = "jsonl") -> list[dict[str, Any]]:
    """All records of a finished file (used by reports, import and tests), as MLflow has them:
    a later attempt's repeats of steps an earlier attempt logged are left out, and so are the
    ``attempt`` records themselves (:class:`dstui.core.attempt_steps.AttemptSteps`)."""
    parse = line_parser(fmt)
    steps = AttemptSteps()
    out = []
    try:  # the run's file: never through a link, lines bounded (dstui.core.run_files)
        for raw in run_files.iter_lines(path, MAX_LINE_BYTES):
            rec = parse(raw.decode("utf-8", "replace"))
            if rec is not None and steps.keep(rec):
                out.append(rec)
    except (FileNotFoundError, run_files.NotRegular):
        return []
    return out
