"""The TUI's launch is `dstui run`'s (dstui/usecases/launch.py): the same refusals, skips and preflight.

Each test launches one spec from both faces and compares what they did: the CLI
in a subprocess as a user runs it, the TUI under Pilot (Runs ``l``, Compose ctrl+r).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster_fixtures import slurm_cluster_fixture  # noqa: F401 - the `slurm_cluster` fixture
from helpers import HEAVY, IMPORTS_DEEPSPEED
from textual.widgets import Input, Static
from tui_helpers import confirm_launch, wait_for

from dstui.core.rundir import FINAL_STATES, BatchDir, list_batches
from dstui.tui.app import DstuiApp
from dstui.tui.screens.compose import ComposeScreen
from dstui.tui.screens.runs import RunsScreen

pytestmark = pytest.mark.anyio

LAMA = """name: lama
settings: {model: tiny-lama, steps: 3, warmup_steps: 1, dtype: fp32, torch_adam: true, gpus: 1}
conditions:
  - {name: z1, zero_stage: 1}
"""

# gpu_memory_gib 0.5: big-r0's forecast (0.8 GiB, analytic) and huge-r0's are over it; cmd-r0 is the
# user's own program (no forecast): never skipped. (A training run that fits would make the supervisor
# build DeepSpeed's CPU op first, minutes on a fresh box: the forecast's fit/over line is
# tests/unit/test_forecast.py's.)
OOM = """name: oomskip
settings: {model: tiny-llama, steps: 2, warmup_steps: 1, dtype: fp32, torch_adam: true, gpus: 1}
gpu_memory_gib: 0.5
skip_predicted_oom: true
conditions:
  - {name: cmd, kind: command, metrics_format: seed, command: ["{python}", "-c", "print('Epoch 1, Step 1, Loss: 1.0')"]}
  - {name: big, micro_batch: 64, seq_length: 512}
  - {name: huge, micro_batch: 128, seq_length: 512}
"""


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dstui", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)  # fmt: skip


def cli_refusal(spec: Path, env: dict[str, str] | None = None) -> str:
    """`dstui run SPEC`'s one error line, less 'dstui: error: ' and the spec's path (the TUI names the spec)."""
    proc = cli("run", str(spec), env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line, line
    return line.removeprefix("dstui: error: ").removeprefix(f"{spec}: ")


def refusals(app: DstuiApp) -> list[str]:
    return [n.message for n in app._notifications if n.title == "not launched"]


def spec_line(screen: RunsScreen) -> str:
    return str(screen.query_one("#spec-line", Static).render())


@IMPORTS_DEEPSPEED
async def test_an_unknown_model_is_refused_in_one_line_from_runs_and_compose(tui_env: Path) -> None:
    spec = tui_env / "lama.yaml"
    spec.write_text(LAMA)
    expected = cli_refusal(spec)
    assert "unknown model 'tiny-lama'" in expected and "presets: " in expected and "tiny-llama" in expected
    app = DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        runs = app.screen
        assert isinstance(runs, RunsScreen)
        await pilot.press("l")  # Runs: l
        assert await wait_for(pilot, lambda: refusals(app), timeout=120), [(n.title, n.message) for n in app._notifications]
        assert refusals(app) == [expected]  # the CLI's line, word for word, one line
        assert f"✗ not launched: {expected}" in spec_line(runs).replace("\n", " ")
        # Compose: the check marks the model field and says why, never "✓ DeepSpeed configs valid"
        await pilot.press("1")
        compose = app.screen
        assert isinstance(compose, ComposeScreen)
        dsv = compose.query_one("#dsvalid", Static)
        assert await wait_for(pilot, lambda: "✗" in str(dsv.render()), timeout=120), str(dsv.render())
        assert "unknown model 'tiny-lama'" in str(dsv.render()) and "✓" not in str(dsv.render())
        assert compose.query_one("#in-model", Input).has_class("-bad")
        assert "✗ model" in [str(w.content) for w in compose.query(".form-label.-bad")]
        app._notifications.clear()
        await pilot.press("ctrl+r")  # Compose: ctrl+r
        await pilot.pause(0.5)
        said = [n.message for n in app._notifications if n.severity == "error"]
        assert len(said) == 1 and "\n" not in said[0] and said[0].endswith(expected), said
    assert list_batches(tui_env / "runs") == []  # nothing launched, by either key


@IMPORTS_DEEPSPEED
@HEAVY
async def test_fixing_the_model_unmarks_the_field(tui_env: Path) -> None:
    spec = tui_env / "lama.yaml"
    spec.write_text(LAMA)
    app = DstuiApp(spec_path=spec, supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("1")
        compose = app.screen
        model = compose.query_one("#in-model", Input)
        assert await wait_for(pilot, lambda: model.has_class("-bad"), timeout=120)
        model.value = "tiny-llama"
        dsv = compose.query_one("#dsvalid", Static)
        assert await wait_for(pilot, lambda: "✓ DeepSpeed configs valid" in str(dsv.render()), timeout=120), str(dsv.render())
        assert not model.has_class("-bad") and compose.launch_blocker() is None
        assert not compose.query(".form-label.-bad")


def skipped_of(b: BatchDir) -> dict[str, str]:
    return {rd.name: str(rd.status().get("reason")) for rd in b.runs() if rd.state == "skipped"}


@pytest.mark.e2e  # real supervisors (and a command run) from both faces
@IMPORTS_DEEPSPEED
async def test_skip_predicted_oom_marks_the_same_runs_as_dstui_run(tui_env: Path) -> None:
    spec = tui_env / "oom.yaml"
    spec.write_text(OOM)
    proc = cli("run", str(spec), "--detach", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_cli = BatchDir(tui_env / "runs" / json.loads(proc.stdout)["batch"])
    cli_skipped = skipped_of(by_cli)
    assert sorted(cli_skipped) == ["big-r0", "huge-r0"], cli_skipped
    assert cli_skipped["big-r0"] == "skipped: predicted OOM (0.8 GiB > 0.5 GiB)"
    app = DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = app.screen
        await pilot.press("l")
        await confirm_launch(pilot)

        def launched() -> bool:
            return screen.batch is not None and screen.batch.id != by_cli.id

        assert await wait_for(pilot, launched, timeout=240), [(n.title, n.message) for n in app._notifications]
        by_tui = screen.batch
        assert skipped_of(by_tui) == cli_skipped  # the same runs, the same reason
        assert await wait_for(pilot, lambda: "skipped" in [str(c) for c in screen._rows.get("big-r0", ())], timeout=30)
        assert any("big-r0: skipped: predicted OOM" in n.message for n in app._notifications)
        for b in (by_cli, by_tui):  # the command run of each went on and ended
            assert await wait_for(pilot, lambda b=b: all(rd.state in FINAL_STATES for rd in b.runs()), timeout=240)
            assert b.info()["parallel"] == by_cli.info()["parallel"]  # the same default
            assert {rd.name: rd.state for rd in b.runs()}["cmd-r0"] == "done"


def slurm_spec(home: Path, partition: str | None = None) -> Path:
    data = {"name": "sl", "executor": "slurm", "settings": {"kind": "command", "metrics_format": "seed", "steps": 3, "warmup_steps": 1},
            "conditions": [{"name": "a", "command": ["{python}", "-c", "pass"]}]}  # fmt: skip
    if partition:
        data["slurm"] = {"partition": partition}
    path = home / "sl.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


async def launch_refused(app: DstuiApp) -> list[str]:
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("l")
        assert await wait_for(pilot, lambda: refusals(app), timeout=120), [(n.title, n.message) for n in app._notifications]
        return refusals(app)


async def test_a_slurm_spec_gets_the_cli_preflight_without_slurm(tui_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Slurm on PATH: `dstui run` and the TUI refuse with the same line, before any folder exists."""
    spec = slurm_spec(tui_env)
    bare = str(Path(sys.executable).parent)  # python is there; Slurm's tools are not
    expected = cli_refusal(spec, env={"PATH": bare})
    assert "Slurm is not installed here" in expected
    monkeypatch.setenv("PATH", bare)
    assert await launch_refused(DstuiApp(spec_path=spec, supervise=False)) == [expected]
    assert list_batches(tui_env / "runs") == []


