"""What a run's job can do to dstui (issue 40, items 1 and 2), with real processes and a real store.

1. A recorded process-group number that the kernel handed to an unrelated process
   (a reboot, or ``kill -9`` of supervisor and job, then PID reuse): takeover, the
   "hung" check and ``dstui cancel`` never signal it. A helper the job starts in a
   session of its own is ended by ``dstui cancel`` and at the job's end.
2. A job that swaps its files for links to /dev/zero or a FIFO: the supervisor stays
   small, the batch finalizes, the other runs are untouched; a planted ``attempts``
   link never makes ``dstui retry`` move files outside the run folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO, dstui, first_batch, mlflow_client, wait_until

from dstui.core import proc_identity
from dstui.core.rundir import BatchDir, RunDir

pytestmark = pytest.mark.e2e

HOSTILE = str(REPO / "tests" / "programs" / "hostile_job.py")
FAKE = str(REPO / "tests" / "programs" / "fake_runner.py")
RSS_BOUND = 1 << 30  # bytes: the supervisor's peak while a job feeds it /dev/zero (normal: ~0.2-0.3 GiB)


def write_spec(home: Path, name: str, conditions: list[dict], **settings) -> Path:
    data = {
        "name": name,
        "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 3, "warmup_steps": 0, **settings},
        "conditions": conditions,
    }
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def hostile(name: str, *args: str, **fields) -> dict:
    return {"name": name, "command": [sys.executable, HOSTILE, *args], **fields}


def wait_for(pred, timeout: float = 180, every: float = 0.2, what: str = "condition"):  # noqa: ANN001, ANN201
    return wait_until(pred, timeout, every, what)


def the_batch(home: Path) -> BatchDir:
    return first_batch(home)  # type: ignore[return-value]


def run_named(b: BatchDir, name: str) -> RunDir:
    return wait_for(lambda: next((r for r in b.runs() if r.name.startswith(name)), None), what=f"run {name}")


def supervisor_pid(b: BatchDir) -> int:
    return int(b.lock_file.read_text().split()[1])


def alive(pid: int) -> bool:
    return proc_identity.state_of(pid) not in (None, "Z")


class PeakRss:
    """The peak resident memory of a process we did not start, read from /proc while it lives (VmHWM)."""

    def __init__(self) -> None:
        self.peak: dict[int, int] = {}

    def sample(self, pid: int) -> None:
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                self.peak[pid] = max(self.peak.get(pid, 0), int(line.split()[1]) * 1024)

    def watch_until(self, b: BatchDir, done, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if b.lock_file.exists():
                with contextlib.suppress(ValueError, IndexError, OSError):  # between two holders
                    self.sample(supervisor_pid(b))
            if done():
                return
            time.sleep(0.05)
        raise AssertionError("timed out waiting for the batch to finalize")


# ---- 1. a process is its number and its start ------------------------------------------------


def test_a_reused_pid_is_never_signalled_by_cancel_takeover_or_the_hung_check(home: Path) -> None:
    """`--detach`, hung_after_s: 20; kill -9 of the supervisor and the run's group (no exit.json); the
    recorded number then belongs to an unrelated `setsid sleep` (status.json made to point at it,
    with the dead job's start time): `dstui cancel` and the `dstui status` takeover leave it alone."""
    spec = write_spec(home, "reuse", [{"name": "long", "command": [sys.executable, FAKE, "--metrics-file", "{metrics_file}",
                                                                    "--steps", "400", "--interval", "0.5"]}],
                      steps=400, hung_after_s=20)  # fmt: skip
    dstui("run", "--detach", str(spec), check=True)
    b = the_batch(home)
    rd = run_named(b, "long")
    wait_for(lambda: rd.state == "running" and (rd.status().get("steps_done") or 0) >= 2, what="running")
    st = rd.status()
    assert isinstance(st.get("pid_start"), int) and st.get("boot_id") == proc_identity.boot_id() and st.get("job_token")
    os.kill(supervisor_pid(b), signal.SIGKILL)
    os.killpg(st["pgid"], signal.SIGKILL)  # the job and its wrapper: nobody writes exit.json
    wait_for(lambda: not alive(st["pid"]), what="job gone")
    stranger = subprocess.Popen(["sleep", "3000"], start_new_session=True)  # an unrelated session leader
    try:
        # the kernel handing the number over, forced: the status names the stranger's pid and group
        doc = json.loads(rd.status_file.read_text())
        doc.update(pid=stranger.pid, pgid=stranger.pid)  # pid_start stays the dead job's: it does not match
        rd.status_file.write_text(json.dumps(doc))
        old = time.time() - 120  # quiet for longer than hung_after_s: "hung", were it the job
        for f in (rd.log_file, rd.metrics_file):
            os.utime(f, (old, old))
        assert dstui("cancel", f"{b.id}/{rd.name}").returncode == 0
        time.sleep(1.0)
        assert stranger.poll() is None, "dstui cancel killed a process that only had the job's old number"
        out = dstui("status")
        assert out.returncode in (0, 1), out.stdout + out.stderr
        wait_for(lambda: b.info().get("finalized"), what="batch finalized by the takeover")
        time.sleep(1.0)
        assert stranger.poll() is None, "the takeover killed a process that only had the job's old number"
        final = rd.status()
        assert final["state"] == "killed" and final["reason"] == "cancelled", final
        assert "hung" not in (final.get("reason") or "") and not final.get("hung")
        assert "killing it" not in b.log_file.read_text()
    finally:
        stranger.kill()
        stranger.wait()


def test_the_hung_check_leaves_a_stranger_with_the_jobs_number_alone(home: Path) -> None:
    """The same reuse without a cancel: the takeover's hung verdict must not fire at the stranger."""
    spec = write_spec(home, "reuse2", [{"name": "long", "command": [sys.executable, FAKE, "--metrics-file", "{metrics_file}",
                                                                     "--steps", "400", "--interval", "0.5"]}],
                      steps=400, hung_after_s=20)  # fmt: skip
    dstui("run", "--detach", str(spec), check=True)
    b = the_batch(home)
    rd = run_named(b, "long")
    wait_for(lambda: rd.state == "running" and (rd.status().get("steps_done") or 0) >= 2, what="running")
    st = rd.status()
    os.kill(supervisor_pid(b), signal.SIGKILL)
    os.killpg(st["pgid"], signal.SIGKILL)
    wait_for(lambda: not alive(st["pid"]), what="job gone")
    stranger = subprocess.Popen(["sleep", "3000"], start_new_session=True)
    try:
        doc = json.loads(rd.status_file.read_text())
        doc.update(pid=stranger.pid, pgid=stranger.pid)
        rd.status_file.write_text(json.dumps(doc))
        old = time.time() - 120
        for f in (rd.log_file, rd.metrics_file):
            os.utime(f, (old, old))
        dstui("status")
        wait_for(lambda: b.info().get("finalized"), what="batch finalized by the takeover")
        assert stranger.poll() is None, "the takeover's hung check killed a stranger"
        final = rd.status()
        assert final["state"] == "failed" and not final.get("hung"), final
        assert "hung" not in final["reason"]
    finally:
        stranger.kill()
        stranger.wait()


def test_cancel_ends_a_helper_that_left_the_jobs_session(home: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    spec = write_spec(home, "helper", [hostile("h", "--helper", str(pidfile), "--steps", "600", "--interval", "0.2")], steps=600)
    dstui("run", "--detach", str(spec), check=True)
    b = the_batch(home)
    rd = run_named(b, "h")
    helper = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="helper started"))
    wait_for(lambda: rd.state == "running", what="running")
    assert os.getsid(helper) != rd.status()["pgid"]  # a session of its own: the group signal misses it
    asked = time.time()
    assert dstui("cancel", f"{b.id}/{rd.name}").returncode == 0
    wait_for(lambda: not alive(helper), timeout=30, what="the helper ended by cancel")
    print(f"\nhelper in its own session ended {time.time() - asked:.1f} s after `dstui cancel` was called")
    wait_for(lambda: b.info().get("finalized"), what="batch finalized")
    assert rd.state == "killed"


