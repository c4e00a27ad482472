"""Pure units: metric records, seed lines, failure reasons, launch commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import HEAVY

from dstui.core import failures, secrets, shm
from dstui.core.records import Follower, metric_values, parse_json_line, parse_seed_line, seed_line
from dstui.core.rundir import RunDir, merge_status
from dstui.execute import launch
from dstui.spec.expand import expand
from dstui.spec.loading import parse_spec


def test_seed_line_round_trip() -> None:
    line = seed_line(1, 10, 2.345678, 0.123, 1234567890, 2345678901)
    assert line == (
        "Epoch 1, Step 10, Loss: 2.345678 sync: True time: 0.123000 "
        "alloc_mem: 1234567890 peak_mem: 2345678901"
    )
    rec = parse_seed_line("[rank0]: " + line)
    assert rec == {
        "type": "step", "epoch": 1, "step": 10, "loss": 2.345678,
        "iter_time": 0.123, "mem_alloc": 1234567890, "mem_peak": 2345678901,
        "from_seed_line": True,  # its step's repeats (another rank's copy) are left out: attempt_steps
    }  # fmt: skip
    assert parse_seed_line("Epoch 2, Step 3, Loss: 1.5")["loss"] == 1.5
    assert parse_seed_line("loss went down") is None


@pytest.mark.parametrize(
    "line",
    ['{"type": "step", "step": 1, "loss": 1.0', "garbage", '{"type": "other"}', '{"type": "step", "step": "x"}', "[1,2]"],
)
def test_garbled_json_lines_are_rejected(line: str) -> None:
    assert parse_json_line(line) is None


def test_metric_values_keeps_finite_numbers_only() -> None:
    rec = {"type": "step", "step": 3, "time": 1.0, "loss": 2.0, "mfu": float("nan"), "ok": True, "name": "x"}
    assert metric_values(rec) == {"loss": 2.0}


def test_follower_hands_out_complete_lines_only(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    f = Follower(p)
    assert f.read_lines() == []
    p.write_text('{"a": 1}\n{"b": ')
    assert [line for line, _ in f.read_lines()] == ['{"a": 1}']
    with open(p, "a") as fh:
        fh.write('2}\n')
    lines = f.read_lines()
    assert [line for line, _ in lines] == ['{"b": 2}']
    assert f.offset == p.stat().st_size
    # resume from a saved offset: nothing is handed out twice
    assert Follower(p, offset=f.offset).read_lines() == []


def test_follower_takes_the_unterminated_tail_once_the_writer_is_gone(tmp_path: Path) -> None:
    """A full disk can stop a writer between a record and its newline: the final read still takes that record."""
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 30}\n{"step": 31}')
    f = Follower(p)
    assert [line for line, _ in f.read_lines()] == ['{"step": 30}']
    assert f.read_lines() == []  # still writing, as far as anyone knows
    assert f.read_lines(final=True) == [('{"step": 31}', p.stat().st_size)]
    assert f.offset == p.stat().st_size and f.read_lines(final=True) == []
    # a tail beyond the read cap is not the file's end: only whole lines up to the cap
    p.write_text('{"step": 1}\n' + "x" * 64)
    assert [line for line, _ in Follower(p).read_lines(max_bytes=20, final=True)] == ['{"step": 1}']


@pytest.mark.parametrize(
    ("tail", "code", "expected"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", 1, "CUDA out of memory"),
        ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)", 1, "NCCL / process-group timeout"),
        ("ValueError: invalid literal for int() with base 10: '0a'", 1, "DeepSpeed op build failed"),
        ("Traceback (most recent call last):\n  File x\nKeyError: 'model'\n", 1, "Python: KeyError: 'model'"),
        ("", 3, "exit code 3"),
        ("", -9, "killed by SIGKILL"),
    ],
)
def test_failure_reasons(tail: str, code: int, expected: str) -> None:
    assert failures.classify(tail, code).startswith(expected)


def _run(settings: dict) -> tuple:
    (run,) = expand(parse_spec({"name": "l", "settings": settings}))
    return run, RunDir(Path("/tmp/runs/b") / run.name)


def test_single_node_train_argv_starts_ranks_directly() -> None:
    run, rd = _run({"zero_stage": 2, "gpus": 2, "micro_batch": 4})
    argv = launch.build_argv(run, rd, python="/py", port=29555)
    assert argv[1:3] == ["-m", "dstui.execute.injob.ranks"]
    assert argv[argv.index("--nproc") + 1] == "2" and argv[argv.index("--devices") + 1] == "0,1"
    assert argv[argv.index("--master-port") + 1] == "29555" == shm.master_port_of(argv)
    after = argv[argv.index("--") + 1 :]
    assert after[:2] == ["/py", str(launch.RUNNER_SCRIPTS["train"])]
    assert after[after.index("--zero-stage") + 1] == "2"
    sliced = launch.build_argv(run, rd, python="/py", port=1, gpu_slice=[2, 3])
    assert sliced[sliced.index("--devices") + 1] == "2,3"


def test_train_argv_uses_deepspeed_launcher_and_forwards_settings() -> None:
    run, rd = _run(
        {"zero_stage": 2, "gpus": 2, "deepcompile": True, "micro_batch": 4,
         "env": {launch.RANK_LAUNCHER_ENV: "deepspeed"}}
    )  # fmt: skip
    argv = launch.build_argv(run, rd, python="/py", port=29555)
    assert argv[:3] == ["/py", "-m", "deepspeed.launcher.runner"]
    assert argv[argv.index("--master_port") + 1] == "29555"
    assert argv[argv.index("--num_gpus") + 1] == "2"
    assert argv[argv.index("--zero-stage") + 1] == "2"
    assert argv[argv.index("--micro-batch") + 1] == "4"
    assert "--deepcompile" in argv and "--compile" not in argv
    assert argv[argv.index("--metrics-file") + 1] == str(rd.metrics_file)
    assert argv[argv.index("--ds-config") + 1] == str(rd.ds_config_file)
    assert argv.index("--num_gpus") < argv.index(str(launch.RUNNER_SCRIPTS["train"]))


def test_multinode_launcher_command() -> None:
    run, rd = _run(
        {"gpus": 8, "nodes": 2, "launcher": {"launcher": "pdsh", "hostfile": "/etc/hosts.ds", "master_addr": "node1"}}
    )
    argv = launch.build_argv(run, rd, port=29600)
    lo = argv[: argv.index(str(launch.RUNNER_SCRIPTS["train"]))]
    assert lo[3:] == [
        "--hostfile", "/etc/hosts.ds", "--launcher", "pdsh", "--master_addr", "node1",
        "--master_port", "29600", "--num_nodes", "2", "--num_gpus", "8",
    ]  # fmt: skip


def test_gpu_slice_pins_with_include() -> None:
    run, rd = _run({"gpus": 2, "env": {launch.RANK_LAUNCHER_ENV: "deepspeed"}})
    argv = launch.build_argv(run, rd, port=1, gpu_slice=[2, 3])
    assert argv[argv.index("--include") + 1] == "localhost:2,3"
    assert "--num_gpus" not in argv  # DeepSpeed refuses both together


def test_user_command_is_an_argv_never_a_shell(tmp_path: Path) -> None:
    evil = "x; touch " + str(tmp_path / "pwned")
    run, rd = _run({"kind": "command", "command": [sys.executable, "-c", "import sys; print(sys.argv[1])", evil]})
    argv = launch.build_argv(run, rd)
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.strip() == evil
    assert not (tmp_path / "pwned").exists()


def test_placeholders_are_filled_per_element() -> None:
    run, rd = _run({"kind": "command", "command": ["prog", "--out={metrics_file}", "{run_dir}"]})
    argv = launch.build_argv(run, rd)
    assert argv == ["prog", f"--out={rd.metrics_file}", str(rd.path)]


def test_secret_env_names() -> None:
    assert secrets.is_secret("HF_TOKEN") and secrets.is_secret("aws_secret_access_key")
    assert secrets.is_secret("DB_PASSWORD") and not secrets.is_secret("CUDA_VISIBLE_DEVICES")


def test_status_is_written_atomically(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "r")
    rd.path.mkdir()
    merge_status(rd, dict(state="queued", steps_total=5))
    merge_status(rd, dict(state="running"))
    data = json.loads(rd.status_file.read_text())
    assert data["state"] == "running" and data["steps_total"] == 5
    assert [p.name for p in rd.path.iterdir()] == ["status.json"]  # no temp files left


@HEAVY
def test_every_command_has_help() -> None:
    from dstui.cli import COMMANDS

    for name, (_, help_text) in COMMANDS.items():
        if help_text == "==SUPPRESS==":
            continue
        out = subprocess.run([sys.executable, "-m", "dstui", name, "--help"], capture_output=True, text=True)
        assert out.returncode == 0 and "usage: dstui " + name in out.stdout, (name, out.stderr)


def test_mlflow_ui_binds_to_loopback(tmp_path: Path) -> None:
    env = {**__import__("os").environ, "DSTUI_HOME": str(tmp_path)}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = subprocess.run([sys.executable, "-m", "dstui", "ui"], capture_output=True, text=True, env=env, check=True).stdout
    first = out.splitlines()[0]
    assert "--host 127.0.0.1" in first and f"sqlite:///{tmp_path}/mlruns/mlflow.db" in first
    assert "ssh -L 5000:127.0.0.1:5000" in out


def test_shm_buffers_of_a_run_are_found_by_port(tmp_path: Path) -> None:
    from dstui.core import shm

    for name in ("deepspeed_allreduce_buffer_0_127.0.0.1_29611_0", "deepspeed_allreduce_buffer_0_127.0.0.1_29611_1",
                 "deepspeed_allreduce_buffer_0_127.0.0.1_29612_0", "other_29611_0"):  # fmt: skip
        (tmp_path / name).write_bytes(b"x")
    assert shm.master_port_of(["python", "-m", "deepspeed.launcher.runner", "--master_port", "29611"]) == "29611"
    assert shm.master_port_of(["x", "--master_port=1234"]) == "1234" and shm.master_port_of(None) is None
    removed = shm.remove_buffers("29611", shm_dir=tmp_path)
    assert len(removed) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deepspeed_allreduce_buffer_0_127.0.0.1_29612_0", "other_29611_0"]


def test_master_ports_avoid_the_ephemeral_range_and_taken_ports() -> None:
    import random
    import socket

    low, _ = launch.ephemeral_range()
    ports = [launch.free_port() for _ in range(30)]
    assert len(set(ports)) == 30  # never the same port twice to runs started side by side
    assert all(max(low, 11024) - 10000 <= p < max(low, 11024) for p in ports)

    class Offers(random.Random):
        """Offers the given ports first, then random ones."""

        def __init__(self, *first: int) -> None:
            super().__init__(0)
            self.first = list(first)

        def randrange(self, *a: int) -> int:  # type: ignore[override]
            return self.first.pop(0) if self.first else super().randrange(*a)

    # a port someone listens on is skipped
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert launch.free_port(Offers(taken)) != taken
    # so is a port whose all-reduce buffers a dead DeepSpeed job left in /dev/shm
    if shm.SHM_DIR.is_dir():
        stale = max(low, 11024) - 7
        leftover = shm.SHM_DIR / f"{shm.PREFIX}0_127.0.0.1_{stale}_0"
        assert launch._bindable(stale)  # so only the leftover can make it skip this port
        leftover.write_bytes(b"")
        try:
            assert launch.free_port(Offers(stale)) != stale
        finally:
            leftover.unlink()


def test_sqlite_store_is_switched_to_write_ahead_log(tmp_path: Path) -> None:
    import sqlite3

    from dstui.tracking import client as tracking

    db = tmp_path / "store" / "mlflow.db"
    c = tracking.client(f"sqlite:///{db}")
    exp = tracking.ensure_experiment(c, "wal")
    rid = tracking.create_run(c, exp, "r", tags={"a": "b"})
    tracking.log_metrics(c, rid, [("loss", 1.5, 1000, 1), ("loss", 1.25, 2000, 2)])
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [m.value for m in c.get_metric_history(rid, "loss")] == [1.5, 1.25]


@HEAVY
def test_runs_are_found_by_tags_with_quotes_and_backslashes(tmp_path: Path) -> None:
    from dstui.tracking import client as tracking

    c = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = tracking.ensure_experiment(c, "find")
    values = ["/home/o'brien/runs/b/z1-r0#1", "C:\\runs\\z1", 'say "hi"', "plain"]
    ids = {v: tracking.create_run(c, exp, "r", tags={"dstui.run_dir": v, "dstui.role": "run"}) for v in values}
    for v, rid in ids.items():
        found = tracking.find_run(c, exp, {"dstui.run_dir": v, "dstui.role": "run"})
        assert found is not None and found.info.run_id == rid, v
    assert tracking.find_run(c, exp, {"dstui.run_dir": "nowhere"}) is None
    assert tracking.literal("""it's "both" """) is None
