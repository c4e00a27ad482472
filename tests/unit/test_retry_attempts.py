"""A run queued again counts once: its newest attempt, never old and new as two repeats.

A new user's `dstui retry BATCH/z1-r0` of a done run made the report say
"z1 | 2 runs | 2 done" with an interval over one run measured twice. Here the
attempts are real MLflow child runs in a real SQLite store, tagged as the
supervisor tags them (``dstui.run_dir`` = folder + '#attempt').
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_report import EXP, log_run, make_parent, store  # noqa: F401 - the store fixture

from dstui.analysis import fetch
from dstui.analysis.grouping import assign_labels
from dstui.analysis.rundata import RunData
from dstui.analysis.stats import condition_stats

FOLDER = "/home/u/runs/cmp-20260101-000000"


def attempt(client: Any, exp_id: str, parent: str, cond: str, n: int, status: str, base: float) -> str:
    hist = {"iter_time": [(s, base) for s in range(1, 6)], "loss": [(s, 3.0 - 0.1 * s) for s in range(1, 6)]}
    return log_run(client, exp_id, parent, condition=cond, status=status, history=hist,
                   reason="exit code 1" if status == "failed" else "",
                   tags={"dstui.run_dir": f"{FOLDER}/{cond}-r0#{n}"})  # fmt: skip


def test_only_the_newest_attempt_of_a_run_is_counted(store: tuple[Any, str, str]) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, "cmp-20260101-000000")
    attempt(client, exp_id, parent, "z0", 1, "done", 0.1)
    failed = attempt(client, exp_id, parent, "z1", 1, "failed", 0.3)
    first_done = attempt(client, exp_id, parent, "z1", 2, "done", 0.2)
    newest = attempt(client, exp_id, parent, "z1", 3, "done", 0.25)  # retried with --force

    _, runs = fetch.fetch_runs(client, EXP)
    z1 = [r for r in runs if r.condition == "z1"]
    assert [r.run_id for r in z1] == [newest]
    assign_labels(runs)
    stats = {cs.condition: cs for cs in condition_stats(runs)}
    assert (stats["z1"].n_runs, stats["z1"].n_failed) == (1, 0)

    # runs picked by id are the user's choice: every attempt stays
    _, picked = fetch.fetch_runs(client, EXP, run_ids=[failed, first_done, newest])
    assert sorted(r.run_id for r in picked) == sorted([failed, first_done, newest])


def test_runs_without_a_folder_tag_all_stay(store: tuple[Any, str, str]) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, "cmp-20260101-000000")
    ids = {log_run(client, exp_id, parent, condition="imp", repeat=r, tags={"dstui.run_dir": tag})
           for r, tag in enumerate(["", "no-attempt-number", f"{FOLDER}/x#notanumber"])}  # fmt: skip
    _, runs = fetch.fetch_runs(client, EXP)
    assert {r.run_id for r in runs} == ids


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", ""]), st.integers(1, 6)), max_size=20))
def test_one_run_per_folder_and_it_is_the_highest_attempt(attempts: list[tuple[str, int]]) -> None:
    base = RunData(run_id="", run_name="", experiment_id="1", condition="c", revision="installed",
                   repeat=0, kind="train", status="done", reason="", mlflow_status="FINISHED", start_time=None,
                   params={}, tags={}, metrics={})  # fmt: skip
    runs = [dataclasses.replace(base, run_id=f"{i}", tags={"dstui.run_dir": f"{folder}#{n}" if folder else ""})
            for i, (folder, n) in enumerate(attempts)]  # fmt: skip
    kept = fetch.newest_attempts(runs)
    untagged = [r for r in runs if not r.tags["dstui.run_dir"]]
    assert [r for r in kept if not r.tags["dstui.run_dir"]] == untagged
    for folder in {f for f, _ in attempts if f}:
        mine = [r for r in kept if r.tags["dstui.run_dir"].startswith(f"{folder}#")]
        assert len(mine) == 1
        assert int(mine[0].tags["dstui.run_dir"].split("#")[1]) == max(n for f, n in attempts if f == folder)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", ""]), st.integers(1, 6), st.booleans()), max_size=20))
def test_the_attempt_tag_and_the_older_folder_hash_count_alike(attempts: list[tuple[str, int, bool]]) -> None:
    """dstui.attempt beside a plain folder (written now) and '<folder>#<n>' (written before) in one experiment."""
    base = RunData(run_id="", run_name="", experiment_id="1", condition="c", revision="installed",
                   repeat=0, kind="train", status="done", reason="", mlflow_status="FINISHED", start_time=None,
                   params={}, tags={}, metrics={})  # fmt: skip

    def tags(folder: str, n: int, new: bool) -> dict[str, str]:
        if not folder:
            return {}
        return {"dstui.run_dir": f"/runs/{folder}", "dstui.attempt": str(n)} if new else {"dstui.run_dir": f"/runs/{folder}#{n}"}

    runs = [dataclasses.replace(base, run_id=f"{i}", tags=tags(*a)) for i, a in enumerate(attempts)]
    kept = fetch.newest_attempts(runs)
    assert [r for r in kept if not r.tags] == [r for r in runs if not r.tags]
    for folder in {f for f, _, _ in attempts if f}:
        mine = [r for r in kept if r.tags and r.tags["dstui.run_dir"].split("#")[0] == f"/runs/{folder}"]
        assert len(mine) == 1
        (n, _) = attempts[int(mine[0].run_id)][1:]
        assert n == max(m for f, m, _ in attempts if f == folder)