@pytest.mark.e2e  # a real Slurm cluster (tests/cluster_fixtures.py)
@pytest.mark.xdist_group("slurm")
async def test_a_slurm_spec_gets_the_cli_preflight_on_a_cluster(tui_env: Path, slurm_cluster) -> None:  # noqa: ANN001
    """An unknown partition: Slurm's own answer, the same line from both faces; nothing submitted."""
    spec = slurm_spec(tui_env, partition="nope")
    expected = cli_refusal(spec)
    assert "unknown Slurm partition 'nope'" in expected
    before = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    assert await launch_refused(DstuiApp(spec_path=spec, supervise=False)) == [expected]
    after = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    assert after == before and list_batches(tui_env / "runs") == []


FLAKY = """name: halfway
settings: {kind: command, metrics_format: seed, steps: 3, warmup_steps: 1}
conditions:
  - {name: good, command: ["{python}", "-c", "print('Epoch 1, Step 1, Loss: 1.0')"]}
  - {name: bad, env: {FIXED: "FIXED_PATH"}, command: ["{python}", "-c",
     "import os, sys\\nif not os.path.exists(os.environ['FIXED']): sys.exit(3)\\nprint('Epoch 1, Step 1, Loss: 1.0')"]}
"""


@pytest.mark.e2e  # real supervisors
async def test_resume_from_the_runs_screen_is_dstui_run_resume(tui_env: Path) -> None:
    """R on a batch: its done run kept, its failed one run again (`dstui run SPEC --resume BATCH`)."""
    spec = tui_env / "halfway.yaml"
    spec.write_text(FLAKY.replace("FIXED_PATH", str(tui_env / "fixed")))
    proc = cli("run", str(spec), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # bad-r0 failed
    b = BatchDir(tui_env / "runs" / json.loads(proc.stdout)["batch"])
    assert {rd.name: rd.state for rd in b.runs()} == {"good-r0": "done", "bad-r0": "failed"}
    (tui_env / "fixed").write_text("")  # the cause of the failure, fixed
    app = DstuiApp(supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: screen.batch is not None and screen.batch.id == b.id)
        await pilot.press("R")
        await confirm_launch(pilot)
        assert await wait_for(pilot, lambda: any(n.message.startswith(f"resumed {b.id}") for n in app._notifications),
                              timeout=120), [(n.title, n.message) for n in app._notifications]  # fmt: skip
        said = next(n.message for n in app._notifications if n.message.startswith("resumed"))
        assert said == f"resumed {b.id}: 1 kept, 1 requeued, 0 new"
        assert await wait_for(pilot, lambda: b.info().get("finalized") and b.is_finished(), timeout=240)
    assert {rd.name: rd.state for rd in b.runs()} == {"good-r0": "done", "bad-r0": "done"}
    assert (b.path / "bad-r0" / "attempts" / "1").is_dir()  # the failed attempt kept
    assert list_batches(tui_env / "runs") == [b]  # the same batch, not a new one
