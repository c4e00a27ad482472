"""A report over several batches judges as the clean batch alone does (issue 38.1), with real DeepSpeed runs.

The sequence a new user ran: ``configs/experiments/lrsweep.yaml`` (ZeRO 1, 2 x lr 1e-4, 1e-3),
then the spec again with other ``steps``, cancelled while its first run trains (that run killed,
the other three cancelled before start), then ``dstui report -e lrsweep`` over both batches. The
report once called ZeRO-2 vs ZeRO-1 "not comparable: model.heads (unset)/4 vs 4" and pooled the
steps-300 and steps-200 runs as repeats. Here: real CPU DeepSpeed runs (one gloo rank each, to keep
CI's 2 cores free; the spec ships with 2), a real MLflow store, the real CLI.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import SPECS, dstui

from dstui.core.rundir import BatchDir, list_batches

pytestmark = pytest.mark.timeout(900)


def lrsweep(home: Path, steps: int) -> Path:
    spec = yaml.safe_load((SPECS / "lrsweep.yaml").read_text())
    spec["settings"].update(steps=steps, gpus=1)
    path = home / f"lrsweep-{steps}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))  # the axes in order: condition names as shipped
    return path


def wait_for(what: str, ok: Any, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def trains(batch: BatchDir) -> bool:
    """The batch's first run has logged an optimizer step (its metrics.jsonl holds a step record)."""
    first = batch.runs()[0].metrics_file
    return first.is_file() and '"step"' in first.read_text(errors="replace")


def report(home: Path, name: str, *args: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """`dstui report -e lrsweep ... --json`: what it printed, report.md and data.json."""
    out = home / "reports" / name
    proc = dstui("report", "-e", "lrsweep", "-o", str(out), "--json", *args, check=True)
    return json.loads(proc.stdout), (out / "report.md").read_text(), json.loads((out / "data.json").read_text())


def verdicts(data: dict[str, Any]) -> dict[tuple[str, str], tuple[str, Any, Any]]:
    """(condition, steps) -> (verdict, what it was compared with, max |loss difference|), labels aside."""
    ident = {c["label"]: (c["condition"], c["settings"]["steps"]) for c in data["conditions"]}
    return {ident[p["label"]]: (p["verdict"], ident.get(p["compared_with"]), p["max_abs_diff"]) for p in data["parity"]}


def test_a_cancelled_batch_with_other_steps_changes_no_verdict(home: Path) -> None:
    dstui("run", str(lrsweep(home, steps=6)), check=True)
    (clean,) = list_batches(home / "runs")
    dstui("run", "--detach", str(lrsweep(home, steps=3000)), check=True)
    second = next(b for b in list_batches(home / "runs") if b.id != clean.id)
    wait_for("the second batch's first run to train", lambda: trains(second))
    dstui("cancel", second.id, check=True)
    wait_for("the second batch to end", lambda: second.is_finished() and second.info().get("finalized"))
    states = {rd.name: (rd.status().get("state"), rd.status().get("reason")) for rd in second.runs()}
    assert states["z1-lr0.0001-r0"] == ("killed", "cancelled"), states  # it started: a run that was killed
    assert sorted(v for k, v in states.items() if k != "z1-lr0.0001-r0") == [("killed", "cancelled before start")] * 3

    alone_out, alone_md, alone = report(home, "clean", "-b", clean.id)
    both_out, md, both = report(home, "all")

    # the clean batch's verdicts, the same over both batches
    assert verdicts(alone) == {
        ("z1-lr0.001", "6"): ("not comparable", None, None),
        ("z2-lr0.0001", "6"): ("PASS", ("z1-lr0.0001", "6"), 0.0),
        ("z2-lr0.001", "6"): ("PASS", ("z1-lr0.001", "6"), 0.0),
    }
    assert {k: v for k, v in verdicts(both).items() if k[1] == "6"} == verdicts(alone)
    assert "(unset)" not in md and "model.heads" not in md.split("## Setup")[0]  # nothing differs by a missing value
    assert "Compared 5 conditions varying `lr`, `steps`, `zero_stage`" in md

    # different steps are never repeats of one condition; never-started runs are in none
    conds = {c["label"]: c for c in both["conditions"]}
    runs = {r["run_id"]: r for r in both["runs"]}
    for c in both["conditions"]:
        assert {runs[rid]["params"]["steps"] for rid in c["run_ids"]} == {c["settings"]["steps"]}, c["label"]
        assert all(runs[rid]["started"] for rid in c["run_ids"])
    assert conds["z1-lr0.0001 (steps=3000)"]["run_ids"] == [
        r["run_id"] for r in both["runs"] if r["tags"]["dstui.batch"] == second.id and r["run_name"] == "z1-lr0.0001-r0"]
    assert conds["z1-lr0.0001 (steps=6)"]["run_ids"] == [
        r["run_id"] for r in both["runs"] if r["tags"]["dstui.batch"] == clean.id and r["run_name"] == "z1-lr0.0001-r0"]
    assert sum(not r["started"] for r in both["runs"]) == 3
    assert "3 run(s) never launched" in md and "not counted as repeats or conditions" in md
    assert "z1-lr0.0001: its runs ran with different settings (steps: 6 / 3000)" in md

    # one run each: no condition is called the fastest (the data do not bound a ratio)
    assert "Fastest" not in md and "Fastest" not in alone_md
    # where the reports went: the clean one to its batch, the one over both batches to both parents
    assert list(alone_out["logged_to"]) == [clean.id]
    assert sorted(both_out["logged_to"]) == sorted([clean.id, second.id])
