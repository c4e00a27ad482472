"""Helpers for the TUI tests: deterministic run folders and MLflow stores, waiting on a Pilot."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from dstui.core.rundir import BatchDir, write_json_atomic

T0 = 1_790_000_000.0  # a fixed "now" for fixture folders (no clocks in snapshots)
REPO = Path(__file__).resolve().parents[2]


def write_run(
    batch: Path,
    name: str,
    *,
    order: int,
    state: str,
    steps: int = 20,
    reason: str | None = None,
    loss0: float = 6.0,
    iter_time: float = 0.05,
    mem: float = 500e6,
    log_lines: int = 30,
) -> Path:
    rd = batch / name
    rd.mkdir(parents=True)
    condition = name.rsplit("-r", 1)[0]
    write_json_atomic(rd / "spec.json", {
        "experiment": "fixture", "condition": condition, "name": name, "order": order,
        "settings": {"kind": "train", "metrics_format": "jsonl", "steps": steps, "warmup_steps": 2},
        "repeat": 0, "revision": "installed", "key": f"k{order}",
    })  # fmt: skip
    done = steps if state == "done" else steps // 2 if state in ("failed", "killed") else 0
    last = {}
    with open(rd / "metrics.jsonl", "w") as fh:
        fh.write(json.dumps({"type": "header", "time": T0, "device": "cpu"}) + "\n")
        for s in range(1, done + 1):
            rec = {
                "type": "step", "time": T0 + s, "step": s, "epoch": 1,
                "loss": round(loss0 * math.exp(-s / 12) + 0.05 * math.sin(s), 6),
                "iter_time": round(iter_time * (3 if s == 1 else 1 + 0.1 * math.sin(s * order + 1)), 6),
                "tokens_per_s": round(1000 / iter_time, 1),
                "mem_alloc": mem * 0.8 + s * 1e5, "mem_peak": mem + s * 1e5 + order * 2e7,
            }  # fmt: skip
            fh.write(json.dumps(rec) + "\n")
            last = {k: rec[k] for k in ("loss", "iter_time", "tokens_per_s", "mem_peak")}
    with open(rd / "system.jsonl", "w") as fh:
        for i in range(done):
            fh.write(json.dumps({
                "time": T0 + 2 * i, "node": "fixture", "cpu_percent": 50.0,
                "job_cpu_percent": 100 + 40 * math.sin(i / 3 + order), "job_rss_bytes": 1.5e9 + i * 1e6,
            }) + "\n")  # fmt: skip
    with open(rd / "stdout.log", "w") as fh:
        for i in range(1, log_lines + 1):
            fh.write(f"[rank0] fixture log line {i} of {name}\n")
    status = {
        "name": name, "condition": condition, "revision": "installed", "repeat": 0,
        "key": f"k{order}", "order": order, "state": state, "steps_total": steps,
        "steps_done": done, "last": last, "reason": reason, "started": T0, "updated": T0 + 60,
    }  # fmt: skip
    if state in ("done", "failed", "killed"):
        status["ended"] = T0 + 60
    write_json_atomic(rd / "status.json", status)
    return rd


def fixture_batch(root: Path, batch_id: str = "fixture-20260101-000000", *, finalized: bool = True) -> BatchDir:
    """A finished batch: done, failed (OOM), killed and queued runs."""
    path = root / "runs" / batch_id
    path.mkdir(parents=True)
    runs = [
        ("z0-r0", "done", None),
        ("z1-r0", "done", None),
        ("z2-r0", "failed", "CUDA out of memory"),
        ("z3-r0", "killed", "cancelled"),
    ]
    for i, (name, state, reason) in enumerate(runs):
        write_run(path, name, order=i, state=state, reason=reason, iter_time=0.05 / (i + 1), loss0=6.0 + 0.01 * i)
    write_json_atomic(path / "batch.json", {
        "id": batch_id, "experiment": "fixture", "spec_path": str(REPO / "configs/experiments/smoke.yaml"),
        "runs": [r[0] for r in runs], "parallel": 1, "created": T0, "finalized": finalized,
    })  # fmt: skip
    return BatchDir(path)


def add_phases(rd_path: Path, *, gpu_slice: list[int] | None = None) -> None:
    """Give a fixture run what a finished real run has: the runner's ``phases`` record and summary,
    the wrapper's exit.json, the GPUs the supervisor gave it, and the breakdown the supervisor stores.

    Breakdown (s): launch 2.0, imports 3.0, init 4.0, compile 1.5, steps 39.5, teardown 8.0;
    wall 58.0; 2.0 s of optimizer steps (3% of wall).
    """
    from dstui.core import phases
    from dstui.core.rundir import RunDir

    rd = RunDir(rd_path)
    marks = {"process_start": T0 + 2.0, "imports_done": T0 + 5.0, "group_up": T0 + 6.0, "model_built": T0 + 7.0,
             "engine_ready": T0 + 9.0, "first_step_done": T0 + 11.0, "last_step_done": T0 + 50.0, "exit": T0 + 51.0}  # fmt: skip
    with open(rd.metrics_file, "a") as fh:
        fh.write(json.dumps({"type": "summary", "time": T0 + 50.5, "compile_time": 1.5, "step_time_sum": 2.0}) + "\n")
        fh.write(json.dumps({"type": "phases", "time": T0 + 51.0, **marks}) + "\n")
    write_json_atomic(rd.exit_file, {"ended": T0 + 58.0, "exit_code": 0})
    if gpu_slice is not None:
        rd.update_status(gpu_slice=gpu_slice)
    phases.record(rd)  # what the supervisor does when the run ends


async def wait_for(pilot, predicate, timeout: float = 60.0, step: float = 0.2) -> bool:  # noqa: ANN001
    """Let the app run until predicate() is true (real processes need real time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await pilot.pause(step)
    return predicate()


async def home_shown(pilot, timeout: float = 30.0) -> bool:  # noqa: ANN001
    """Wait until the app's first snapshot of the runs home is rendered (its worker reads it off the UI thread)."""
    ok = await wait_for(pilot, lambda: pilot.app.home is not None, timeout)
    await pilot.pause()
    return ok


async def workers_done(app) -> None:  # noqa: ANN001
    """Wait for the app's workers to finish, but the home watcher (it runs as long as the app)."""
    others = [w for w in app.workers if w.group != "home"]
    if others:  # (an empty list would mean every worker to textual)
        await app.workers.wait_for_complete(others)


async def confirm_launch(pilot, timeout: float = 120.0) -> str:  # noqa: ANN001
    """Answer yes to the question a launch asks once the spec passed its checks; returns the question."""
    from dstui.tui.screens.confirm import ConfirmScreen

    asked = await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), timeout)
    assert asked, [(n.title, n.message) for n in pilot.app._notifications]
    question = pilot.app.screen.question
    assert question.startswith(("Launch ", "Resume ")), question
    await pilot.press("y")
    return question


