"""The automatic stall guard (#33.8) and quiet exits on a closed pipe (`dstui status | head -3`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dstui.core.rundir import RunDir
from dstui.execute import liveness

NOW = 10_000.0


def _stuck(tmp_path: Path, settings: dict, **st) -> tuple[str, str] | None:
    rd = RunDir(tmp_path)
    (tmp_path / "stdout.log").write_text("still printing\n")  # fresh output: never "hung"
    return liveness.why_stuck(rd, {"started": NOW - 5000, **st}, settings, NOW)


def test_default_stall_guard_waits_for_the_first_step_then_scales_with_the_slowest(tmp_path: Path) -> None:
    assert _stuck(tmp_path, {}) is None  # no step yet: start-up and compilation are never judged
    assert _stuck(tmp_path, {}, last_step_at=NOW - 299, slowest_step_s=1.0) is None  # the floor: 300 s
    flag, msg = _stuck(tmp_path, {}, last_step_at=NOW - 301, slowest_step_s=1.0)
    assert flag == "stalled" and msg.startswith("no new step for 300 s (10x the slowest step so far")
    assert _stuck(tmp_path, {}, last_step_at=NOW - 900, slowest_step_s=100.0) is None  # a slow model is not stalled
    assert _stuck(tmp_path, {}, last_step_at=NOW - 1001, slowest_step_s=100.0)[0] == "stalled"


def test_stall_after_s_fixes_the_limit_and_zero_turns_the_guard_off(tmp_path: Path) -> None:
    assert _stuck(tmp_path, {"stall_after_s": 3}) == ("stalled", "no new step for 3 s")  # from the start
    assert _stuck(tmp_path, {"stall_after_s": 0}, last_step_at=NOW - 4000, slowest_step_s=1.0) is None


def test_the_stalled_reason_says_the_limit_that_stopped_it() -> None:
    st = {"stalled": True, "stuck_message": "no new step for 300 s (10x the slowest step so far, at least 300 s)"}
    out = liveness.outcome(st, {"exit_code": -15}, {}, cancelled=False, log_tail=lambda: "")
    assert out["reason"] == "stalled (no new step for 300 s (10x the slowest step so far, at least 300 s)); process group killed"


def _closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI with its stdout a pipe nobody reads any more (as `| head -3` leaves it)."""
    p = subprocess.Popen([sys.executable, "-m", "dstui", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the command writes a byte
    err = p.stderr.read().decode()
    return subprocess.CompletedProcess(args, p.wait(timeout=120), "", err)


def test_commands_end_quietly_on_a_closed_pipe(home: Path) -> None:
    for args in (["status"], ["--help"], ["status", "--help"]):
        done = _closed_pipe(*args)
        assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, (args, done.stderr)
        assert done.returncode in (0, 141), (args, done.returncode, done.stderr)  # 141: 128 + SIGPIPE
