"""What a search writes: its specs (space, grid, winner), a probe's measurement, the report, MLflow.

The space is written as a spec (``space.yaml``) whose explicit conditions are
the candidates, with the probe's settings (steps, time box, a step record every
step); the probes' batch runs from it like any `dstui run` batch. ``grid.yaml``
holds the same candidates with the spec's own settings: the exhaustive batch a
user (or benchmarks/gpu/validate.sh) runs to check the tuner. MLflow gets the
search as the batch's parent run (tags ``dstui.tune.*``, metrics ``tune.*``, the
outcome as ``tune/tune.json`` beside the report section and its chart) and,
per probe, its prediction and the error on its child run.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dstui.core import paths
from dstui.core.failures import is_oom
from dstui.core.rundir import write_json_atomic
from dstui.spec.experiment import ExperimentSpec
from dstui.spec.loading import save_spec_text
from dstui.spec.tune_block import TuneOptions
from dstui.tracking import tags as tag_keys
from dstui.tune import probe_rules, state
from dstui.tune.candidates import Candidate, overrides
from dstui.tune.probes import ProbeRun
from dstui.tune.result import error_pct, winner_spec
from dstui.tune.state import Probe

log = logging.getLogger("dstui.tune")
KEEP = ("revisions", "executor", "slurm", "gpu_memory_gib")  # what a probe runs under; no guard: its baseline is no candidate


def _dump(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    save_spec_text(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120))
    return path


def _spec_parts(spec: ExperimentSpec) -> dict[str, Any]:
    data = spec.model_dump(mode="json", exclude_defaults=True)
    return {k: data[k] for k in KEEP if k in data}


def write_space(folder: Path, spec: ExperimentSpec, candidates: Sequence[Candidate], opts: TuneOptions) -> Path:
    """The probes' spec: every open candidate a condition; steps, time box and logging of a probe."""
    hung = min(float(spec.settings.get("hung_after_s", 600.0)), opts.probe_time_box_s)
    settings = {**spec.settings, "steps": opts.probe_steps, "warmup_steps": opts.warmup_steps, "log_interval": 1,
                "max_runtime_s": opts.probe_time_box_s, "hung_after_s": hung}  # fmt: skip
    data = {
        "name": f"{spec.name}-tune",
        "description": f"`dstui tune` probes of {spec.name}: each condition is a candidate, measured until ranked.",
        "settings": settings,
        "conditions": [{"name": c.name, **overrides(c.choice)} for c in candidates if c.open],
        **_spec_parts(spec),
    }
    return _dump(folder / state.SPACE_FILE, data)


def write_grid(folder: Path, spec: ExperimentSpec, candidates: Sequence[Candidate]) -> Path:
    """Every open candidate with the spec's own settings: the exhaustive `dstui run` of the space."""
    data = {
        "name": f"{spec.name}-grid",
        "description": f"Every candidate of {spec.name}'s tune space, for `dstui run` (what the tuner avoids running).",
        "settings": dict(spec.settings),
        "conditions": [{"name": c.name, **overrides(c.choice)} for c in candidates if c.open],
        **_spec_parts(spec),
    }
    return _dump(folder / state.GRID_FILE, data)


def write_winner(folder: Path, spec: ExperimentSpec, winner: Candidate) -> Path:
    return _dump(folder / state.WINNER_FILE, winner_spec(spec, winner))


def write_report(folder: Path, doc: dict[str, Any]) -> Path:
    """tuning.md and its chart, from the report section's own function; tune.json beside them."""
    from dstui.analysis.tuning import summary_of
    from dstui.report.charts_tuning import save_predicted_vs_measured
    from dstui.report.mdformat import neutralize
    from dstui.report.sections.tuning import image_line, markdown

    write_json_atomic(folder / "tune.json", doc)
    summary = summary_of(doc)
    image = save_predicted_vs_measured(summary, folder / state.CHART_FILE)
    path = folder / state.REPORT_FILE
    path.write_text(neutralize(markdown(summary, image_line(image.name) if image else "")))
    return path