async def open_compose(pilot):  # noqa: ANN001, ANN201 - a Pilot, a ComposeScreen (textual imported lazily)
    """Switch to Compose (key 1) and return its screen."""
    from dstui.tui.screens.compose import ComposeScreen

    await pilot.press("1")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, ComposeScreen)
    return screen


def seed_spec(tmp: Path, name: str = "seedcmd", sleep_s: float = 0.2, steps: int = 5) -> Path:
    """A fast command spec that prints the seed's step lines (finishes in about a second)."""
    code = (
        "import time\n"
        f"for s in range(1, {steps + 1}):\n"
        "    print(f'Epoch 1, Step {s}, Loss: {5.0 / s:.6f} sync: True time: 0.010 "
        "alloc_mem: {1000 * s} peak_mem: {2000 * s}', flush=True)\n"
        f"    time.sleep({sleep_s})\n"
    )
    spec = {
        "name": name,
        "settings": {"kind": "command", "metrics_format": "seed", "steps": steps, "warmup_steps": 1},
        "conditions": [{"name": "echo", "command": ["{python}", "-c", code]}],
    }
    import yaml

    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_cli(*args: str, cwd: Path | None = None) -> str:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "dstui", *args], capture_output=True, text=True, cwd=cwd, env=os.environ.copy()
    )
    return out.stdout + out.stderr


# condition -> (iteration times per step, final loss offset)
CONDITIONS = {
    "z0": ([9.0, 9.0, 0.10, 0.12, 0.11, 0.13], 0.0),
    "z1": ([9.0, 9.0, 0.20, 0.22, 0.21, 0.23], 0.01),
    "z2": ([9.0, 9.0, 0.30, 0.30, 0.30, 0.30], -0.02),
}


def make_store() -> None:
    """An experiment as the supervisor lays it out: a parent per batch, a child per run."""
    from dstui.tracking import client as tracking

    c = tracking.client()
    exp = tracking.ensure_experiment(c, "fixture")
    parent = tracking.create_run(c, exp, "fixture-b1", tags={"dstui.role": "batch", "dstui.batch": "fixture-b1"})
    order = 0
    for cond, (iters, off) in CONDITIONS.items():
        for repeat in range(2):
            rid = tracking.create_run(c, exp, f"{cond}-r{repeat}", parent_id=parent, tags={
                "dstui.role": "run", "dstui.batch": "fixture-b1", "dstui.condition": cond,
                "dstui.revision": "installed", "dstui.repeat": repeat, "dstui.kind": "train",
                "dstui.status": "done", "dstui.order": order,
            })  # fmt: skip
            order += 1
            tracking.log_params(c, rid, {"warmup_steps": 2, "steps": len(iters)})
            points = []
            for step, it in enumerate(iters, start=1):
                points += [
                    ("iter_time", it, 1000 + step, step),
                    ("loss", 6.0 - 0.5 * step + off, 1000 + step, step),
                    ("mem_peak", 1e9 * (1 + order), 1000 + step, step),
                    ("tokens_per_s", 100 / it, 1000 + step, step),
                ]
            tracking.log_metrics(c, rid, points)
            tracking.finish(c, rid, "FINISHED")
    tracking.finish(c, parent, "FINISHED")
