"""A backend from outside dstui runs a batch end to end: the registry is the only way in.

:class:`SetsidBackend` starts each run's command through the ``setsid`` program
(util-linux), not through dstui's wrapper, records its own marker file
(``setsid.json``: the pid, the session it leads), follows the process by its
session, writes its own system readings and tags. It is registered from this
file alone, the way a site's own scheduler would be: named in
``$DSTUI_EXECUTORS`` (``setsid=test_executor_backend:SetsidBackend``), with this
folder on ``PYTHONPATH`` so every process dstui starts (the CLI, the detached
supervisor, ``dstui cancel``) imports it from here. No product file names it.

The runs are the scriptable fake runner (``kind: command``): real processes
writing real metrics records, a real supervisor, a real MLflow store.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, dstui, mlflow_client
from test_reliability import only_batch, wait_for

from dstui.core import run_status
from dstui.core.errors import DstuiError
from dstui.core.rundir import LIVE_STATES, BatchDir, RunDir
from dstui.execute import feasibility, launch, liveness
from dstui.execute.backends.base import Preview
from dstui.execute.process_group import kill_group

HERE = Path(__file__).resolve().parent
MARKER = "setsid.json"
REGISTRATION = "setsid=test_executor_backend:SetsidBackend"


def session_pids(sid: int) -> list[int]:
    """The live (non-zombie) processes of a session, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
                out.append(int(entry.name))
    return out


