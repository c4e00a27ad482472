"""The runs a report or a comparison asks for, or :class:`NothingFound` (exit status 3).

``dstui report`` and ``dstui compare`` name an experiment, a batch, run ids or
a baseline; when one of them does not exist, scripts must read exit status 3
(:mod:`dstui.core.exit_codes`), not 2 as for a malformed request. MLflow's
reader (:func:`dstui.analysis.fetch.fetch_runs`) says "nothing there" with a
plain :class:`~dstui.analysis.rundata.ReportError`; this module tells the
two apart in one place, so both commands answer alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dstui.analysis import fetch
from dstui.analysis.rundata import ReportError, RunData
from dstui.core.errors import NotFound
from dstui.tracking import client as tracking


class NothingFound(ReportError, NotFound):
    """An experiment, batch, run or baseline that was asked for does not exist (exit status 3)."""


def fetch_runs(
    client: Any, experiment: str, *, batch: str | None = None, run_ids: Sequence[str] | None = None
) -> tuple[Any, list[RunData]]:
    """:func:`dstui.analysis.fetch.fetch_runs`, with "does not exist" raised as :class:`NothingFound`.

    A batch id MLflow cannot filter on (both kinds of quote) is a malformed
    request, not a missing batch: it stays a plain ReportError (exit 2).
    """
    if client.get_experiment_by_name(experiment) is None:
        raise NothingFound(f"no MLflow experiment named '{experiment}'")
    if batch and not run_ids and tracking.literal(batch) is None:
        return fetch.fetch_runs(client, experiment, batch=batch, run_ids=run_ids)
    try:
        return fetch.fetch_runs(client, experiment, batch=batch, run_ids=run_ids)
    except NotFound:
        raise
    except ReportError as e:  # what is left: no such runs, no such run id
        raise NothingFound(str(e)) from None
