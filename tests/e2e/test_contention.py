"""Two CPU batches started one after the other share no cores unawares (issue 38.2, "Must show").

Three batches of one spec on this machine (no GPUs), each a `fast` and a `slow` condition of
`kind: command` runs that print seed lines with a fixed step time (10 ms and 20 ms, so the
report's ratio is known whatever the machine's load):

- A, default, ``--parallel 2``: its two runs start together;
- B, ``--overlap --parallel 2``: told the cores are shared, its runs start beside A's (each pair
  of twin runs meets at a barrier, so they do overlap). Both batches run their two runs at once:
  run one after another, A's second run (default: it waits for cores) could start only once B had
  no live run, while B's second run waited at the barrier for it; a suite run timed out there;
- C, default, launched while A's and B's last runs still live: told the cores are busy, its runs
  wait and start only once every run of A and B has ended.

Then every run of A and B is tagged overlapped in MLflow (``dstui.overlapped`` = true, with
what ran beside it), C's are not; the report flags the four under Data quality and computes the
speed ratio from C's runs alone, unless ``--include-overlapped``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from helpers import dstui, mlflow_client

from dstui.core.rundir import BatchDir, list_batches

# A run's program: its condition's step time; with a `pair` file at its start it meets its twin of the
# other batch first, and lives until the supervisor has seen the twin beside it (and, for `slow`, until
# the test releases it). Every wait is on a condition, bounded.
PROGRAM = textwrap.dedent("""
    import json, os, pathlib, sys, time
    step_s, bar = float(sys.argv[1]), pathlib.Path(sys.argv[2])
    rd = pathlib.Path(os.environ["DSTUI_RUN_DIR"])
    cond = rd.name.rsplit("-r", 1)[0]
    paired = (bar / "pair").exists()
    def wait(ok):
        end = time.time() + 120
        while time.time() < end and not ok():
            time.sleep(0.05)
    def beside():
        try:
            return json.loads((rd / "status.json").read_text()).get("beside")
        except (OSError, ValueError):
            return None
    if paired:
        (bar / cond).mkdir(parents=True, exist_ok=True)
        (bar / cond / rd.parent.name).touch()
        wait(lambda: len(list((bar / cond).iterdir())) >= 2)
    for s in range(1, 7):
        print(f"Epoch 1, Step {s}, Loss: {2.0 / s:.4f} sync: True time: {step_s} alloc_mem: 0 peak_mem: 0", flush=True)
        time.sleep(0.2)
        if paired and s == 1:
            # the timed steps (2-6) come once the supervisor has seen the twin: under a loaded suite it
            # once looked only after all six, and could not place the overlap on them
            wait(beside)
    if paired:
        if cond == "slow":
            wait(lambda: (bar / "release").exists())
""")

SPEC = """
name: pace
settings: {{kind: command, gpus: 1, metrics_format: seed, steps: 6, warmup_steps: 1}}
conditions:
  - {{name: fast, command: ["{{python}}", "{program}", "0.010", "{bar}"]}}
  - {{name: slow, command: ["{{python}}", "{program}", "0.020", "{bar}"]}}