def test_a_helper_left_behind_is_ended_with_its_job(home: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    spec = write_spec(home, "leftover", [hostile("h", "--helper", str(pidfile), "--steps", "3")])
    assert dstui("run", str(spec), timeout=300).returncode == 0
    helper = int(pidfile.read_text())
    wait_for(lambda: not alive(helper), timeout=30, what="the helper ended after its job")


# ---- 2. a run folder is untrusted ---------------------------------------------------------------


def test_metrics_swapped_for_dev_zero_keeps_the_supervisor_small_and_the_batch_ends(home: Path) -> None:
    plan = json.dumps([{"file": "metrics.jsonl", "as": "zero_link"}, {"file": "stdout.log", "as": "zero_link"}])
    spec = write_spec(home, "zero", [hostile("z", "--steps", "5", "--wait-ingested", "5", "--plan", plan)], steps=5)
    dstui("run", "--detach", str(spec), check=True)
    b = the_batch(home)
    rss = PeakRss()
    rss.watch_until(b, lambda: b.info().get("finalized"))
    rd = run_named(b, "z")
    st = rd.status()
    assert st["state"] == "done" and st["steps_done"] == 5
    assert "metrics.jsonl is a symbolic link (to /dev/zero): not read" in st["file_problems"].values()
    assert rss.peak and max(rss.peak.values()) < RSS_BOUND, rss.peak
    client = mlflow_client()
    run = client.get_run(st["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5]
    assert "/dev/zero" in run.data.tags["dstui.file_problems"]
    parent = client.get_run(b.info()["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"
    print(f"\nsupervisor peak RSS with metrics.jsonl -> /dev/zero: {max(rss.peak.values()) / 2**20:.0f} MiB")


def test_a_fifo_in_one_run_never_holds_up_another(home: Path, tmp_path: Path) -> None:
    plan = json.dumps([{"file": "metrics.jsonl", "as": "fifo_link"}, {"file": "stdout.log", "as": "fifo"}])
    spec = write_spec(
        home, "fifo",
        [hostile("f", "--steps", "2", "--wait-ingested", "2", "--plan", plan, "--scratch", str(tmp_path)),
         {"name": "ok", "command": [sys.executable, FAKE, "--metrics-file", "{metrics_file}", "--steps", "30",
                                    "--interval", "0.1"]}],
        steps=30,
    )  # fmt: skip
    proc = dstui("run", str(spec), "--parallel", "2", timeout=300)
    b = the_batch(home)
    assert b.info().get("finalized"), proc.stdout + proc.stderr
    ok, f = run_named(b, "ok"), run_named(b, "f")
    assert ok.state == "done" and ok.status()["steps_done"] == 30
    client = mlflow_client()
    assert [m.step for m in client.get_metric_history(ok.status()["mlflow_run_id"], "loss")] == list(range(1, 31))
    problems = f.status()["file_problems"]
    assert any(why.startswith("metrics.jsonl is a symbolic link (to ") for why in problems.values()), problems
    assert client.get_run(f.status()["mlflow_run_id"]).info.status != "RUNNING"


def test_retry_moves_nothing_through_a_planted_attempts_link(home: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    before = sorted(p.name for p in victim.iterdir())
    plan = json.dumps([{"file": "attempts", "as": "outside_dir"}])
    once = tmp_path / "planted"
    spec = write_spec(home, "plant", [hostile("p", "--plan", plan, "--scratch", str(tmp_path), "--once", str(once),
                                              "--exit", "1")])  # fmt: skip
    assert dstui("run", str(spec), timeout=300).returncode == 1
    b = the_batch(home)
    rd = run_named(b, "p")
    assert (rd.path / "attempts").is_symlink()
    out = dstui("retry", f"{b.id}/{rd.name}")  # the second attempt does not plant again (--once)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(p.name for p in victim.iterdir()) == before, "retry moved files into the linked folder"
    assert (victim / "precious.txt").read_text() == "keep me"
    kept = rd.path / "attempts" / "1"
    assert kept.is_dir() and not (rd.path / "attempts").is_symlink()
    assert (kept / "attempts").is_symlink()  # the planted link itself, moved as the entry it is, never followed
    assert (kept / "status.json").is_file() and (kept / "metrics.jsonl").is_file()
    wait_for(lambda: b.info().get("finalized"), what="retried batch finalized")
