"""Issue 40, item 7, the parts a unit can show (the rest: tests/e2e/test_queue_and_streams.py).

Ingestion into a real SQLite MLflow store: seed lines joined by a bare CR or glued by two ranks'
writes are each a step; the second rank's copy of a step is left out and counted; names under
dstui's prefixes and names past the bound are left out and counted. Also: the ranks' output pipes
give whole lines; the job's exit record is 0600 whatever the umask; the store's back-off; a
stopped supervisor is named; retry's attempt folder never goes through a planted link.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import sink_store

from dstui.core.errors import DstuiError
from dstui.core.metric_names import MAX_METRIC_NAMES
from dstui.core.records import seed_line
from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic
from dstui.execute import ingest, store
from dstui.execute.batch import attempt_folder
from dstui.execute.batch_lock import holder_pid, stopped_note
from dstui.execute.follow import RunFollower
from dstui.execute.ingest import Tracked
from dstui.execute.injob import wrap
from dstui.execute.injob.rank_output import RankOutput

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sink(tmp_path_factory: pytest.TempPathFactory, empty_db: Path) -> Iterator[dict]:
    with sink_store(tmp_path_factory.mktemp("rules"), empty_db, "rules") as s:
        yield s


def ingest_run(s: dict, name: str, fmt: str, data: bytes) -> tuple[RunDir, Tracked, str]:
    """A finished run whose output is ``data``, followed to its end by the supervisor's real pass."""
    rd = RunDir(s["batch"].path / name)
    rd.path.mkdir()
    write_json_atomic(rd.spec_file, {"condition": name, "settings": {"kind": "command", "metrics_format": fmt}})
    rid = s["client"].create_run(s["sink"].experiment_id, run_name=name, tags={"dstui.role": "run"}).info.run_id
    merge_status(rd, dict(name=name, state="running", started=time.time(), mlflow_run_id=rid))
    (rd.log_file if fmt == "seed" else rd.metrics_file).write_bytes(data)
    follower = RunFollower(s["batch"], s["sink"], None, system_interval_s=3600)
    t = follower.tracked_of(rd)
    follower.follow(rd)
    merge_status(rd, dict(state="done", ended=time.time(), exit_code=0))
    follower.follow(rd)
    assert t.finalized
    return rd, t, rid


def losses(s: dict, rid: str, key: str = "loss") -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in s["client"].get_metric_history(rid, key))


def test_seed_lines_joined_by_a_bare_cr_or_glued_together_are_each_a_step(sink: dict) -> None:
    a, b, c = (seed_line(1, s, 10.0 / s, 0.01, 1, 2) for s in (1, 2, 3))
    out = f"{a}\r{b}\n{c[:20]}{seed_line(1, 4, 2.5, 0.01, 1, 2)}\n".encode()  # CR-joined; a torn start glued to step 4
    rd, t, rid = ingest_run(sink, "cr", "seed", out)
    assert [s for s, _ in losses(sink, rid)] == [1, 2, 4]
    assert rd.status()["steps_done"] == 4


def test_the_second_ranks_copy_of_a_step_is_left_out_and_counted(sink: dict) -> None:
    lines = []
    for s in range(1, 31):  # both ranks print each step; their values differ; the order varies
        first, second = (0, 1) if s % 3 else (1, 0)
        lines += [seed_line(1, s, 10.0 / s + first / 1000, 0.01, 1, 2), seed_line(1, s, 10.0 / s + second / 1000, 0.01, 1, 2)]
    rd, t, rid = ingest_run(sink, "tworanks", "seed", ("\n".join(lines) + "\n").encode())
    got = losses(sink, rid)
    assert [s for s, _ in got] == list(range(1, 31))  # 30 steps, each once (it stored them twice)
    assert rd.status()["repeated_steps"] == 30


