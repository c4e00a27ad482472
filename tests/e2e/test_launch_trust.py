"""Launching that a user can trust: impossible runs refused before launch, GPUs shared across
batches, every phase and failure visible while it happens (issue 26, items 3-6)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import dstui

from dstui.core.rundir import FINAL_STATES, list_batches


def _spec(home: Path, name: str, body: str) -> Path:
    p = home / f"{name}.yaml"
    p.write_text(textwrap.dedent(body))
    return p


IMPOSSIBLE = """
    name: impossible
    settings: {{model: tiny-llama, steps: 3, warmup_steps: 1, dtype: fp32, torch_adam: true, seq_length: 32}}
    conditions:
      - {{name: dc, deepcompile: true, gpus: 1}}
      - {{name: six, kind: command, gpus: 6, metrics_format: seed, command: ["{{python}}", "-c", "for s in (1, 2, 3): print('Epoch 1, Step %d, Loss: 1.0' % s)"]}}
"""


def test_runs_that_cannot_work_here_are_refused_with_one_line_each_and_force_launches_them(home: Path) -> None:
    spec = _spec(home, "impossible", IMPOSSIBLE.format())
    for extra in (["--dry-run"], []):
        proc = dstui("run", str(spec), *extra, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if "run " in ln and ": " in ln and ln.startswith("  ")]
        assert len(lines) == 2, proc.stderr
        assert "run dc-r0: deepcompile=true: DeepCompile needs a CUDA GPU" in lines[0]
        assert "run six-r0: gpus=6: this machine has no GPU: 6 ranks would run as CPU processes" in lines[1]
        assert "--nproc" not in proc.stdout and "Traceback" not in proc.stderr
        assert list_batches(home / "runs") == []  # nothing laid out, nothing launched

    dry = dstui("run", str(spec), "--dry-run", "--force", timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "# dc-r0" in dry.stdout and "# six-r0" in dry.stdout
    assert "! --force: launching anyway:" in dry.stderr

    forced = dstui("run", str(spec), "--force", timeout=300)
    (b,) = list_batches(home / "runs")
    states = {rd.name: rd.status() for rd in b.runs()}
    assert states["six-r0"]["state"] == "done", states["six-r0"].get("reason")  # launched anyway: the user's call
    assert states["dc-r0"]["state"] == "failed" and "DeepCompile needs a CUDA device" in states["dc-r0"]["reason"]
    # the failure is said the moment it happens, not only in the final table
    assert "! FAILED dc-r0: " in forced.stdout
    assert forced.returncode == 1


SLEEPERS = """
    name: {name}
    settings: {{kind: command, gpus: 1, metrics_format: seed, steps: 2, warmup_steps: 1}}
    conditions:
      - {{name: a, command: ["{{python}}", "{program}", "{release}"]}}
      - {{name: b, command: ["{{python}}", "{program}", "{release}"]}}
"""


# what the program sees: only the GPU the supervisor gave it. It holds its GPU until the test
# releases it (at most 5 minutes): held for 2.5 s, the first batch's runs had ended under load
# 10-16 before the second batch's supervisor looked at the GPUs, and nothing waited (issue 39).
SLEEPER = """import os, sys, time
print('sees GPUs', os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)
give_up = time.time() + 300
while not os.path.exists(sys.argv[1]) and time.time() < give_up:
    time.sleep(0.1)