baseline: fast
"""


def _wait(what: str, ok, timeout: float = 180):  # noqa: ANN001, ANN202
    end = time.time() + timeout
    while time.time() < end:
        got = ok()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _batch(home: Path, n: int) -> BatchDir:
    """The n-th batch launched (list_batches is newest first; ids have seconds, so order by creation)."""
    batches = sorted(list_batches(home / "runs"), key=lambda b: b.info().get("created", 0))
    return batches[n]


def _status(b: BatchDir, run: str) -> dict:
    return (b.path / run / "status.json").exists() and json.loads((b.path / run / "status.json").read_text()) or {}


def test_a_second_batch_waits_for_the_cores_or_its_overlap_is_marked_and_left_out(home: Path) -> None:
    bar = home / "barrier"
    bar.mkdir()
    (bar / "pair").touch()
    program = home / "pace.py"
    program.write_text(PROGRAM)
    spec = home / "pace.yaml"
    spec.write_text(SPEC.format(program=program, bar=bar))

    first = dstui("run", str(spec), "--detach", "--parallel", "2", timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr
    a = _batch(home, 0)
    _wait("A's first run to start", lambda: _status(a, "fast-r0").get("pgid"))
    second = dstui("run", str(spec), "--overlap", "--parallel", "2", "--detach", timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"! cores shared: batch {a.id} (runs fast-r0, slow-r0) use this machine's" in second.stdout, second.stdout
    b = _batch(home, 1)
    # both slow runs met at the barrier: from here on nothing new pairs up
    _wait("the slow twins to meet", lambda: (bar / "slow").is_dir() and len(list((bar / "slow").iterdir())) == 2)
    (bar / "pair").unlink()

    third = subprocess.Popen([sys.executable, "-m", "dstui", "run", str(spec)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    c = _wait("C to exist", lambda: len(list_batches(home / "runs")) == 3 and _batch(home, 2))
    waiting = _wait("C's first run to wait", lambda: (_status(c, "fast-r0").get("phase") or "").startswith("waiting for cores") and _status(c, "fast-r0")["phase"])
    assert a.id in waiting or b.id in waiting, waiting
    assert _status(c, "fast-r0")["state"] == "queued"
    (bar / "release").touch()
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, out + err
    assert "! cores busy: batch" in out and "runs wait for them (`dstui run --overlap`" in out, out
    _wait("A and B to finish", lambda: a.info().get("finalized") and b.info().get("finalized"))

    ab = [_status(x, r) for x in (a, b) for r in ("fast-r0", "slow-r0")]
    cs = [_status(c, r) for r in ("fast-r0", "slow-r0")]
    assert all(st["state"] == "done" for st in ab + cs), [(st.get("name"), st.get("state"), st.get("reason")) for st in ab + cs]
    # C ran one after them: its first run started only once the job of every run of A and B had ended
    # (exit.json: the wrapper's record as the job ends; status.json's `ended` is the supervisor's, later)
    jobs_ended = [json.loads((x.path / r / "exit.json").read_text())["ended"] for x in (a, b) for r in ("fast-r0", "slow-r0")]
    assert min(st["started"] for st in cs) >= max(jobs_ended)
    assert all(st["overlap"]["timed"] for st in ab), [st["overlap"] for st in ab]
    assert not any(st.get("beside") for st in cs) and not any(st["overlap"]["timed"] for st in cs)

    client = mlflow_client()
    exp = client.get_experiment_by_name("pace")
    tagged = {(r.data.tags["dstui.batch"], r.info.run_name): r.data.tags for r in client.search_runs([exp.experiment_id])
              if r.data.tags.get("dstui.role") == "run"}  # fmt: skip
    for x, twin in ((a, b), (b, a)):
        for run in ("fast-r0", "slow-r0"):
            tags = tagged[(x.id, run)]
            assert tags["dstui.overlapped"] == "true", tags
            # its twin's batch at least (beside its own batch's other run too: both run at once)
            text = tags["dstui.overlap"]
            assert text.startswith("steps ") and " beside batch " in text and f"batch {twin.id} (run" in text, text
            assert run in text.split(f"batch {twin.id} (", 1)[1].split(")", 1)[0], text  # the twin itself
    assert all(tagged[(c.id, run)]["dstui.overlapped"] == "false" for run in ("fast-r0", "slow-r0"))

    report = dstui("report", "-e", "pace", "-o", str(home / "report"), "--no-mlflow-artifact", timeout=300)
    assert report.returncode == 0, report.stderr
    md = (home / "report" / "report.md").read_text()
    assert "4 run(s) were timed while other runs shared this machine" in md and "**left out**" in md, md

    from dstui.usecases import results

    alone = results.load("pace").speed_ratios["slow"]
    assert (alone.n, alone.n_base) == (1, 1) and abs(alone.ratio - 0.5) < 1e-9  # C's runs only: 20 ms vs 10 ms
    kept = results.load("pace", include_overlapped=True).speed_ratios["slow"]
    assert (kept.n, kept.n_base) == (3, 3) and abs(kept.ratio - 0.5) < 1e-9
