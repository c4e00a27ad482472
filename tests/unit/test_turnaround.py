"""Turnaround pieces without DeepSpeed: the rank starter, GPU sharing, the time breakdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from dstui.core import phases
from dstui.core.records import PHASES, SUMMARY, MetricsWriter
from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic
from dstui.execute import gpu_share

DUMP = Path(__file__).resolve().parent.parent / "programs" / "dump_rank_env.py"


def _ranks(tmp_path: Path, *args: str, script: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "DUMP_DIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "dstui.execute.injob.ranks", *args, "--", sys.executable, *script],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip


def test_ranks_get_the_launcher_environment(tmp_path: Path) -> None:
    out = _ranks(tmp_path, "--nproc", "2", "--master-port", "29123", "--devices", "4,5",
                 script=[str(DUMP), "--steps", "3"])  # fmt: skip
    assert out.returncode == 0, out.stderr
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["argv"] == [f"--local_rank={rank}", "--steps", "3"]
        env = seen["env"]
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank))
        assert (env["WORLD_SIZE"], env["LOCAL_SIZE"]) == ("2", "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29123")
        assert (env["CROSS_RANK"], env["CROSS_SIZE"]) == ("0", "1")
        assert env["CUDA_VISIBLE_DEVICES"] == "4,5"


def test_a_failing_rank_stops_the_others_and_sets_the_status(tmp_path: Path) -> None:
    script = tmp_path / "r.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "time.sleep(120)\n"
    )
    out = _ranks(tmp_path, "--nproc", "2", "--master-port", "1", script=[str(script)])
    assert out.returncode == 128 + 11  # like a shell, not DeepSpeed's 245
    assert "rank 1 failed (SIGSEGV)" in out.stdout


@pytest.mark.parametrize(
    ("parallel", "total", "active", "busy", "settings", "expected"),
    [
        (gpu_share.AUTO, 8, 0, [], {"gpus": 2}, (True, [0, 1])),
        (gpu_share.AUTO, 8, 3, [[0, 1], [2, 3], [4, 5]], {"gpus": 2}, (True, [6, 7])),
        (gpu_share.AUTO, 8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]], {"gpus": 2}, (False, None)),
        (gpu_share.AUTO, 4, 1, [[0, 1]], {"gpus": 4}, (False, None)),  # waits for the box
        (gpu_share.AUTO, 2, 0, [], {"gpus": 4}, (True, None)),  # too big: DeepSpeed says why
        (gpu_share.AUTO, 0, 0, [], {"gpus": 2}, (True, None)),  # CPU: one at a time
        (gpu_share.AUTO, 0, 1, [None], {"gpus": 2}, (False, None)),
        (gpu_share.AUTO, 8, 1, [[0, 1]], {"gpus": 2, "nodes": 2}, (False, None)),  # multi-node
        (gpu_share.AUTO, 8, 0, [], {"gpus": 2, "launcher": {"include": "localhost:4,5"}}, (True, None)),
        (1, 8, 0, [], {"gpus": 2}, (True, None)),  # explicit one-at-a-time: as before
        (1, 8, 1, [None], {"gpus": 2}, (False, None)),
        (2, 8, 1, [[0, 1]], {"gpus": 2}, (True, [2, 3])),
        (2, 8, 2, [[0, 1], [2, 3]], {"gpus": 2}, (False, None)),
    ],
)
def test_gpu_sharing(parallel, total, active, busy, settings, expected) -> None:  # noqa: ANN001
    got = gpu_share.choose(settings, parallel=parallel, active=active, busy_slices=busy, total_gpus=total)
    assert got == expected


def test_fake_gpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from dstui.execute import sysmetrics

    monkeypatch.setenv(sysmetrics.GPU_COUNT_ENV, "8")
    assert sysmetrics.gpu_count() == 8


def _run_folder(tmp_path: Path, marks: dict[str, float], summary: dict, started: float, ended: float) -> RunDir:
    rd = RunDir(tmp_path / "z0-r0")
    rd.path.mkdir()
    w = MetricsWriter(rd.metrics_file)
    w.write(SUMMARY, **summary)
    w.write(PHASES, **marks)
    w.close()
    rd.update_status(started=started, ended=ended + 5.0)
    write_json_atomic(rd.exit_file, {"exit_code": 0, "ended": ended})
    return rd


def test_breakdown_adds_up_to_the_wall_time(tmp_path: Path) -> None:
    t0 = 1000.0
    marks = {"process_start": t0 + 2, "imports_done": t0 + 6, "group_up": t0 + 7, "model_built": t0 + 8,
             "engine_ready": t0 + 10, "first_step_done": t0 + 13, "last_step_done": t0 + 17, "exit": t0 + 18}  # fmt: skip
    rd = _run_folder(tmp_path, marks, {"compile_time": 2.5, "step_time_sum": 6.0}, t0, t0 + 19)
    b = phases.of_run(rd)
    assert b is not None
    assert (b.launch, b.imports, b.init, b.compile, b.steps, b.teardown) == (2.0, 4.0, 4.0, 2.5, 4.5, 2.0)
    assert b.wall == 19.0  # the wrapper's exit time, not the supervisor's later notice
    assert sum(getattr(b, s) for s in phases.SEGMENTS) == pytest.approx(b.wall)
    assert b.step_share == pytest.approx(6.0 / 19.0)
    assert "launch 2.0" in b.line() and "(optimizer steps 32% of wall, compile included)" in b.line()
    stored = phases.from_status({"phases": b.as_dict()})
    assert stored == b
    st = [{"started": t0, "ended": t0 + 19, "phases": b.as_dict()},
          {"started": t0 + 1, "ended": t0 + 39, "phases": b.as_dict()}]  # fmt: skip
    # each run ends at start + its wall (t0+19, t0+20), not when the supervisor noticed (t0+39)
    assert phases.batch_step_share(st) == pytest.approx((12.0 / 20.0, 12.0, 20.0))


def test_breakdown_of_a_run_that_died_in_init(tmp_path: Path) -> None:
    t0 = 50.0
    rd = _run_folder(tmp_path, {"process_start": t0 + 1, "imports_done": t0 + 3, "exit": t0 + 4}, {}, t0, t0 + 5)
    b = phases.of_run(rd)
    assert b is not None and b.launch == 1.0 and b.imports == 2.0
    assert b.init is None and b.steps is None and b.teardown is None and b.step_share is None


@pytest.mark.parametrize(
    ("settings", "on_gpu", "expected"),
    [
        # on the CPU, DeepSpeed's backend would build its shared-memory all-reduce at init_distributed;
        # the runners leave it out where no step uses it (dstui/core/shm.py), so nothing waits for it
        ({"torch_adam": True}, False, set()),
        ({}, True, {"FusedAdamBuilder"}),
        ({"zero_stage": 3, "offload": "cpu"}, True, {"CPUAdamBuilder"}),
        ({"zero_stage": 3, "offload": "cpu"}, False, {"CPUAdamBuilder"}),
        ({"deepcompile": True, "torch_adam": True}, True, {"DeepCompileBuilder"}),
        ({"deepcompile": True}, False, set()),  # DeepCompile itself is refused on CPU
        ({"kind": "command"}, True, set()),
        # AutoTP's LinearAllreduce uses it, and DSTUI_CPU_SHM_OP=1 asks for DeepSpeed's own default:
        # then it is built before the first run, so the wait is named ("building op ShareMemComm") and untimed
        ({"torch_adam": True, "ds_overrides": {"tensor_parallel": {"autotp_size": 2}}}, False, {"ShareMemCommBuilder"}),
        ({"torch_adam": True, "env": {"DSTUI_CPU_SHM_OP": "1"}}, False, {"ShareMemCommBuilder"}),
        ({"torch_adam": True, "ds_overrides": {"tensor_parallel": {"autotp_size": 2}}}, True, set()),
    ],
)
def test_ops_a_run_needs_built_before_the_batch(settings, on_gpu, expected, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from dstui.execute import prebuild

    monkeypatch.delenv("DSTUI_CPU_SHM_OP", raising=False)
    assert prebuild.ops_needed(settings, on_gpu=on_gpu) == expected


def test_prebuild_plan_groups_ops_by_python_and_op_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dstui.execute import batch, prebuild

    # a user's own cache dirs win; this checks dstui's default (other tests import runners that set them)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)

    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nsettings: {gpus: 2, steps: 3, warmup_steps: 1}\n"
                    "conditions:\n  - {name: a, zero_stage: 1}\n  - {name: b, zero_stage: 3, offload: cpu}\n"
                    "  - {name: c, torch_adam: true}\n")  # fmt: skip
    b = batch.create(batch.plan(spec, validate=False, progress=lambda _: None), runs_root=tmp_path / "runs")
    groups = prebuild.plan(b, on_gpu=True)
    assert len(groups) == 1
    ((python, _cache), (env, ops)) = next(iter(groups.items()))
    assert python == sys.executable and ops == {"FusedAdamBuilder", "CPUAdamBuilder"}
    assert env["TORCHINDUCTOR_CACHE_DIR"].endswith("inductor")


def test_status_shows_gpus_time_and_step_share(tmp_path: Path) -> None:
    from dstui.commands.status import time_lines

    live = RunDir(tmp_path / "z1-r0")
    live.path.mkdir()
    merge_status(live, dict(state="running", gpu_slice=[2, 3], started=10.0))
    t0 = 1000.0
    marks = {"process_start": t0 + 1, "imports_done": t0 + 2, "engine_ready": t0 + 3, "last_step_done": t0 + 8}
    done = _run_folder(tmp_path, marks, {"compile_time": 1.0, "step_time_sum": 3.0}, t0, t0 + 10)
    done.update_status(phases=phases.of_run(done).as_dict())
    lines = time_lines([done, live])
    assert "  gpus  z1-r0: 2,3" in lines
    assert any(line.startswith("  time  z0-r0: 10.0 s: launch 1.0") for line in lines)
    assert lines[-1] == "  step share 30%: 3.0 s of optimizer steps in 10.0 s of wall time"


def test_phase_chart_and_table_from_mlflow_metrics(tmp_path: Path) -> None:
    from dstui.analysis.phases import batch_step_share, time_table
    from dstui.analysis.rundata import RunData
    from dstui.report.phases_chart import phase_bars

    def run(name: str, start_ms: int, wall: float, steps: float) -> RunData:
        metrics = {"time/launch": 1.0, "time/imports": 2.0, "time/init": 3.0, "time/compile": 0.5,
                   "time/steps": wall - 7.0, "time/teardown": 0.5, "time/wall": wall,
                   "time/step_share": steps / wall, "time/step_time_sum": steps}  # fmt: skip
        return RunData(run_id=name, run_name=name, experiment_id="1", condition=name, revision="installed",
                       repeat=0, kind="train", status="done", reason="", mlflow_status="FINISHED",
                       start_time=start_ms, params={}, tags={}, metrics=metrics)  # fmt: skip

    runs = [run("z0-r0", 0, 10.0, 2.0), run("z3-r0", 10_000, 20.0, 6.0)]
    table = time_table(runs)
    assert list(table.index) == ["z0-r0", "z3-r0"] and table.loc["z3-r0", "steps"] == 13.0
    assert batch_step_share(runs) == pytest.approx((8.0 / 30.0, 8.0, 30.0))
    png = phase_bars(table, tmp_path / "phases.png")
    assert png.stat().st_size > 1000


def test_prebuild_starts_no_process_for_ops_built_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second batch finds the remembered .so files and spends no DeepSpeed import on them.

    The op build itself is replaced by a script that prints what runners/prebuild_ops.py prints
    (building a real op needs a GPU or minutes of C++ here); everything around it is dstui's.
    """
    import logging

    from dstui.execute import batch, prebuild

    monkeypatch.setenv("DSTUI_CACHE", str(tmp_path / "cache"))
    so = tmp_path / "ext" / "cpu_adam" / "cpu_adam.so"
    starts = tmp_path / "starts.txt"
    fake = tmp_path / "fake_build.py"
    seen = tmp_path / "phase_seen.txt"
    fake.write_text(
        "import json, pathlib, sys, time\n"
        # what the waiting run's status says while this build runs (dstui sets it once the builds started)
        "for _ in range(100):\n"
        "    phase = json.loads(pathlib.Path('b-r0/status.json').read_text()).get('phase')\n"
        "    if phase: break\n"
        "    time.sleep(0.05)\n"
        f"pathlib.Path({str(seen)!r}).write_text(str(phase))\n"
        f"pathlib.Path({str(starts)!r}).open('a').write(sys.argv[1] + '\\n')\n"
        f"so = pathlib.Path({str(so)!r}); so.parent.mkdir(parents=True, exist_ok=True); so.write_bytes(b'')\n"
        "print('prebuild: ' + sys.argv[1] + ': ready in 0.0 s')\n"
        "print('prebuild-so: ' + sys.argv[1] + ' ' + str(so))\n"
    )
    monkeypatch.setattr(prebuild, "PREBUILD_SCRIPT", fake)
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nsettings: {gpus: 2, steps: 3, warmup_steps: 1}\n"
                    "conditions:\n  - {name: b, zero_stage: 3, offload: cpu}\n")  # fmt: skip
    log = logging.getLogger("test-prebuild")

    def one_batch() -> BatchDir:
        b = batch.create(batch.plan(spec, validate=False, progress=lambda _: None), runs_root=tmp_path / "runs")
        prebuild.before_first_run(b, on_gpu=True, log=log)
        return b

    first = one_batch()
    assert starts.read_text().split() == ["CPUAdamBuilder"]
    # the build's own output went where the log pane and `dstui status` look: the waiting run's log
    rd = first.runs()[0]
    assert "prebuild: CPUAdamBuilder: ready" in rd.log_file.read_text()
    assert seen.read_text() == "building op CPUAdam"  # while it built ...
    assert rd.status().get("phase") is None  # ... cleared after
    one_batch()  # remembered and present: no process
    assert starts.read_text().split() == ["CPUAdamBuilder"]
    so.unlink()  # gone (a cleaned cache): built again
    one_batch()
    assert starts.read_text().split() == ["CPUAdamBuilder", "CPUAdamBuilder"]