print('Epoch 1, Step 1, Loss: 1.0')
"""


def _wait_all_final(root: Path, n_batches: int, timeout: float = 240) -> list:
    deadline = time.time() + timeout
    while time.time() < deadline:
        batches = list_batches(root)
        if len(batches) == n_batches and all(b.info().get("finalized") for b in batches):
            return batches
        time.sleep(0.5)
    raise AssertionError(f"batches not finished: {[(b.id, [r.state for r in b.runs()]) for b in list_batches(root)]}")


def _wait(what: str, predicate, timeout: float = 300):  # noqa: ANN001, ANN202 - any predicate, its value
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _on_gpus(root: Path) -> bool:
    """Both runs of the first batch have started on their GPU (the sleeper says so first)."""
    runs = [rd for b in list_batches(root) for rd in b.runs()]
    return len(runs) == 2 and all(rd.log_file.exists() and "sees GPUs" in rd.log_file.read_text(errors="replace") for rd in runs)


def test_two_batches_never_hold_the_same_gpu_at_once(home: Path, tmp_path: Path) -> None:
    """A fake inventory of 2 GPUs (nothing here has one): two batches of two 1-GPU runs each."""
    env = {"DSTUI_GPU_COUNT": "2", "DSTUI_GPU_LEDGER": str(tmp_path / "ledger")}
    program, release = tmp_path / "sleeper.py", tmp_path / "release"
    program.write_text(SLEEPER)
    sleepers = {name: SLEEPERS.format(name=name, program=program, release=release) for name in ("first", "second")}
    first = dstui("run", str(_spec(home, "first", sleepers["first"])), "--detach", env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    _wait("both runs of the first batch on a GPU", lambda: _on_gpus(home / "runs"))  # so the second is the one that waits
    second = dstui("run", str(_spec(home, "second", sleepers["second"])), "--detach", env=env, timeout=120)
    assert second.returncode == 0, second.stderr
    waited = _wait("the second batch to say what it waits for", lambda: [
        rd.status().get("phase") for b in list_batches(home / "runs") for rd in b.runs()
        if "waiting for GPUs" in (rd.status().get("phase") or "")
    ])  # fmt: skip
    release.touch()
    batches = _wait_all_final(home / "runs", 2)
    held = []
    for b in batches:
        for rd in b.runs():
            st = rd.status()
            assert st["state"] == "done", (rd.name, st.get("reason"))
            assert f"sees GPUs {st['gpu_slice'][0]}" in rd.log_file.read_text()
            held.append((b.id, rd.name, set(st["gpu_slice"]), st["started"], json.loads(rd.exit_file.read_text())["ended"]))
    clashes = [(x[:2], y[:2]) for x in held for y in held
               if x[0] != y[0] and x[2] & y[2] and x[3] < y[4] and y[3] < x[4]]  # fmt: skip
    assert clashes == [], held
    assert waited and waited[0].startswith("waiting for GPUs held by batch first-"), waited


BUILDS_AN_OP = """
    name: builds
    settings: {{kind: command, gpus: 1, metrics_format: seed, steps: 2, warmup_steps: 1}}
    conditions:
      - name: r
        command:
          - "{{python}}"
          - "-c"
          - |
            import os, subprocess, sys
            op = os.path.join(os.getcwd(), "fake_shm_op")
            os.makedirs(op, exist_ok=True)
            # the build lasts until dstui has named it as the run's phase, then 3 s more (so that
            # `dstui run`, polling, prints it), at most 90 s: a busy machine cannot outrun the check
            wait = os.path.join(op, "wait.py")
            open(wait, "w").write(
                "import json, os, time\\n"
                "st = os.path.join(os.environ['DSTUI_RUN_DIR'], 'status.json')\\n"
                "end = time.time() + 90\\n"
                "while time.time() < end and 'building op' not in (json.load(open(st)).get('phase') or ''):\\n"
                "    time.sleep(0.1)\\n"
                "time.sleep(3)\\n")
            open(os.path.join(op, "build.ninja"), "w").write(
                f"rule slow\\n  command = {{sys.executable}} {{wait}}\\nbuild out: slow\\n")
            subprocess.run([{ninja!r}], cwd=op, check=True)
            print("Epoch 1, Step 1, Loss: 2.0", flush=True)
            raise SystemExit("mytrainer: error: the data ran out")
"""


def test_an_op_build_is_named_while_it_builds_and_a_failure_is_said_at_once(home: Path) -> None:
    ninja = shutil.which("ninja", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if ninja is None:
        pytest.skip("ninja (a DeepSpeed dependency) is not installed")
    proc = dstui("run", str(_spec(home, "builds", BUILDS_AN_OP.format(ninja=ninja))), timeout=300)
    out = proc.stdout
    assert "building op fake_shm_op" in out, out
    assert "! FAILED r-r0: mytrainer: error: the data ran out" in out, out
    assert proc.returncode == 1
    (b,) = list_batches(home / "runs")
    assert all(rd.state in FINAL_STATES for rd in b.runs())
