"""The report's "Where the time went" section over a real MLflow store (issue 12).

Runs carry the ``time/*`` metrics the supervisor logs (dstui.execute.sink),
with start times set here, so every number in the table, the step share per
batch and the chart can be checked against the known inputs. A run without
phase times (an imported log) is named, never drawn, and a report of only
such runs says there is no breakdown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from test_report import BATCH, EXP, log_run, make_parent, store  # noqa: F401

from dstui.usecases.report import export_report

T0_MS = 1_760_000_000_000
SEGS = ("launch", "imports", "init", "compile", "steps", "teardown")


def child(client: Any, exp_id: str, parent: str, name: str, *, start_s: float, times: dict[str, float],
          batch: str = BATCH) -> str:  # fmt: skip
    """A finished child run started at T0 + start_s with the given ``time/*`` metrics."""
    from mlflow.entities import Metric, Param

    cond, rep = name.rsplit("-r", 1)
    tags = {"mlflow.parentRunId": parent, "dstui.role": "run", "dstui.batch": batch, "dstui.condition": cond,
            "dstui.revision": "installed", "dstui.repeat": rep, "dstui.kind": "train", "dstui.status": "done",
            "dstui.device": "cpu"}  # fmt: skip
    rid = client.create_run(exp_id, run_name=name, start_time=T0_MS + int(start_s * 1000), tags=tags).info.run_id
    params = {"model": "tiny-llama", "zero_stage": cond[-1], "gpus": 2, "micro_batch": 2, "seq_length": 64}
    client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()],
                     metrics=[Metric(f"time/{k}", v, T0_MS, 0) for k, v in times.items()]
                     + [Metric("iter_time", 0.1, T0_MS, s) for s in range(1, 4)]
                     + [Metric("loss", 3.0 - 0.1 * s, T0_MS, s) for s in range(1, 4)])  # fmt: skip
    client.set_terminated(rid, "FINISHED")
    return rid


def times(launch: float, imports: float, init: float, compile_: float | None, steps: float, teardown: float,
          step_sum: float) -> dict[str, float]:  # fmt: skip
    seg = {"launch": launch, "imports": imports, "init": init, "compile": compile_, "steps": steps, "teardown": teardown}
    wall = sum(v for v in seg.values() if v is not None)
    out = {k: v for k, v in seg.items() if v is not None}
    return {**out, "wall": wall, "step_time_sum": step_sum, "step_share": step_sum / wall}


def table_rows(md: str, section: str) -> dict[str, list[str]]:
    """The rows of the first table under ``## section``, by their first cell."""
    part = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("| ") and not ln.startswith("|---")]
    return {cells[0]: cells[1:] for ln in lines if (cells := [c.strip() for c in ln.strip("|").split("|")])}


def green_widths(im: Any) -> list[int]:
    """Width in pixels of the green ('steps', #2ca02c at alpha 0.9) segment of each bar, top to bottom."""
    green = (round(0.9 * 0x2C + 25.5), round(0.9 * 0xA0 + 25.5), round(0.9 * 0x2C + 25.5))
    bands: list[list[int]] = []
    last = False
    for y in range(im.height):
        n = sum(1 for x in range(im.width) if all(abs(a - b) <= 2 for a, b in zip(im.getpixel((x, y)), green, strict=True)))
        if n > 3 and last:
            bands[-1].append(n)
        elif n > 3:
            bands.append([n])
        last = n > 3
    return [sorted(b)[len(b) // 2] for b in bands if len(b) > 15]  # bars (~50 px tall), not legend patches (~11)


def test_time_section_table_step_share_and_chart(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    child(client, exp_id, parent, "z0-r0", start_s=0, times=times(1.0, 2.0, 3.0, 0.5, 2.5, 1.0, step_sum=2.0))
    # no compile segment recorded; two repeats of one condition are two rows, not one
    child(client, exp_id, parent, "z1-r0", start_s=10, times=times(1.5, 2.5, 4.0, None, 10.0, 2.0, step_sum=9.0))
    child(client, exp_id, parent, "z1-r1", start_s=30, times=times(1.0, 2.0, 3.0, 0.0, 5.0, 1.0, step_sum=6.0))
    log_run(client, exp_id, parent, condition="seed", history={"iter_time": [(1, 0.1), (2, 0.1)]})  # imported: no phases
    out = tmp_path / "rep"
    md = export_report(EXP, out, batch=BATCH).read_text()

    rows = table_rows(md, "Where the time went")
    assert rows["run"] == [*(f"{s} (s)" for s in SEGS), "wall (s)", "step share"]
    assert rows["z0-r0"] == ["1.0", "2.0", "3.0", "0.5", "2.5", "1.0", "10.0", "20%"]
    assert rows["z1-r0"] == ["1.5", "2.5", "4.0", "-", "10.0", "2.0", "20.0", "45%"]
    assert rows["z1-r1"] == ["1.0", "2.0", "3.0", "0.0", "5.0", "1.0", "12.0", "50%"]
    assert "seed-r0" not in rows and "No time breakdown for `seed-r0`" in md
    # the batch: 2 + 9 + 6 = 17 s of steps from the first launch (0 s) to the last exit (30 + 12 s)
    assert f"Step share of batch `{BATCH}`: **40%**: 17.0 s of optimizer steps in 42.0 s of wall time" in md
    assert "Step share: 40% of the wall time went to optimizer steps (17.0 s of 42.0 s)" in md  # headline

    png = out / "phases.png"
    assert "![where the wall time went](phases.png)" in md
    with Image.open(png) as im:
        im.verify()
    with Image.open(png) as im:
        assert im.format == "PNG" and im.width > 600 and im.height > 150
        widths = green_widths(im.convert("RGB"))
    # the 'steps' segments, top to bottom z0-r0, z1-r0, z1-r1: 2.5, 10 and 5 s on one axis
    assert [w / widths[1] for w in widths] == pytest.approx([0.25, 1.0, 0.5], abs=0.02)

    data = json.loads((out / "data.json").read_text())
    by_run = {r["run"]: r for r in data["time_breakdown"]["runs"]}
    assert set(by_run) == {"z0-r0", "z1-r0", "z1-r1"}
    assert by_run["z1-r0"]["compile"] is None and by_run["z1-r0"]["steps"] == 10.0
    assert data["time_breakdown"]["batches"][BATCH] == pytest.approx(
        {"step_share": 17 / 42, "step_time_sum_s": 17.0, "wall_s": 42.0})


def test_step_share_per_batch_and_names_across_batches(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    """An experiment-wide report: each batch has its own share (the days between batches are nobody's wall time)."""
    client, exp_id, _ = store
    other = "cmp-20260102-000000"
    parent = make_parent(client, exp_id, BATCH)
    child(client, exp_id, parent, "z0-r0", start_s=0, times=times(1, 1, 1, 0, 6, 1, step_sum=5.0))
    parent2 = make_parent(client, exp_id, other)
    child(client, exp_id, parent2, "z0-r0", start_s=86_400, times=times(1, 1, 1, 0, 1, 1, step_sum=1.0), batch=other)
    md = export_report(EXP, tmp_path / "rep").read_text()
    assert f"Step share of batch `{BATCH}`: **50%**: 5.0 s of optimizer steps in 10.0 s" in md
    assert f"Step share of batch `{other}`: **20%**: 1.0 s of optimizer steps in 5.0 s" in md
    rows = table_rows(md, "Where the time went")
    assert rows[f"z0-r0 ({BATCH})"][-2:] == ["10.0", "50%"]
    assert rows[f"z0-r0 ({other})"][-2:] == ["5.0", "20%"]


def test_runs_without_phase_times_do_not_break_the_report(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    log_run(client, exp_id, parent, condition="z1", history={"iter_time": [(s, 0.2) for s in range(1, 6)]})
    out = tmp_path / "rep"
    md = export_report(EXP, out, batch=BATCH).read_text()
    assert "## Where the time went\n\nNo run of this report recorded phase times" in md
    assert not (out / "phases.png").exists() and "Step share" not in md
    assert json.loads((out / "data.json").read_text())["time_breakdown"]["runs"] == []


def test_time_section_says_how_the_compile_caches_answered(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    from mlflow.entities import Metric

    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    first = child(client, exp_id, parent, "z1-r0", start_s=0, times=times(1.0, 2.0, 3.0, 60.0, 2.0, 1.0, step_sum=62.0))
    repeat = child(client, exp_id, parent, "z1-r1", start_s=90, times=times(1.0, 2.0, 3.0, 40.0, 2.0, 1.0, step_sum=42.0))
    child(client, exp_id, parent, "z0-r0", start_s=150, times=times(1.0, 2.0, 3.0, 0.1, 2.0, 1.0, step_sum=2.0))  # eager
    for rid, counts in ((first, {"fxgraph_miss": 2}), (repeat, {"fxgraph_hit": 1, "fxgraph_miss": 1})):
        client.log_batch(rid, metrics=[Metric(f"summary.compile_cache_{k}", v, T0_MS, 0) for k, v in counts.items()])
    md = export_report(EXP, tmp_path / "rep", batch=BATCH).read_text()
    section = md.split("## Where the time went\n", 1)[1].split("\n## ", 1)[0]
    assert "- `z1-r0`: Inductor graphs 2 miss" in section
    assert "- `z1-r1`: Inductor graphs 1 hit, 1 miss" in section
    assert "`z0-r0`:" not in section  # compiled nothing: no line
