"""A job is its leader's number *and* start on this boot, plus its token (issue 40, item 1).

Real processes: a job recorded as dstui records it is alive and stopped whole (its group and a
helper in a session of its own); a status whose number now belongs to another process (its
start does not match), or that was recorded under another boot, is gone and never signalled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dstui.core import proc_identity as ident
from dstui.execute.process_group import JobProcesses, job_alive, record, send_checked, stop_job

pytestmark = pytest.mark.timeout(60)


def wait_gone(proc: subprocess.Popen, timeout: float = 10) -> bool:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def alive(pid: int) -> bool:
    return ident.state_of(pid) not in (None, "Z")


@pytest.fixture
def stranger():
    """An unrelated session leader that 'got' a dead job's number."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def test_start_ticks_and_boot_identify_a_process(stranger: subprocess.Popen) -> None:
    ticks = ident.start_ticks(stranger.pid)
    assert isinstance(ticks, int) and ticks > 0 and ident.start_ticks(os.getpid()) <= ticks
    assert ident.is_same(stranger.pid, ticks, ident.boot_id())
    assert not ident.is_same(stranger.pid, ticks - 1, ident.boot_id())
    assert not ident.is_same(stranger.pid, ticks, "another-boot")
    assert ident.pgid_of(stranger.pid) == stranger.pid and ident.state_of(stranger.pid) in ("S", "R")


def test_a_number_now_held_by_a_stranger_is_gone_and_never_signalled(stranger: subprocess.Popen) -> None:
    st = {"pid": stranger.pid, "pgid": stranger.pid, "pid_start": ident.start_ticks(stranger.pid) - 7,
          "boot_id": ident.boot_id(), "job_token": ident.new_token()}  # fmt: skip
    assert not job_alive(st)
    stop_job(st, grace_s=0.2)
    assert not wait_gone(stranger, timeout=1.0)
    send_checked(stranger.pid, st["pid_start"], 9)  # the check before a single signal, too
    assert not wait_gone(stranger, timeout=0.5)


def test_a_job_of_another_boot_is_gone(stranger: subprocess.Popen) -> None:
    st = {**record(stranger.pid, ident.new_token()), "boot_id": "0000-not-this-boot"}
    assert not job_alive(st)
    stop_job(st, grace_s=0.2)
    assert not wait_gone(stranger, timeout=1.0)


def test_a_recorded_job_is_alive_and_stopped_whole_with_its_helpers() -> None:
    token = ident.new_token()
    leader = subprocess.Popen(  # the job: a leader, a rank in its group, a helper in a session of its own
        [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); "
         "subprocess.Popen(['sleep', '300'], start_new_session=True); time.sleep(300)"],
        env={**os.environ, ident.JOB_TOKEN_ENV: token}, start_new_session=True,
    )  # fmt: skip
    st = record(leader.pid, token)
    job = JobProcesses.of(st)
    assert job is not None and job.recorded_whole and job.leader_is_ours()
    deadline = time.time() + 20
    while len(job.members()) < 3 and time.time() < deadline:
        time.sleep(0.1)
    members = job.members()
    assert len(members) == 3, members
    helpers = [p for p in members if ident.pgid_of(p) != leader.pid]
    assert len(helpers) == 1  # left the group: only the token finds it
    assert job_alive(st)
    stop_job(st, grace_s=2.0)
    assert wait_gone(leader)
    assert not job_alive(st) and not any(alive(p) for p in members)


def test_ranks_that_outlive_their_leader_are_still_found_by_their_token() -> None:
    token = ident.new_token()
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '300'])"],
                              env={**os.environ, ident.JOB_TOKEN_ENV: token}, start_new_session=True)  # fmt: skip
    st = record(leader.pid, token)
    leader.wait()  # the leader is gone (reaped): its number may come round to anyone now
    assert ident.start_ticks(leader.pid) is None or not JobProcesses.of(st).leader_is_ours()
    assert job_alive(st)  # the orphaned 'rank' carries the token
    stop_job(st, grace_s=2.0)
    deadline = time.time() + 10
    while job_alive(st) and time.time() < deadline:
        time.sleep(0.1)
    assert not job_alive(st)


def test_a_status_from_before_start_times_were_kept_falls_back_to_the_group(stranger: subprocess.Popen) -> None:
    assert job_alive({"pgid": stranger.pid})  # legacy: only the number is known
    assert not job_alive({}) and not job_alive({"pgid": 1}) and not job_alive({"pgid": True})