def test_reserved_names_and_names_past_the_bound_are_left_out_and_counted(sink: dict) -> None:
    recs = [{"type": "step", "step": 1, "loss": 1.0, "system/gpu_0_utilization_percentage": 99.0, "time/steps": 5.0}]
    recs += [{"type": "step", "step": 2 + i // 1000, **{f"m{j}": 1.0 for j in range(i, i + 1000)}} for i in range(0, 10_000, 1000)]
    recs.append({"type": "summary", "summary.x": 1.0, "ok": 2.0})
    data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    rd, t, rid = ingest_run(sink, "names", "jsonl", data)
    run = sink["client"].get_run(rid)
    # dstui's own names: time/* (the run's breakdown) and system/* (its host readings; no GPU here)
    names = {n for n in run.data.metrics if not n.startswith(("time/", "system/"))}
    assert len(names) == MAX_METRIC_NAMES  # loss and m0..m254: the bound (summary.ok came after it)
    assert "system/gpu_0_utilization_percentage" not in run.data.metrics and "summary.summary.x" not in names
    assert [m.step for m in sink["client"].get_metric_history(rid, "time/steps")] in ([], [0])  # not the job's step 1
    assert losses(sink, rid) == [(1, 1.0)]
    st = rd.status()
    assert st["bad_lines"] == 1 + 10 + 1 and "a name dstui reserves" in st["first_bad_line"]  # the first, each 1000, the summary
    assert json.loads(rd.ingest_file.read_text())["metric_names"][:2] == ["loss", "m0"]


def test_rank_output_keeps_each_line_whole(tmp_path: Path) -> None:
    log = tmp_path / "log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out = RankOutput(fd)
    ends = [out.pipe_for(r) for r in range(2)]

    def rank(w: int, r: int) -> None:
        for s in range(300):  # a line in four writes, as unbuffered print(a, b) writes it
            for piece in (f"Epoch 1, Step {s},", f" Loss: {r}", " sync: True", "\n"):
                os.write(w, piece.encode())
        os.close(w)

    threads = [threading.Thread(target=rank, args=(w, r)) for r, w in enumerate(ends)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.drain()
    os.close(fd)
    lines = log.read_text().splitlines()
    assert len(lines) == 600 and all(ln.startswith("Epoch 1, Step ") and ln.endswith(" sync: True") for ln in lines)


def test_the_exit_record_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        reserved = wrap.reserve(str(tmp_path))
        assert wrap.record(str(tmp_path), {"exit_code": 0}, reserved)
        assert wrap.record(str(tmp_path), {"exit_code": 1}, None)  # without the reserved room too
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "exit.json").stat().st_mode) == 0o600


def test_store_backs_off_while_it_keeps_failing_and_forgets_once_it_answers(tmp_path: Path) -> None:
    b = BatchDir(tmp_path)
    write_json_atomic(b.batch_file, {"experiment": "x"})
    conn = store.StoreConnection(b, "http://127.0.0.1:9")
    waits = []
    for _ in range(6):
        conn.down(OSError("refused"))
        waits.append(conn._retry_at - time.time())
    assert 3.5 < waits[0] < 6.5 and waits[1] > waits[0] * 1.3 and waits[2] > waits[1] * 1.3
    assert max(waits) <= store.RETRY_MAX_S * (1 + store.RETRY_JITTER) + 0.1
    conn.up()
    conn.down(OSError("refused"))
    assert conn._retry_at - time.time() < 6.5


def test_a_stopped_lock_holder_is_named(tmp_path: Path) -> None:
    b = BatchDir(tmp_path)
    b.lock_file.touch()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(300)",
                               str(b.lock_file)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert holder_pid(b) == holder.pid and stopped_note(b) is None
        os.kill(holder.pid, signal.SIGSTOP)
        deadline = time.time() + 10
        while stopped_note(b) is None and time.time() < deadline:
            time.sleep(0.05)
        assert stopped_note(b) == (f"the supervisor (pid {holder.pid}) is stopped: no run starts and nothing reaches "
                                   f"MLflow until it goes on (`kill -CONT {holder.pid}`)")  # fmt: skip
        os.kill(holder.pid, signal.SIGCONT)
    finally:
        holder.kill()
        holder.wait()
    with open(b.lock_file) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    assert stopped_note(b) is None


@pytest.mark.parametrize("planted", ["link", "file", "fifo"])
def test_the_attempt_folder_is_never_made_through_what_the_job_planted(tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    rd = RunDir(tmp_path / "batch" / "r0")
    rd.path.mkdir(parents=True)
    attempts = rd.path / "attempts"
    {"link": lambda: attempts.symlink_to(victim), "file": lambda: attempts.write_text("x"),
     "fifo": lambda: os.mkfifo(attempts)}[planted]()  # fmt: skip
    n, keep = attempt_folder(rd)
    assert (n, keep) == (1, attempts / "1") and keep.is_dir() and not attempts.is_symlink()
    assert os.path.lexists(keep / "attempts") and list(victim.iterdir()) == []
    assert attempt_folder(rd)[0] == 2


def test_a_run_folder_that_is_a_link_is_never_requeued(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "batch").mkdir()
    (tmp_path / "batch" / "r0").symlink_to(elsewhere)
    with pytest.raises(DstuiError, match="not a real run folder"):
        attempt_folder(RunDir(tmp_path / "batch" / "r0"))
    assert list(elsewhere.iterdir()) == []


def test_reading_points_of_an_unchanged_run_is_stable(sink: dict) -> None:
    """Names admitted once stay admitted across a supervisor restart (kept in ingest.json)."""
    rd, t, rid = ingest_run(sink, "restart", "jsonl", (json.dumps({"type": "step", "step": 1, "a": 1.0}) + "\n").encode())
    again = Tracked.load(rd, "jsonl")
    assert again.names.names == {"a"} and ingest.read_points(again, on_header=lambda rec: None) == []
