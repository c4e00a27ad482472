"""Runs and batches as plain dicts: what `--json` / `--jsonl` print, and what exit statuses are made of.

One shape for `dstui run`, `dstui status` and `dstui list` so a script reads them
alike: every run has ``batch``, ``run``, ``state``, ``step``, ``steps_total``,
``reason`` (whole, as status.json keeps it) and ``phase`` (None where unknown).
"""

from __future__ import annotations

from typing import Any

from dstui.core import exit_codes, paths
from dstui.core.metric_catalogue import STATUS_KEYS
from dstui.core.run_status import RunStatus
from dstui.core.rundir import BatchDir, RunDir
from dstui.usecases import run_figures

FAILED_STATES = ("failed", "killed")  # what makes an exit status 1 (skipped = predicted OOM, by choice)
# what `dstui list` shows of a planned run's settings (the whole spec is in the run folder once launched)
_PLAN_SETTINGS = ("model", "zero_stage", "offload", "offload_params", "compile", "deepcompile", "dtype",
                  "micro_batch", "seq_length", "grad_accum", "gpus", "nodes")  # fmt: skip


def reason_of(st: dict[str, Any] | RunStatus) -> str | None:
    """The run's reason, whole: its own, else a divergence guard's message."""
    reason = st.get("reason") or (st.get("diverged") or {}).get("message")
    return str(reason) if reason else None


def run_record(rd: RunDir, st: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run as `--json` prints it (status.json's facts, named for scripts).

    ``loss``, ``iter_time``, ``tokens_per_s``, ``mem_peak``: the last step's. ``iter_time_mean``,
    ``tokens_per_s_mean``: a finished run's means over its steps after its ``warmup_steps``
    (:mod:`dstui.usecases.run_figures`; None while it runs). ``eta_s``: from the pace after warm-up.
    """
    raw = rd.status() if st is None else st
    s = RunStatus.from_dict(raw)
    warmup = run_figures.warmup_of(rd.settings())
    speed = run_figures.speed(raw, rd, warmup)
    return {
        "batch": rd.batch.id,
        "run": rd.name,
        "state": s.state,
        "step": s.steps_done or 0,
        "steps_total": s.steps_total,
        "reason": reason_of(s),
        "phase": s.phase,
        "verdict": s.verdict,
        "evidence": s.get("evidence"),  # the verdict's numbers (dstui.core.verdicts); a FAIL's is its reason
        "condition": s.condition,
        "revision": s.revision,
        "repeat": s.get("repeat"),
        "attempt": s.attempt,
        "started": s.started,
        "ended": s.ended,
        "eta_s": run_figures.eta_s(raw, warmup),
        **{k: s.last.get(k) for k in STATUS_KEYS},
        "warmup_steps": warmup,
        "iter_time_mean": speed.iter_time if speed.mean else None,
        "tokens_per_s_mean": speed.tokens_per_s if speed.mean else None,
        "gpus": s.get("gpu_slice"),
        "job_id": s.job_id,
        "nodes": s.get("nodes"),
        "mlflow_run_id": s.mlflow_run_id,
        "path": str(rd.path),
    }


def batch_record(b: BatchDir, *, supervision: str | None = None, notes: list[str] | None = None) -> dict[str, Any]:
    """One batch with all its runs."""
    info = b.info()
    runs = [run_record(rd) for rd in b.runs()]
    return {
        "batch": b.id,
        "experiment": info.get("experiment"),
        "created": info.get("created"),
        "finalized": bool(info.get("finalized")),
        "supervision": supervision,
        "notes": notes or [],
        "path": str(b.path),
        "counts": state_counts(runs),
        "runs": runs,
    }


def state_counts(runs: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    return counts


def exit_code_of(runs: list[dict[str, Any]]) -> int:
    """1 when any run failed or was cancelled, else 0."""
    return exit_codes.RUN_FAILED if any(r["state"] in FAILED_STATES for r in runs) else exit_codes.OK


def home_record() -> dict[str, Any]:
    """Where the runs are and why (see :func:`dstui.core.paths.home_choice`)."""
    choice = paths.home_choice()
    return {"home": str(choice.path), "home_source": choice.source, "runs_dir": str(paths.runs_dir())}


def plan_record(
    r: Any, fc: Any = None, capacity: int | None = None, command: list[str] | None = None, step: Any = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One planned run (`dstui list --json`, `dstui run --dry-run --json`): nothing has started.

    ``extra``: the settings that vary between the plan's runs beyond the usual ones (an ``lr`` axis),
    added to ``settings``.
    """
    from dstui.analysis import forecast

    s = r.settings
    training = s.kind != "command"  # a command's training settings are its own, unknown here
    return {
        "batch": None,
        "run": r.name,
        "state": "planned",
        "step": 0,
        "steps_total": s.steps,
        "reason": forecast.oom_reason(fc, capacity) if fc is not None else None,
        "phase": None,
        "order": r.order,
        "condition": r.condition,
        "revision": r.revision,
        "repeat": r.repeat,
        "key": r.key,
        "kind": s.kind,
        "settings": {**({k: getattr(s, k) for k in _PLAN_SETTINGS} if training else {}), **(extra or {})},
        "ranks": s.gpus * s.nodes,
        "mem_per_gpu": fc.total if fc is not None else None,
        "mem_source": fc.source if fc is not None else None,
        "step_time_s": step.seconds if step is not None else None,  # the time model's prediction (dstui list)
        "step_time_log_sd": step.log_sd if step is not None else None,
        "step_time_source": step.source if step is not None else None,
        "command": command,
    }
