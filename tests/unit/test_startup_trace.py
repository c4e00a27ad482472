"""DSTUI_TRACE: `dstui run`'s own start-up marks, for benchmarks/gpu/bare_vs_dstui.py (issue 31)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import dstui

from dstui.core import startup_trace


def test_marks_go_to_the_file_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(startup_trace.ENV, raising=False)
    startup_trace.mark("nothing", "test")  # unset: no file anywhere, no error
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(startup_trace.ENV, str(trace))
    startup_trace._started.discard(os.getpid())
    startup_trace.mark("first", "test")
    startup_trace.mark("second", "test")
    with open(trace, "a") as fh:
        fh.write("not json\n" + json.dumps({"mark": 3, "t": "x"}) + "\n")  # what read() skips
    got = startup_trace.read(trace)
    assert [r["mark"] for r in got] == ["process_start", "first", "second"]
    assert {r["who"] for r in got} == {"test"} and {r["pid"] for r in got} == {os.getpid()}
    assert got[0]["t"] <= got[1]["t"] <= got[2]["t"]
    assert startup_trace.read(tmp_path / "missing") == []
    monkeypatch.setenv(startup_trace.ENV, str(tmp_path / "no-such-dir" / "t.jsonl"))
    startup_trace.mark("dropped", "test")  # cannot be written: dropped, never raised


@pytest.mark.e2e
def test_dstui_run_marks_every_step_before_the_launch(home: Path, tmp_path: Path) -> None:
    """CLI, supervisor and wrapper mark their steps in the order they happen (a tiny command run)."""
    spec = tmp_path / "cmd.yaml"
    spec.write_text(json.dumps({
        "name": "traced", "settings": {"kind": "command", "steps": 1, "warmup_steps": 0},
        "conditions": [{"name": "c", "command": ["{python}", "-c", "pass"]}],
    }))  # fmt: skip
    trace = tmp_path / "trace.jsonl"
    # the program writes no metrics, so the run ends failed (exit 1): the marks are what counts here
    proc = dstui("run", str(spec), "--quiet", env={startup_trace.ENV: str(trace)}, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    order = [f"{r['who']}:{r['mark']}" for r in startup_trace.read(trace)]
    expected = [
        "cli:cli_run", "cli:plan_done", "cli:forecast_done", "cli:feasibility_done", "cli:batch_created",
        "supervisor:supervisor_main", "supervisor:supervisor_locked", "supervisor:ops_checked",
        "supervisor:run_launched", "supervisor:batch_finalized", "cli:end_seen", "cli:final_table_printed",
    ]  # fmt: skip
    assert [m for m in order if m in expected] == expected, order
    assert "wrap:wrap_starts_job" in order
    assert order.count("cli:process_start") == order.count("supervisor:process_start") == 1


def test_a_run_past_its_last_step_is_watched_closely_for_a_few_seconds_only() -> None:
    """The supervisor's and `dstui run`'s short poll while a run tears down (its end is noticed at once)."""
    import time

    from dstui.execute.supervisor import FINISHING_FAST_FOR_S, is_finishing

    now = time.time()
    assert is_finishing({"state": "running", "phase": "finishing", "phase_since": now - 1})
    assert not is_finishing({"state": "running", "phase": "finishing", "phase_since": now - FINISHING_FAST_FOR_S - 1})
    assert not is_finishing({"state": "done", "phase": "finishing", "phase_since": now})
    assert not is_finishing({"state": "running", "phase": "training", "phase_since": now})
    assert not is_finishing({"state": "running", "phase": "finishing", "phase_since": "garbage"})
    from dstui.usecases.watch import all_steps_done

    assert all_steps_done({"state": "running", "steps_done": 3, "steps_total": 3})
    assert not all_steps_done({"state": "running", "steps_done": 2, "steps_total": 3})
    assert not all_steps_done({"state": "done", "steps_done": 3, "steps_total": 3})
    assert not all_steps_done({"state": "running", "steps_done": "3", "steps_total": None})


def test_dstui_run_wakes_when_batch_json_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dstui run`'s wait between passes ends at the batch's end (batch.json rewritten), not a poll later."""
    from dstui.usecases import watch as run_cmd

    batch_json = tmp_path / "batch.json"
    batch_json.write_text("{}")
    clock = {"now": 0.0, "sleeps": 0}

    def sleep(s: float) -> None:  # a fake clock: no real waiting, no timing in the test
        clock["now"] += s
        clock["sleeps"] += 1
        if clock["sleeps"] == 3:
            batch_json.write_text('{"finalized": true}')

    monkeypatch.setattr(run_cmd.time, "sleep", sleep)
    monkeypatch.setattr(run_cmd.time, "monotonic", lambda: clock["now"])
    run_cmd.nap(batch_json, 1000.0, tick_s=0.05)
    assert clock["sleeps"] == 3  # woke at the change
    run_cmd.nap(batch_json, 1.0, tick_s=0.05)
    assert clock["sleeps"] == 3 + 20  # nothing changed: the whole second