def fill_probe(probe: Probe, run: ProbeRun, opts: TuneOptions) -> None:
    """A probe's record from its run: the step time after warm-up, how it ended, what it cost."""
    t = probe_rules.step_time(run.times, opts.warmup_steps)
    probe.state, probe.reason, probe.started, probe.ended = run.state, run.reason, run.started, run.ended or time.time()
    probe.mlflow_run_id, probe.mem_peak = run.mlflow_run_id, run.mem_peak
    if t is not None and t.steps >= 2:  # one timed step is no mean: a time-boxed probe may leave just that
        probe.step_time, probe.steps, probe.half = t.mean, t.steps, t.half
        # tokens per step (a step's rate times its time) over the mean step time: the rate of the same steps
        tokens = run.tokens_per_s[0] * run.times[0] if run.tokens_per_s and run.times else None
        probe.tokens_per_s = tokens / t.mean if tokens else None
    probe.outcome = outcome(run, probe, opts)


def outcome(run: ProbeRun, probe: Probe, opts: TuneOptions) -> str:
    if run.state == "done":
        asked = {probe_rules.PRECISE: "ranked (interval tight)", probe_rules.SLOWER: "ranked (slower than the best)"}
        return asked.get(run.stop_asked or "", f"ran all {len(run.times)} steps")
    if is_oom(run.reason):
        return "out of memory"
    if run.cancelled_at_box or "max_runtime_s" in (run.reason or ""):
        return f"time box ({opts.probe_time_box_s:.0f} s) after {len(run.times)} steps"
    return f"{run.state}: {run.reason or 'no reason'}"


def _client() -> Any:
    from dstui.tracking import client as tracking

    return tracking.client(paths.tracking_uri())


def log_probe(probe: Probe, cand: Candidate, search: str) -> None:
    """The prediction a probe was chosen on, and its error, on its MLflow child run (best effort)."""
    if not probe.mlflow_run_id:
        return
    from dstui.tracking import client as tracking

    metrics = {"tune.predicted_iter_time": probe.predicted_s, "tune.predicted_log_sd": probe.predicted_sd,
               "tune.measured_iter_time": probe.step_time, "tune.prediction_error_pct": error_pct(probe),
               "tune.probe_wall_s": probe.wall_s}  # fmt: skip
    now = int(time.time() * 1000)
    try:
        c = _client()
        tracking.set_tags(c, probe.mlflow_run_id, {tag_keys.TUNE: search, tag_keys.TUNE_CANDIDATE: cand.name,
                                                  tag_keys.TUNE_OUTCOME: probe.outcome})
        tracking.log_metrics(c, probe.mlflow_run_id, [(k, float(v), now, 0) for k, v in metrics.items() if v is not None])
    except Exception as e:  # noqa: BLE001 - the store is down: the state file holds it all
        log.warning("could not log probe %s to MLflow: %s", probe.candidate, e)


def log_search(parent_id: str | None, doc: dict[str, Any], folder: Path) -> None:
    """The search on the batch's parent run: winner, why it stopped, its cost, the outcome files."""
    if not parent_id:
        return
    from dstui.tracking import client as tracking

    cost = doc.get("cost") or {}
    errors = [abs(r["error_pct"]) for r in doc.get("ranking", []) if r.get("error_pct") is not None]
    metrics = {"tune.probes": cost.get("probes"), "tune.candidates": doc.get("candidates"),
               "tune.left_out": len(doc.get("left_out", [])), "tune.probe_wall_s": cost.get("probe_wall_s"),
               "tune.gpu_s": cost.get("gpu_s"), "tune.search_wall_s": cost.get("search_wall_s"),
               "tune.median_abs_error_pct": statistics.median(errors) if errors else None}  # fmt: skip
    now = int(time.time() * 1000)
    try:
        c = _client()
        tracking.set_tags(c, parent_id, {tag_keys.TUNE: folder.name, tag_keys.TUNE_WINNER: doc.get("winner") or "-",
                                         tag_keys.TUNE_STOP_REASON: doc.get("stop_reason")})  # fmt: skip
        tracking.log_metrics(c, parent_id, [(k, float(v), now, 0) for k, v in metrics.items() if v is not None])
        for name in ("tune.json", state.REPORT_FILE, state.CHART_FILE, state.WINNER_FILE):
            if (folder / name).is_file():
                tracking.log_file_artifact(c, parent_id, folder / name, "tune")
    except Exception as e:  # noqa: BLE001
        log.warning("could not log the search to MLflow: %s", e)
