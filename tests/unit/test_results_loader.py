"""`dstui report`, `dstui compare` and the TUI's Results read one loader, so they see the same conditions (issue 39).

A real MLflow store holds two batches of one spec: the second ran `steps` 200 instead of 300 and
was cancelled, two of its runs before they started. The report's conditions, the Results
screen's rows and `dstui compare`'s samples all come from :mod:`dstui.usecases.results`: the
same labels, the same runs in each, never-started runs in none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_report import EXP, STEPS, log_run, losses, make_parent, store  # noqa: F401 - the store fixture

from dstui.tui import results_data
from dstui.usecases import results
from dstui.usecases.report import export_report

B1, B2 = "cmp-20260101-000000", "cmp-20260102-000000"


def two_batches(store: tuple[Any, str, str]) -> None:  # noqa: F811
    client, exp_id, _ = store
    for batch, steps in ((B1, 300), (B2, 200)):
        parent = make_parent(client, exp_id, batch)
        for rev in ("stable", "main"):
            for cond, stage in (("z1", 1), ("z2", 2)):
                cancelled = batch == B2 and cond == "z2"
                log_run(client, exp_id, parent, condition=cond, revision=rev, tags={"dstui.batch": batch},
                        params={"zero_stage": stage, "steps": steps},
                        status="killed" if cancelled else "done", reason="cancelled before start" if cancelled else "",
                        history={} if cancelled else {"iter_time": [(s, 0.01 * stage) for s in STEPS],
                                                      "loss": losses(0.0)})  # fmt: skip


def test_report_compare_and_results_screen_group_alike(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    two_batches(store)
    res = results.load(EXP)
    expected = {c.label: sorted(r.run_id for r in c.runs) for c in res.conds}
    assert sorted(expected) == ["z1 (steps=200) @ main", "z1 (steps=200) @ stable", "z1 (steps=300) @ main",
                                "z1 (steps=300) @ stable", "z2 @ main", "z2 @ stable"]  # fmt: skip
    assert len(res.not_started) == 2 and not {r.run_id for r in res.not_started} & {i for v in expected.values() for i in v}

    export_report(EXP, tmp_path / "r", log_artifact=False)
    data = json.loads((tmp_path / "r" / "data.json").read_text())
    assert {c["label"]: sorted(c["run_ids"]) for c in data["conditions"]} == expected

    screen = results_data.load(EXP, None)
    assert {row.label: sorted(row.run_ids) for row in screen.conditions} == expected
    assert sorted(row.label for row in screen.runs if row.label.endswith("(not started)")) == [
        "z2 @ main (not started)", "z2 @ stable (not started)"]  # fmt: skip

    # compare, per batch: the newest batch that ran the baseline revision is B2, with its own conditions only
    comp = results.compare_revisions(EXP, None, "stable")
    assert comp.batch == B2
    assert [(c.condition, c.revision, c.n, c.n_base) for c in comp.comparisons] == [("z1", "main", 1, 1)]
    comp = results.compare_revisions(EXP, B1, "stable")
    assert sorted((c.condition, c.n, c.n_base) for c in comp.comparisons) == [("z1", 1, 1), ("z2", 1, 1)]
