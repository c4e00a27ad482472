"""Issue 33.2-33.4: a batch exists whole or not at all; MLflow mirrors every attempt's end; a full disk keeps the exit status.

Real processes throughout: the real CLI killed with SIGKILL while it lays out a
batch, real detached supervisors, a real SQLite MLflow store, a real tmpfs.
Runs are small ``kind: command`` programs (no DeepSpeed needed to show these).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from helpers import REPO, dstui, mlflow_client
from test_reliability import (  # noqa: F401
    FAKE,
    finalized,
    only_batch,
    small_disk,
    spec_file,
    supervisor_pid,
    wait_for,
)

from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir, list_batches
from dstui.execute import creation
from dstui.execute.batch_lock import is_supervised
from dstui.execute.control import request_cancel
from dstui.execute.process_group import group_alive
from dstui.tracking import tags as tag_keys

FILL_DISK = str(REPO / "tests" / "programs" / "fill_disk.py")
# A job that writes two steps, then waits (printing) until a flag file exists, then writes its
# last step and ends: its first attempt can be killed at leisure, its next one ends at once.
WAIT_FOR_FLAG = (
    "import json, os, sys, time\n"
    "metrics, flag = sys.argv[1], sys.argv[2]\n"
    "def step(s):\n"
    "    with open(metrics, 'a') as fh:\n"
    "        fh.write(json.dumps({'type': 'step', 'time': time.time(), 'step': s, 'loss': 1.0 / s}) + '\\n')\n"
    "step(1); step(2)\n"
    "while not os.path.exists(flag):\n"
    "    print('waiting', flush=True); time.sleep(0.2)\n"
    "step(3)\n"
)


def flag_spec(home: Path, name: str, flag: Path, *, others: list[dict] | None = None) -> Path:
    conds = [{"name": "w", "command": [sys.executable, "-c", WAIT_FOR_FLAG, "{metrics_file}", str(flag)]}]
    for c in others or []:
        conds.append({"name": c["name"], "command": [sys.executable, FAKE, "--metrics-file", "{metrics_file}", *c["args"]]})
    data = {"name": name, "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 3, "warmup_steps": 0,
                                       "hung_after_s": 600}, "conditions": conds}  # fmt: skip
    p = home / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def mlflow_runs(client, experiment: str) -> list:  # noqa: ANN001
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def assert_none_running(client, experiment: str) -> None:  # noqa: ANN001
    """No MLflow run of the experiment (parent or any attempt's child) is left RUNNING."""
    runs = mlflow_runs(client, experiment)
    assert runs, "no MLflow run at all"
    open_runs = [(r.info.run_name, r.data.tags.get("dstui.role"), r.data.tags.get("dstui.status")) for r in runs if r.info.status == "RUNNING"]
    assert open_runs == []


def children(client, experiment: str, name: str) -> list:  # noqa: ANN001
    runs = [r for r in mlflow_runs(client, experiment) if r.data.tags.get("dstui.role") == "run" and r.info.run_name == name]
    return sorted(runs, key=lambda r: tag_keys.run_attempt(r.data.tags)[1] or 0)  # attempt 1, 2, ...


# ---- #33.2: a batch exists whole or not at all ----

KILLS = 24
RUNS_PER_BATCH = 16


def many_runs_spec(home: Path) -> Path:
    data = {
        "name": "half",
        "repeats": RUNS_PER_BATCH,
        "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 1, "warmup_steps": 0},
        "conditions": [{"name": "c", "command": [sys.executable, FAKE, "--metrics-file", "{metrics_file}", "--steps", "1"]}],
    }
    p = home / "half.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def run_folders(runs: Path, names: set[str]) -> int:
    """How many run folders the new entries of the runs folder hold right now (hidden or renamed)."""
    n = 0
    for name in names:
        with contextlib.suppress(OSError):  # renamed meanwhile: counted on the next look
            n += sum(1 for e in os.scandir(runs / name) if e.is_dir())
    return n


def never_started(b: BatchDir) -> bool:
    """The batch's supervisor log exists but no supervisor ever wrote to it (15 s after it was made)."""
    st = b.log_file.stat()
    return st.st_size == 0 and time.time() - st.st_mtime > 15


def kill_while_creating(spec: Path, runs: Path, after: int) -> None:
    """Start `dstui run` and SIGKILL it as soon as its new batch holds ``after`` run folders.

    Stepping ``after`` over 0..N spreads the kills over the whole layout, however fast
    or loaded the box is (a kill lands a moment after the count is seen).
    """
    before = set(os.listdir(runs)) if runs.exists() else set()
    proc = subprocess.Popen([sys.executable, "-m", "dstui", "run", "--detach", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            new = set(os.listdir(runs)) - before if runs.exists() else set()
            if new and run_folders(runs, new) >= after:
                break
            assert proc.poll() is None, "dstui run ended before the kill"
            time.sleep(0.0002)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def section(out: str, batch_id: str) -> str:
    """What `dstui status` printed about one batch: from its id's line to the next blank line."""
    start = re.search(rf"^{re.escape(batch_id)}\s", out, re.M).start()  # type: ignore[union-attr]
    end = out.find("\n\n", start)
    return out[start : end if end >= 0 else None]


def test_kill9_of_dstui_run_while_it_creates_a_batch_leaves_no_half_batch(home: Path) -> None:
    spec = many_runs_spec(home)
    runs = home / "runs"
    instants = [round(i * RUNS_PER_BATCH / (KILLS - 1)) for i in range(KILLS)]  # 0..N run folders laid out
    for after in instants:
        kill_while_creating(spec, runs, after)
    cut_short = [b for b in list_batches(runs) if not creation.is_complete(b)]  # as the kills left them
    made_by = {b.id: sum(1 for n in b.info()["runs"] if (b.path / n / "status.json").exists()) for b in cut_short}
    for b in list_batches(runs):  # a kill that came after the layout may have let a supervisor start
        if b.log_file.exists():
            # ... or have come between opening its log and starting it: a log that stays empty
            # for 15 s means none was started (a started one writes its first line at once)
            wait_for(lambda b=b: is_supervised(b) or finalized(b) or never_started(b), what="the started supervisor up")
            if never_started(b) and not is_supervised(b):
                continue  # complete and unsupervised: what the next `dstui status` or TUI takes over
            for rd in b.runs():
                request_cancel(rd)
            wait_for(lambda b=b: finalized(b), what="a started batch finalized")
    # kills before the rename left hidden folders, never listed; once stale, the next look removes them
    hidden = [runs / e for e in os.listdir(runs) if e.startswith(creation.TEMP_PREFIX)]
    long_ago = time.time() - creation.STALE_TEMP_S - 1
    for h in hidden:
        os.utime(h, (long_ago, long_ago))
    # whoever looks first settles them: here `dstui status`
    proc = dstui("status", "--no-takeover", "-n", "1000")
    assert proc.returncode == 1, proc.stderr  # documented: 1 when it lists a failed run (the never-created ones)
    out = proc.stdout
    print(f"runs laid out when killed: {sorted(made_by.values())}; "
          f"{len(list_batches(runs)) - len(made_by)} batches whole")  # fmt: skip
    batches = list_batches(runs)
    assert batches, "no kill left a batch behind"
    assert len(cut_short) >= KILLS // 2, f"only {len(cut_short)} kills landed inside the layout"
    assert len(set(made_by.values())) >= 3, made_by  # the kills hit different points of the layout
    assert not [e for e in os.listdir(runs) if e.startswith(creation.TEMP_PREFIX)]  # hidden starts removed
    for b in batches:
        info = b.info()
        assert creation.is_complete(b), b.id
        listed = [rd.name for rd in b.runs()]
        assert listed == info["runs"] and len(listed) == RUNS_PER_BATCH  # every run has a folder
        shown = section(out, b.id)
        for name in listed:  # and every run is listed by `dstui status`
            assert re.search(rf"^\s*{re.escape(name)}\b", shown, re.M), (b.id, name)
        states = [rd.state for rd in b.runs()]
        assert set(states) <= {"queued", *FINAL_STATES}, states  # no run without a state: none wedged
        never = [rd.name for rd in b.runs() if rd.status().get("reason") == creation.NEVER_CREATED]
        if b.id in made_by:
            assert len(never) == RUNS_PER_BATCH - made_by[b.id]
            assert (info.get(creation.PROBLEM) is not None) == bool(never)
            if never:
                assert f"--resume {b.id}" in info[creation.PROBLEM] and "never laid out" in shown
        else:
            assert never == []  # a batch the kill left whole stays as it was
    # the worst one goes through a real supervisor to the end: nothing waits forever
    worst = BatchDir(runs / max(made_by, key=lambda k: RUNS_PER_BATCH - made_by[k]))
    for rd in worst.runs():
        if rd.state == "queued":
            request_cancel(rd)  # keep it short: the queued runs end as cancelled before start
    dstui("supervise", str(worst.path), check=True, timeout=300)
    assert finalized(worst)
    assert all(rd.state in FINAL_STATES for rd in worst.runs())
    assert_none_running(mlflow_client(), "half")


def test_supervisor_settles_a_cut_short_batch_and_resume_batch_completes_it(home: Path) -> None:
    """The supervisor is the finder here; then `dstui run SPEC --resume BATCH` lays out what never was,
    in that batch although a newer batch of the same spec exists."""
    spec = many_runs_spec(home)
    runs = home / "runs"
    b = None
    for after in (RUNS_PER_BATCH // 2, 2, 5, 1, 8):
        kill_while_creating(spec, runs, after)
        half = [x for x in list_batches(runs) if not creation.is_complete(x)]
        if half:
            b = half[0]
            break
    assert b is not None, "no kill landed inside the layout"
    for rd in b.runs():
        request_cancel(rd)  # its whole runs end as cancelled before start: the supervisor launches nothing
    sup = dstui("supervise", str(b.path), check=True, timeout=300)  # settles it, then finalizes it
    assert finalized(b) and creation.is_complete(b)
    never = [rd for rd in b.runs() if rd.status().get("reason") == creation.NEVER_CREATED]
    assert never and len(b.runs()) == RUNS_PER_BATCH
    assert "cut short while being created" in sup.stdout
    # a newer batch of the same spec: --resume BATCH still goes to the old one
    newer = spec_file(home, "other", [{"name": "x", "args": []}])  # (another experiment entirely)
    assert dstui("run", "--resume", b.id, str(newer)).returncode != 0  # a batch of another spec is refused
    proc = dstui("run", str(spec), "--resume", b.id, "--detach", "--parallel", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resuming batch {b.id}" in proc.stdout
    assert all(rd.status().get("reason") != creation.NEVER_CREATED for rd in b.runs())
    assert b.info().get(creation.PROBLEM) is None
    for rd in b.runs():
        request_cancel(rd)  # the test is done with it; cancel what the resume queued
    wait_for(lambda: finalized(b), timeout=300, what="resumed batch finalized")
    assert_none_running(mlflow_client(), "half")


# ---- #33.3: MLflow mirrors every attempt's end ----


def test_retry_under_a_live_supervisor_ends_every_attempt_in_mlflow(home: Path) -> None:
    """Retry of a failed run while its supervisor still follows another run of the batch."""
    flag = home / "release"
    fixed = home / "fixed"
    spec = flag_spec(home, "retry-live", flag, others=[{"name": "q", "args": ["--steps", "3", "--fail-at", "1", "--fail-unless", str(fixed)]}])
    dstui("run", "--detach", "--parallel", "2", str(spec), check=True)
    b = only_batch(home)
    client = mlflow_client()
    q = RunDir(b.path / "q-r0")
    wait_for(lambda: len(children(client, "retry-live", "q-r0")) == 1 and children(client, "retry-live", "q-r0")[0].info.status == "FAILED",
             what="q's first attempt FAILED in MLflow")  # fmt: skip
    assert is_supervised(b)  # w still waits: the same supervisor goes on
    fixed.write_text("now it works")
    dstui("retry", f"{b.id}/q-r0", check=True)
    wait_for(lambda: q.state == "done" and q.status().get("attempt") == 2, what="q's second attempt done")
    flag.write_text("go")
    wait_for(lambda: finalized(b), what="batch finalized")
    assert [r.info.status for r in children(client, "retry-live", "q-r0")] == ["FAILED", "FINISHED"]
    second = children(client, "retry-live", "q-r0")[1]
    assert second.data.tags["dstui.status"] == "done"
    assert [m.step for m in client.get_metric_history(second.info.run_id, "loss")] == [1, 2, 3]  # read from its own start
    assert_none_running(client, "retry-live")


def test_resume_after_supervisor_and_job_died_ends_the_dead_attempt(home: Path) -> None:
    flag = home / "release"
    spec = flag_spec(home, "resume-dead", flag)
    dstui("run", "--detach", str(spec), check=True)
    b = only_batch(home)
    client = mlflow_client()
    (w,) = wait_for(lambda: b.runs(), what="run folder")
    wait_for(lambda: w.state == "running" and (w.status().get("steps_done") or 0) >= 2, what="two steps")
    wait_for(lambda: children(client, "resume-dead", "w-r0"), what="child run")
    os.kill(supervisor_pid(b), signal.SIGKILL)
    wait_for(lambda: not is_supervised(b), what="lock released")
    os.killpg(w.status()["pgid"], signal.SIGKILL)  # the job dies with it (a reboot, the OOM killer)
    wait_for(lambda: not group_alive(w.status()["pgid"]), what="job gone")
    flag.write_text("go")
    proc = dstui("run", str(spec), "--resume", b.id, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 kept, 1 requeued" in proc.stdout
    assert finalized(b) and w.state == "done" and w.status()["attempt"] == 2
    first, second = children(client, "resume-dead", "w-r0")
    assert (first.info.status, first.data.tags["dstui.status"]) == ("FAILED", "failed")
    assert "resumed" in first.data.tags["dstui.reason"]
    assert second.info.status == "FINISHED"
    assert RunDir(w.path / "attempts" / "1").status()["state"] == "failed"  # the kept record says so too
    assert_none_running(client, "resume-dead")


def test_cancel_and_takeover_end_every_mlflow_run(home: Path) -> None:
    flag = home / "release"
    spec = flag_spec(home, "cancel-take", flag, others=[{"name": "later", "args": ["--steps", "3"]}])
    dstui("run", "--detach", "--parallel", "1", str(spec), check=True)  # w runs, later waits its turn
    b = only_batch(home)
    client = mlflow_client()
    w = RunDir(b.path / "w-r0")
    wait_for(lambda: w.state == "running" and children(client, "cancel-take", "w-r0"), what="w running")
    os.kill(supervisor_pid(b), signal.SIGKILL)  # takeover: `dstui status` starts another
    wait_for(lambda: not is_supervised(b), what="lock released")
    assert "took over" in dstui("status", b.id, check=True).stdout
    dstui("cancel", f"{b.id}/w-r0", check=True)
    wait_for(lambda: finalized(b), what="batch finalized")
    assert (w.state, w.status()["reason"]) == ("killed", "cancelled")
    assert [r.info.status for r in children(client, "cancel-take", "w-r0")] == ["KILLED"]
    assert [r.info.status for r in children(client, "cancel-take", "later-r0")] == ["FINISHED"]
    (parent,) = [r for r in mlflow_runs(client, "cancel-take") if r.data.tags.get("dstui.role") == "batch"]
    assert parent.info.status == "KILLED"  # a run cancelled, none failed
    # a retry reopens the finalized batch; its batch run ends again with it
    flag.write_text("go")
    dstui("retry", f"{b.id}/w-r0", check=True)
    wait_for(lambda: w.state == "done" and finalized(b), what="retried batch finalized")
    assert [r.info.status for r in children(client, "cancel-take", "w-r0")] == ["KILLED", "FINISHED"]
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"
    assert_none_running(client, "cancel-take")


# ---- #33.4: a full disk keeps the exit status ----


def test_disk_full_keeps_the_exit_status_and_names_it(small_disk: Path) -> None:  # noqa: F811 - the fixture
    home = small_disk / "home"
    (home / "mlruns").mkdir(parents=True)
    env = {"DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlruns/mlflow.db"}
    filler = small_disk / "filler"
    go = home / "go"
    # the job waits for `go`, then fills the disk to the last byte (its log included) and exits 1
    waiter = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)\nos.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
    data = {"name": "diskfull", "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 2, "warmup_steps": 0},
            "conditions": [{"name": "f", "command": [sys.executable, "-c", waiter, FILL_DISK, "{metrics_file}", str(filler)]}]}  # fmt: skip
    spec = home / "diskfull.yaml"
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True, env=env)
    b = only_batch(home)
    rd = wait_for(lambda: b.runs() and b.runs()[0], what="run folder")
    wait_for(lambda: rd.state == "running" and rd.status().get("pgid"), what="job running")
    pgid = rd.status()["pgid"]
    go.write_text("")
    wait_for(lambda: filler.exists() and not group_alive(pgid), timeout=120, what="job and wrapper gone")
    assert "No space left" not in rd.log_file.read_text(errors="replace")  # its log could not say why
    assert rd.exit_file.exists()  # ... but the wrapper recorded how it ended, in the room it had kept
    filler.unlink()  # space comes back; the supervisor settles the run
    wait_for(lambda: finalized(b), timeout=180, what="batch finalized")
    st = rd.status()
    assert (st["state"], st["reason"], st["exit_code"]) == ("failed", "disk full (No space left on device)", 1)
    assert not [p.name for p in rd.path.iterdir() if p.name.endswith((".reserved", ".tmp"))]
