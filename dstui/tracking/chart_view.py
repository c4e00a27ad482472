"""The "dstui" view of an experiment in MLflow's UI: its runs' charts, training first.

MLflow's UI lays out an experiment's chart view by itself on a first visit: one
chart per metric key, custom sections (a key's prefix before ``/``) above
"Model metrics" and "System metrics", and every visible row of the runs list
as a trace in every line chart. What it opens with can be chosen through a
*saved view*: an experiment tag ``mlflow.sharedViewState.<id>`` holding a JSON
envelope (``name``, ``createdAt``, ``updatedAt``, ``state``) whose state is
the page's search facets and UI state (MLflow 3.15+, "Views"; a link with
``viewStateShareKey=<id>`` opens it, and the Views menu lists it by name).

dstui writes one such view per experiment (:data:`VIEW_ID`) and every link it
prints opens it (:func:`view_url`): only dstui's runs (``dstui.role = run``: no
batch run in any legend), in sections Training (loss and iteration time first,
memory in GiB, the learning rate on a log axis so 1e-4 and 1e-3 read as a
decade apart), Summary (a parallel-coordinates chart of the spec's axes
against the mean step time, then one bar per run and figure), Time (where a
run's wall time went) and MLflow's own System metrics. Metrics it does not
name land in "Model metrics", which MLflow fills by itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import zlib
from typing import TYPE_CHECKING, Any

from dstui.core.metric_catalogue import MLFLOW_VIEW, names_in
from dstui.tracking import client as tracking
from dstui.tracking import tags as tag_keys
from dstui.tracking.metric_names import mlflow_key

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

VIEW_ID = "dstui"
VIEW_NAME = "dstui: runs, training first"
VIEW_TAG = tag_keys.SAVED_VIEW_PREFIX + VIEW_ID
RUNS_FILTER = tag_keys.RUN_FILTER
RUNS_SHOWN = "FIRST_20_RUNS"  # MLflow's choices are 10, 20 or all

# (section, [(metric as MLflow names it, chart type, log axis)])
TRAINING = [mlflow_key(name) for name in names_in(MLFLOW_VIEW)]  # mem_* as GiB under *_gib
LOG_AXIS = {"lr"}
SUMMARY = ["summary.iter_time_mean", "summary.tokens_per_s_mean", "summary.mem_peak_max_gib", "summary.final_loss",
           "summary.iter_time_std", "summary.tflops_per_gpu_mean", "summary.mfu_mean", "summary.compile_time",
           "summary.steps"]  # fmt: skip
TIME = ["time.wall", "time.launch", "time.imports", "time.init", "time.compile", "time.steps", "time.teardown",
        "time.step_share"]  # fmt: skip
SPEED = "summary.iter_time_mean"  # what the parallel-coordinates chart colours runs by
TAG_LIMIT = 20000  # MLflow's longest experiment tag value
COMPRESSED = "deflate;"  # MLflow's UI: this prefix, then base64 of zlib-deflated text


def _section(name: str) -> dict[str, Any]:
    return {"uuid": f"dstui-{name.lower().replace(' ', '-')}", "name": name, "display": True, "isReordered": True,
            "deleted": False, "isGenerated": False}  # fmt: skip


def _card(kind: str, section: dict[str, Any], uid: str, **fields: Any) -> dict[str, Any]:
    return {"uuid": f"dstui-{uid}", "type": kind, "metricSectionId": section["uuid"], "deleted": False,
            "isGenerated": False, "runsCountToCompare": 20, **fields}  # fmt: skip


def _line(section: dict[str, Any], key: str) -> dict[str, Any]:
    return _card("LINE", section, key, metricKey=key, selectedMetricKeys=[key], lineSmoothness=0, xAxisKey="step",
                 xAxisScaleType="linear", scaleType="log" if key in LOG_AXIS else "linear", range={},
                 yAxisKey="metric", yAxisExpressions=[], ignoreOutliers=False, useGlobalXaxisKey=True,
                 useGlobalLineSmoothing=True, selectedXAxisMetricKey="")  # fmt: skip


def _bar(section: dict[str, Any], key: str) -> dict[str, Any]:
    return _card("BAR", section, key, metricKey=key)


def view_state(axes: list[str]) -> dict[str, Any]:
    """The view's state: search facets and MLflow's UI state (charts, sections, columns)."""
    training, summary, phases = _section("Training"), _section("Summary"), _section("Time")
    model, system = _section("Model metrics"), _section("System metrics")
    charts = [_line(training, k) for k in TRAINING]
    if axes:  # the spec's axes against the mean step time, one line per run
        charts.append(_card("PARALLEL", summary, "parallel", selectedParams=list(axes), selectedMetrics=[SPEED]))
    charts += [_bar(summary, k) for k in SUMMARY] + [_bar(phases, k) for k in TIME]
    columns = ["attributes.`Dataset`", f"tags.`{tag_keys.BATCH}`", f"tags.`{tag_keys.CONDITION}`",
               f"tags.`{tag_keys.STATUS}`", *(f"params.`{a}`" for a in axes), f"metrics.`{SPEED}`",
               "metrics.`summary.final_loss`"]  # fmt: skip
    return {
        "searchFilter": RUNS_FILTER,
        "compareRunCharts": charts,
        "compareRunSections": [training, summary, phases, model, system],
        "isAccordionReordered": True,
        "runsHiddenMode": RUNS_SHOWN,
        "hideEmptyCharts": True,
        "selectedColumns": columns,
    }


def view_tag_value(axes: list[str], now_ms: int | None = None) -> str:
    """The experiment tag's value: MLflow's saved-view envelope (deflated when the plain state is long).

    ``dstui`` (a field MLflow ignores) is a digest of the state as written: a view someone
    changed and saved again in MLflow's UI loses it, and dstui leaves that view alone.
    """
    state = json.dumps(view_state(axes), separators=(",", ":"))
    if len(state) > TAG_LIMIT - 500:
        state = COMPRESSED + base64.b64encode(zlib.compress(state.encode())).decode()
    now = now_ms or int(time.time() * 1000)
    return json.dumps({"name": VIEW_NAME, "createdAt": now, "updatedAt": now, "state": state, "dstui": _digest(state)})


def _digest(state: str) -> str:
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def _ours(value: str | None) -> bool:
    """No view yet, or the one dstui wrote, unchanged since (a view edited in the UI is the user's)."""
    if not value:
        return True
    try:
        envelope = json.loads(value)
        return envelope.get("dstui") == _digest(str(envelope.get("state")))
    except (ValueError, AttributeError):
        return False


def set_up(c: MlflowClient, name: str, *, description: str = "", axes: list[str] | None = None) -> str:
    """The experiment (made or found, in MLflow's model-training layout), its description and the dstui view."""
    exp_id = tracking.ensure_experiment(c, name)
    describe(c, exp_id, description=description, axes=axes)
    return exp_id


def describe(c: MlflowClient, experiment_id: str, *, description: str = "", axes: list[str] | None = None) -> None:
    """The experiment's description (when there is one) and the dstui view (unless someone changed it in the UI).

    ``axes`` None (an import: it does not know what a spec varies) writes the view only where there is none.
    """
    if description.strip():
        c.set_experiment_tag(experiment_id, tag_keys.DESCRIPTION, description[: tracking.MAX_PARAM_LEN])
    current = (c.get_experiment(experiment_id).tags or {}).get(VIEW_TAG)
    if current is None or (axes is not None and _ours(current)):
        c.set_experiment_tag(experiment_id, VIEW_TAG, view_tag_value(list(axes or [])))


def varied_settings(spec: dict[str, Any]) -> list[str]:
    """The settings a spec varies: its axes and what its conditions set (the parallel chart's axes)."""
    names = dict.fromkeys(spec.get("axes") or {})
    for cond in spec.get("conditions") or []:
        if isinstance(cond, dict):
            names.update(dict.fromkeys(k for k, v in cond.items() if k != "name" and isinstance(v, (str, int, float, bool))))
    return [str(n) for n in names][:10]


def view_url(base: str, experiment_id: str) -> str:
    """The experiment's chart view, opened on the dstui view (``base`` '': a link within MLflow's pages)."""
    root = f"{base.rstrip('/')}/" if base else ""  # '': a link inside MLflow's own pages
    return f"{root}#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_ID}&compareRunsMode=CHART&{tracking.UI_MODE}"