def test_status_names_the_compile_caches_answers(tmp_path: Path) -> None:
    from dstui.commands.status import time_lines

    counts = {
        "compile_cache_fxgraph_hit": 1,
        "compile_cache_fxgraph_miss": 1,
        "compile_cache_autograd_miss": 2,
    }
    assert phases.compile_cache_line(counts) == "Inductor graphs 1 hit, 1 miss; AOTAutograd 2 miss"
    assert (
        phases.compile_cache_line({"compile_time": 3.0}) is None
        and phases.compile_cache_line(None) is None
    )
    rd = RunDir(tmp_path / "z1-dc-r0")
    rd.path.mkdir()
    merge_status(rd, dict(state="done", summary={"steps": 3, **counts}))
    assert "  cache z1-dc-r0: Inductor graphs 1 hit, 1 miss; AOTAutograd 2 miss" in time_lines([rd])


COMPILE_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import common
f = torch.compile(lambda x: (x * 2 + 1).relu().sum())
f(torch.randn(8))  # one graph, no backward: half the C++ compile of a training step
print(json.dumps(common.compile_cache_counts()))
"""


@pytest.mark.e2e
def test_a_repeat_finds_the_first_compile_in_the_cache_and_the_counts_say_so(
    tmp_path: Path,
) -> None:
    """Two real processes with one Inductor cache folder (as dstui gives runs): a miss, then a hit."""
    from dstui.execute.launch import compile_cache_dirs

    env = {
        **os.environ,
        **{k: str(tmp_path / Path(v).name) for k, v in compile_cache_dirs(None).items()},
    }
    seen = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", COMPILE_PROBE, str(REPO / "runners")], env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        seen.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert (
        seen[0].get("compile_cache_fxgraph_miss", 0) >= 1
        and "compile_cache_fxgraph_hit" not in seen[0]
    )
    assert (
        seen[1].get("compile_cache_fxgraph_hit", 0) >= 1
        and "compile_cache_fxgraph_miss" not in seen[1]
    )
    with_nothing = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import json, common; "
                                   "print(json.dumps(common.compile_cache_counts()))", str(REPO / "runners")],
                                  capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(with_nothing.stdout) == {}  # no torch.compile in the process: no counts
