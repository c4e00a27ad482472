"""Runs that cannot work on a machine are named before launch; GPUs are shared across batches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstui.core.phases import live_text
from dstui.core.rundir import RunDir, merge_status, write_json_atomic
from dstui.execute import feasibility, gpu_ledger, gpu_share, live_phase
from dstui.execute.feasibility import Machine

CPU_BOX = Machine(gpus=0, cpu_cores=2)
GPU_BOX = Machine(gpus=2, gpu_memory=80 * 1024**3, bf16=True, cpu_cores=16)
OLD_GPU_BOX = Machine(gpus=8, gpu_memory=16 * 1024**3, bf16=False, cpu_cores=16)


@pytest.mark.parametrize(
    ("settings", "machine", "field"),
    [
        ({"deepcompile": True, "gpus": 1}, CPU_BOX, "deepcompile"),
        ({"gpus": 6}, CPU_BOX, "gpus"),
        ({"gpus": 6, "kind": "command"}, CPU_BOX, "gpus"),
        ({"gpus": 4}, GPU_BOX, "gpus"),
        ({"dtype": "fp16", "gpus": 1}, CPU_BOX, "dtype"),
        ({"dtype": "bf16", "gpus": 1}, OLD_GPU_BOX, "dtype"),
        ({"sequence_parallel": 2, "sp_mode": "deepcompile", "gpus": 2}, CPU_BOX, "sp_mode"),
        # what works
        ({"gpus": 2, "dtype": "bf16", "compile": True}, CPU_BOX, None),
        ({"deepcompile": True, "gpus": 2, "dtype": "bf16"}, GPU_BOX, None),
        ({"deepcompile": True, "kind": "command", "gpus": 1}, CPU_BOX, None),  # a user's program: its business
        ({"gpus": 8, "nodes": 2, "launcher": {"hostfile": "/h"}}, GPU_BOX, None),  # ranks on the hostfile's nodes
    ],
)
def test_what_a_machine_cannot_run(settings: dict, machine: Machine, field: str | None) -> None:
    found = feasibility.run_problem({"kind": "train", **settings}, machine)
    assert (found[0] if found else None) == field


def test_a_forecast_over_the_gpu_is_refused_unless_skipped() -> None:
    gib = 1024**3
    found = feasibility.run_problem({"gpus": 1}, GPU_BOX, forecast_bytes=90 * gib, capacity=80 * gib)
    assert found is not None and found[0] == "memory" and "90.0 GiB per GPU > 80.0 GiB" in found[2]
    assert feasibility.run_problem({"gpus": 1}, GPU_BOX, forecast_bytes=70 * gib, capacity=80 * gib) is None


def _spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "x.yaml"
    p.write_text(body)
    return p


def test_a_plan_is_refused_with_one_line_per_run(tmp_path: Path) -> None:
    from dstui.execute import batch

    spec = _spec(tmp_path, """
name: cannot
settings: {model: tiny-llama, steps: 4, warmup_steps: 1, dtype: fp32, torch_adam: true}
conditions:
  - {name: dc, deepcompile: true, gpus: 1}
  - {name: six, gpus: 6}
  - {name: fine, gpus: 1}