class SetsidBackend:
    """Each run is `setsid COMMAND` in the run folder: a session of its own, followed by its session id."""

    name = "setsid"
    finishing_poll_s: float | None = None
    shown_fields = (("sid", "pgid", 5),)

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self._last_reading: dict[str, float] = {}

    # ---- before a batch exists ----

    def capacity(self) -> feasibility.Machine:
        return feasibility.this_machine()  # its runs start on this machine

    def preflight(self, plan: Any) -> None:
        if shutil.which("setsid") is None:
            raise DstuiError("setsid is not installed here (util-linux)")

    def preview(self, plan: Any, run: Any, rd: RunDir) -> Preview:
        command = ["setsid", *launch.shown_command(run, launch.build_argv(run, rd))]
        return Preview(command, shlex.join(command))

    def batch_options(self, spec: Any) -> dict[str, Any]:
        return {"marker": MARKER}

    def launch_notes(self, batch: BatchDir) -> list[str]:
        return []

    # ---- the supervisor of one batch ----

    def before_first_run(self, batch: BatchDir, log: Any) -> None:
        pass

    def refresh(self, runs: list[RunDir]) -> list[RunDir]:
        return []

    def start_queued(self, batch: BatchDir, queued: list[RunDir], active: list[RunDir], start: Any) -> None:
        for rd in queued:  # all at once: two cheap processes
            start(rd, None)
            active.append(rd)

    def start(self, rd: RunDir, t: Any, slot: Any) -> bool:
        run = launch.load_runspec(rd)
        env = launch.build_env(run, rd)
        argv = launch.real_argv(launch.build_argv(run, rd), env)
        with open(rd.log_file, "ab") as out:
            proc = subprocess.Popen(["setsid", *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=str(rd.path))  # fmt: skip
        t.proc = proc
        sid = self._session_of(proc)
        (rd.path / MARKER).write_text(json.dumps({"pid": proc.pid, "sid": sid, "via": "setsid"}))
        run_status.running(rd, executor=self.name, pid=proc.pid, pgid=proc.pid, started=time.time(),
                           argv=launch.shown_command(run, argv))  # fmt: skip
        return True

    @staticmethod
    def _session_of(proc: subprocess.Popen) -> int | None:
        """The session the command leads once `setsid` made it one (right after the fork it is still ours)."""
        deadline = time.time() + 10
        while time.time() < deadline and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if os.getsid(proc.pid) == proc.pid:
                    return proc.pid
            time.sleep(0.01)
        return None

    def live(self, st: dict[str, Any]) -> bool:
        return st.get("state") in LIVE_STATES

    def readings(self, t: Any, st: dict[str, Any], *, live: bool, interval_s: float) -> None:
        """How many processes the run's session holds, once a second while it lives."""
        now = time.time()
        if not live or now - self._last_reading.get(t.rd.name, 0.0) < 1.0 or not st.get("pgid"):
            return
        self._last_reading[t.rd.name] = now
        count = len(session_pids(st["pgid"]))
        if count:
            with open(t.rd.system_file, "a") as fh:
                fh.write(json.dumps({"time": now, "job_processes": float(count)}) + "\n")

    def follow_job(self, t: Any, st: dict[str, Any]) -> None:
        liveness.check(t, st, self)  # cancel, hang and end, as a process job this host sees

    def tags(self, st: dict[str, Any]) -> dict[str, Any]:
        return {"test.setsid_sid": st.get("pgid")} if st.get("pgid") else {}

    # ---- a run's job, from its status alone; and what liveness.check asks ----

    def alive(self, st: dict[str, Any]) -> bool:
        return bool(st.get("pgid")) and bool(session_pids(st["pgid"]))

    def cancel(self, st: dict[str, Any], *, grace_s: float = 5.0) -> None:
        kill_group(st.get("pgid"), grace_s=grace_s)  # `setsid` made the command its session's and group's leader

    def ended(self, rd: RunDir, st: dict[str, Any], handle: Any) -> bool:
        return handle.poll() is not None if handle is not None else not self.alive(st)

    def reap(self, handle: Any) -> None:
        if handle is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.wait(timeout=5)


# ---- the test --------------------------------------------------------------------------------

FAKE = str(REPO / "tests" / "programs" / "fake_runner.py")
STEPS = 8


def spec(home: Path) -> Path:
    path = home / "setsid.yaml"
    command = [sys.executable, FAKE, "--metrics-file", "{metrics_file}"]
    path.write_text(yaml.safe_dump({
        "name": "setsid",
        "settings": {"kind": "command", "metrics_format": "jsonl", "steps": STEPS, "warmup_steps": 1},
        "conditions": [
            {"name": "short", "command": [*command, "--steps", str(STEPS), "--interval", "0.3"]},
            {"name": "long", "command": [*command, "--steps", "1000", "--interval", "0.2"]},
        ],
    }))  # fmt: skip
    return path


@pytest.fixture
def registered(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The backend registered for this test's processes (and those they start) only."""
    monkeypatch.setenv("DSTUI_EXECUTORS", REGISTRATION)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    return home


def test_unregistered_name_is_refused_in_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSTUI_EXECUTORS", raising=False)
    proc = dstui("run", "--executor", "setsid", str(spec(home)))
    assert proc.returncode == 2 and "invalid choice: 'setsid'" in proc.stderr
    data = yaml.safe_load(spec(home).read_text())
    (home / "s2.yaml").write_text(yaml.safe_dump({**data, "executor": "setsid"}))
    proc = dstui("list", str(home / "s2.yaml"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "field 'executor': must be one of 'local', 'slurm' (got 'setsid')" in proc.stderr


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux's setsid")
def test_a_backend_registered_from_its_test_file_runs_a_batch(registered: Path) -> None:
    home = registered
    assert "setsid" in dstui("run", "--help", check=True).stdout  # --executor's choices are the registry's
    dry = dstui("run", "--executor", "setsid", "--dry-run", str(spec(home)), check=True).stdout
    assert shlex.join(["setsid", sys.executable, FAKE]) in dry  # its preview, not the local one
    dstui("run", "--executor", "setsid", "--detach", str(spec(home)), check=True)
    b = only_batch(home)
    assert b.info()["executor"] == "setsid" and b.info()["executor_options"] == {"marker": MARKER}
    short, long_ = (RunDir(b.path / "short-r0"), RunDir(b.path / "long-r0"))
    wait_for(lambda: (long_.status().get("steps_done") or 0) >= 3, what="the long run streaming")
    # started by the backend: its marker, a session of its own led by the command's pid
    for rd in (short, long_):
        marker = json.loads((rd.path / MARKER).read_text())
        st = rd.status()
        assert st["executor"] == "setsid" and marker["pid"] == st["pid"] == marker["sid"] == st["pgid"]
    assert not short.exit_file.exists()  # no dstui wrapper in between: no exit.json
    # `dstui cancel` in another process reaches the job through the registry, by the run's status
    dstui("cancel", f"{b.id}/long-r0", check=True)
    wait_for(lambda: long_.state == "killed", 60, what="the long run cancelled")
    assert long_.status()["reason"] == "cancelled"
    wait_for(lambda: not session_pids(long_.status()["pgid"]), 30, what="its session gone")
    wait_for(lambda: b.info().get("finalized"), 120, what="the batch finalized")
    st = short.status()
    assert st["state"] == "done" and st["exit_code"] == 0 and st["steps_done"] == STEPS
    client = mlflow_client()
    run = client.get_run(st["mlflow_run_id"])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == list(range(1, STEPS + 1))
    assert run.data.tags["test.setsid_sid"] == str(st["pgid"]) and run.data.tags["dstui.status"] == "done"
    # the backend's own readings, taken while the long run streamed (the short one may end before a pass sees it)
    assert client.get_metric_history(long_.status()["mlflow_run_id"], "system/job_processes")
    table = dstui("status", b.id).stdout.splitlines()  # exit 1: a run was killed
    header = next(line for line in table if line.startswith("run "))
    assert header.split()[-2:] == ["sid", "reason"]  # its column in the runs table (Backend.shown_fields)


def test_no_product_file_names_the_test_backend() -> None:
    """The registration above is the only way in: nothing under dstui/ knows this backend."""
    # what would name it: its class, its module, its marker file, its executor name as a string (the
    # `setsid` program itself is named in prose, e.g. execute/process_group.py's docstring)
    names = ("SetsidBackend", "test_executor_backend", MARKER, '"setsid"', "'setsid'", "setsid=")
    found = [f"{p}: {n}" for p in (REPO / "dstui").rglob("*.py") for n in names if n in p.read_text()]
    assert not found
