"""ETA and mean step time on a real, paced 300-step run (issue 38.3, "Must show").

A `kind: command` run that sleeps through a start-up (as imports and an op build do), takes two
slow warm-up steps, then 300 steps at a fixed pace, under a real supervisor launched by
`dstui run`. While it runs, the test reads the run as `dstui status --json` does
(``_records.run_record``) every half second; once it ends, each ETA is held against the time the
run really took from that moment. Before issue 38.3 the ETA counted start-up as step time and was
50-100x too high early on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers import dstui

from dstui.commands._records import run_record
from dstui.core.record_file import read_records
from dstui.core.rundir import FINAL_STATES, RunDir, list_batches

STEPS, STEP_S = 300, 0.05
PROGRAM = textwrap.dedent(f"""
    import time
    time.sleep(4.0)  # start-up: not a step
    for s in range(1, {STEPS} + 1):
        t = time.perf_counter()
        time.sleep(1.0 if s <= 2 else {STEP_S})  # two slow warm-up steps, then the pace
        print(f"Epoch 1, Step {{s}}, Loss: {{2.0 / s:.4f}} sync: True time: {{time.perf_counter() - t:.4f}} "
              "alloc_mem: 0 peak_mem: 0", flush=True)
""")


def test_eta_after_warm_up_is_within_2x_and_the_finished_run_shows_its_mean(home: Path) -> None:
    prog = home / "paced.py"
    prog.write_text(PROGRAM)
    spec = home / "paced.yaml"
    spec.write_text(
        f"name: paced\nsettings: {{kind: command, gpus: 1, metrics_format: seed, steps: {STEPS}, warmup_steps: 2}}\n"
        f"conditions:\n  - {{name: pace, command: ['{{python}}', '{prog}']}}\n"
    )
    follower = subprocess.Popen([sys.executable, "-m", "dstui", "run", str(spec)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen: list[tuple[float, float, int]] = []  # (when, eta_s, step)
    try:
        deadline = time.time() + 600
        rd = None
        while time.time() < deadline:
            batches = list_batches(home / "runs")
            rd = RunDir(batches[0].path / "pace-r0") if batches else None
            st = rd.status() if rd is not None else {}
            if st.get("state") in FINAL_STATES:
                break
            if st:
                record = run_record(rd, st)
                if record["eta_s"] is not None:
                    seen.append((time.time(), record["eta_s"], record["step"]))
                elif (record["step"] or 0) > 2 and len(st.get("timeline") or []) > 4:
                    raise AssertionError(f"no ETA at step {record['step']}: {st.get('timeline')}")
            time.sleep(0.5)
        out, _ = follower.communicate(timeout=300)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert rd is not None and rd.state == "done", (rd and rd.status(), out)
    st = rd.status()
    end = max(t for t, steps in st["timeline"] if steps == STEPS)  # when the supervisor saw the last step
    checked = [(round(eta, 1), round(end - t, 1), step) for t, eta, step in seen if end - t > 3.0]
    assert len(checked) >= 5, (seen, st["timeline"])
    assert all(step > 2 for _, _, step in checked)  # no ETA from warm-up steps
    for eta, truth, step in checked:
        assert truth / 2 <= eta <= truth * 2, (eta, truth, step, checked)
    # finished: `dstui status --json` gives its mean step time after warm-up, not its last step's
    doc = json.loads(dstui("status", rd.batch.id, "--json", check=True).stdout)
    (run,) = doc["batches"][0]["runs"]
    every = [r["iter_time"] for r in read_records(rd.log_file, "seed") if r.get("type") == "step"]
    assert len(every) == STEPS
    assert run["warmup_steps"] == 2 and run["iter_time_mean"] == sum(every[2:]) / (STEPS - 2), run
    assert run["iter_time_mean"] < sum(every) / STEPS - 0.005  # the two 1 s warm-up steps are not in it