""")
    plan = batch.plan(spec, validate=False, resolve_revisions=False)
    with pytest.raises(feasibility.InfeasibleRuns) as e:
        feasibility.refuse_infeasible(plan, machine=CPU_BOX)
    lines = str(e.value).splitlines()
    assert "2 runs cannot work on this machine (no GPU, 2 CPU cores)" in lines[0]
    assert len(lines) == 3
    assert lines[1].endswith("run dc-r0: deepcompile=true: DeepCompile needs a CUDA GPU; this machine has none (compile: true works on the CPU)")
    assert f"{spec}: run six-r0: gpus=6:" in lines[2]
    # --force: the problems come back for the caller to print; nothing is raised
    assert [p.run for p in feasibility.refuse_infeasible(plan, machine=CPU_BOX, force=True)] == ["dc-r0", "six-r0"]


def test_other_batches_gpus_are_never_handed_out() -> None:
    s = {"gpus": 1}
    # alone: GPU 0
    assert gpu_share.choose(s, parallel=0, active=0, busy_slices=[], total_gpus=2) == (True, [0])
    # another batch holds GPU 0: this one gets GPU 1
    assert gpu_share.choose(s, parallel=0, active=0, busy_slices=[], total_gpus=2, elsewhere=[(0,)]) == (True, [1])
    # both held elsewhere: wait
    assert gpu_share.choose(s, parallel=0, active=0, busy_slices=[], total_gpus=2, elsewhere=[(0,), (1,)]) == (False, None)
    # a run that takes the whole box (one at a time) waits for every other batch
    assert gpu_share.choose(s, parallel=1, active=0, busy_slices=[], total_gpus=2, elsewhere=[(1,)]) == (False, None)
    # on a CPU box nothing is held elsewhere (ranks share the cores; the CLI warns instead)
    assert gpu_share.choose(s, parallel=0, active=0, busy_slices=[], total_gpus=0, elsewhere=[(0,)]) == (True, None)


def _run(tmp_path: Path, batch: str, name: str, **status) -> RunDir:
    rd = RunDir(tmp_path / batch / name)
    rd.path.mkdir(parents=True)
    write_json_atomic(rd.status_file, {"name": name, **status})
    return rd


def test_the_ledger_forgets_runs_that_ended_or_whose_processes_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu_ledger.LEDGER_ENV, str(tmp_path / "ledger"))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        live = _run(tmp_path, "a", "live", state="running", pgid=sleeper.pid)
        dead = _run(tmp_path, "a", "dead", state="running", pgid=2**22 + 7)  # no such process group
        done = _run(tmp_path, "a", "done", state="done", pgid=sleeper.pid)
        with gpu_ledger.opened() as ledger:
            for rd, gpus in ((live, [0]), (dead, [1]), (done, [1])):
                ledger.add(rd, gpus)
        with gpu_ledger.opened() as ledger:
            held = ledger.held_elsewhere(tmp_path / "b")
            assert [(h.run, h.gpus) for h in held] == [("live", (0,))]
            assert ledger.held_elsewhere(tmp_path / "a") == []  # a batch's own runs are gpu_share's business
            assert gpu_ledger.holders_text(held) == "batch a (GPU 0)"
    finally:
        sleeper.kill()
        sleeper.wait()
    with gpu_ledger.opened() as ledger:
        assert ledger.holders == []


@pytest.mark.skipif(shutil.which("ninja", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")) is None,
                    reason="ninja (a DeepSpeed dependency) is not installed")
def test_an_op_build_in_a_jobs_process_tree_is_named_while_it_runs(tmp_path: Path) -> None:
    """A JIT build is ninja in the op's folder: the phase says so while it builds, not afterwards."""
    ninja = shutil.which("ninja", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    op = tmp_path / "fused_thing"
    op.mkdir()
    (op / "build.ninja").write_text("rule slow\n  command = sleep 30\nbuild out: slow\n")
    job = subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.run([{ninja!r}], cwd={str(op)!r})"],
                           start_new_session=True)  # fmt: skip
    try:
        rd = _run(tmp_path, "b", "r", state="running", pid=job.pid, pgid=job.pid, started=time.time())
        phases = live_phase.LivePhases()
        deadline = time.time() + 30
        while (phase := phases.update(rd, {})) != "building op fused_thing" and time.time() < deadline:
            time.sleep(0.2)
        assert phase == "building op fused_thing"
        st = rd.status()
        assert st["phase"] == "building op fused_thing" and live_text(st).startswith("building op fused_thing ")
    finally:
        os.killpg(job.pid, 9)
        job.wait()
    # the runner's own marks name the phases of a bundled run
    write_json_atomic(rd.path / "phase.json", {"mark": "group_up", "time": time.time() - 3})
    rd.update_status(pid=None)
    assert phases.update(rd, {}) == "building model"
    assert live_text(rd.status(), now=rd.status()["phase_since"] + 3) == "building model 3s"
    write_json_atomic(rd.path / "phase.json", {"mark": "engine_ready", "time": time.time()})
    assert phases.update(rd, {"compile": True}) == "first step (compiling)"
    rd.update_status(steps_done=3)
    assert phases.update(rd, {}) == "training"
    merge_status(rd, dict(state="failed"))
    assert phases.update(rd, {}) is None and rd.status()["phase"] is None


def test_failures_are_announced_once_and_not_for_the_past(tmp_path: Path) -> None:
    from dstui.tui.home_snapshot import HomeReader

    runs = tmp_path / "runs"
    (runs / "b1").mkdir(parents=True)
    (runs / "b1" / "batch.json").write_text(json.dumps({"created": 1, "runs": ["old", "r1", "r2"]}))
    _run(runs, "b1", "old", state="failed", reason="exit code 1")
    r1 = _run(runs, "b1", "r1", state="running")
    r2 = _run(runs, "b1", "r2", state="running")
    reader = HomeReader(runs)  # the TUI's home worker: the alerts come with each snapshot
    assert reader.take().alerts == ()  # what failed before the TUI opened is in the table already
    merge_status(r1, dict(state="failed", reason="Python: RuntimeError: boom"))
    merge_status(r2, dict(state="killed", reason="cancelled"))
    alerts = reader.take().alerts
    assert [(a.run, a.title, a.text) for a in alerts] == [("r1", "run failed", "Python: RuntimeError: boom")]
    assert reader.take().alerts == ()  # once
    merge_status(r2, dict(state="running", reason=None, diverged={"message": "diverged at step 4 (Δ=3.1)"}))
    assert [(a.run, a.title) for a in reader.take().alerts] == [("r2", "live guard")]
