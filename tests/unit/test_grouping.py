"""Which runs are repeats of one condition: grouped by what ran, never by what a record lacks (issue 38.1).

The runs are :class:`RunData` records laid out as the supervisor writes them to MLflow (the
params of ``dstui.execute.mlflow_params``: settings at creation, the runner's header values once
it reported them); ``tests/e2e/test_report_batches.py`` runs the same story with real DeepSpeed
runs and a real store. Here the properties: never-started runs and missing values never change
the grouping, different settings always do.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dstui.analysis import identity
from dstui.analysis.comparable import numerics_differences
from dstui.analysis.grouping import assign_labels
from dstui.analysis.results import compute
from dstui.analysis.rundata import RunData
from dstui.analysis.stats import condition_stats

# what a child run of a train runner holds once its runner reported the header
SETTINGS = {
    "model": "tiny-llama", "dataset": "tiny-corpus", "seq_length": "64", "micro_batch": "2", "grad_accum": "1",
    "steps": "6", "warmup_steps": "2", "log_interval": "1", "dtype": "fp32", "zero_stage": "1", "lr": "0.0001",
    "seed": "42", "gpus": "2", "nodes": "1", "torch_adam": "true", "optimizer": "torch.optim.AdamW",
    "scheduler": "constant", "ds.gradient_clipping": "1.0", "ds.zero_optimization.overlap_comm": "true",
}  # fmt: skip
HEADER = {
    "deepspeed.version": "0.19.8", "deepspeed.source": "installed", "world_size": "2", "tokens_per_step": "256",
    "model.heads": "4", "model.hidden": "64", "model.layers": "2", "model.vocab": "512", "model.kv_heads": "4",
    "model.parameters": "166208", "model.flops_per_token": "1095552.0",
}  # fmt: skip
HEADER_TAGS = {"dstui.device": "cpu", "dstui.version.deepspeed": "0.19.8", "dstui.version.torch": "2.13.0+cpu"}
_ids = iter(range(10**9))


def run(condition: str, *, status: str = "done", reason: str = "", header: bool = True, batch: str = "b1",
        revision: str = "installed", drop: tuple[str, ...] = (), **changed: str) -> RunData:  # fmt: skip
    """A child run as MLflow holds it: settings always, header values only once the runner reported them."""
    params = {**SETTINGS, **(HEADER if header else {}), **changed}
    tags = {"dstui.batch": batch, **(HEADER_TAGS if header else {})}
    for key in drop:
        params.pop(key, None)
        tags.pop(key, None)
    n = next(_ids)
    r = RunData(run_id=f"id{n}", run_name=f"{condition}-r0", experiment_id="1", condition=condition,
                revision=revision, repeat=0, kind="train", status=status, reason=reason, mlflow_status="FINISHED",
                start_time=n, params=params, tags=tags, metrics={})  # fmt: skip
    r.stats = {"points": 6} if status == "done" else {}
    return r


def partition(runs: list[RunData]) -> set[frozenset[str]]:
    """The grouping as sets of run ids (labels aside): what 'the same grouping' means."""
    groups: dict[str, set[str]] = {}
    for r in runs:
        if r.started:
            groups.setdefault(r.label, set()).add(r.run_id)
    return {frozenset(g) for g in groups.values()}


def never_started(condition: str) -> RunData:
    return run(condition, status="killed", reason="cancelled before start", header=False)


# -- the lrsweep story of issue 38 --------------------------------------------------


def lrsweep(batch: str, steps: str = "6") -> list[RunData]:
    return [run(f"z{z}-lr{lr}", batch=batch, zero_stage=str(z), lr=lr, steps=steps)
            for z in (1, 2) for lr in ("0.0001", "0.001")]  # fmt: skip


def test_a_cancelled_batch_changes_no_verdict_and_no_setting_differs_by_a_missing_value() -> None:
    clean = lrsweep("b1")
    second = lrsweep("b2")
    second[0].status, second[0].reason = "killed", "cancelled"  # cancelled while it trained: a started run
    for r in second[1:]:  # cancelled before they started: no header, nothing ran
        r.status, r.reason = "killed", "cancelled before start"
        r.params = {k: v for k, v in r.params.items() if k not in HEADER}
        r.tags = {"dstui.batch": "b2"}
    res = compute([*clean, *second])
    assert [c.label for c in res.conds] == ["z1-lr0.0001", "z1-lr0.001", "z2-lr0.0001", "z2-lr0.001"]
    assert [c.n_runs for c in res.conds] == [2, 1, 1, 1]  # never-started runs are no repeats
    assert [r.run_id for r in res.not_started] == [r.run_id for r in second[1:]]
    # z2 vs z1 at one lr: same numerics (no "model.heads (unset)/4 vs 4")
    z1, _, z2, _ = res.conds
    assert numerics_differences(z2.runs, z1.runs) == []
    # the varying settings are what the spec varied, nothing a cancelled record lacks
    assert identity.common_and_varying(res.started)[1] == ["lr", "zero_stage"]
    assert res.notes == []  # nothing split, nothing pooled that a reader must be told


def test_batches_with_different_steps_are_never_repeats_of_one_condition() -> None:
    runs = [*lrsweep("b1", steps="300"), *lrsweep("b2", steps="200")]
    res = compute(runs)
    assert len(res.conds) == 8 and all(c.n_runs == 1 for c in res.conds)
    assert {c.label for c in res.conds} >= {"z1-lr0.0001 (steps=300)", "z1-lr0.0001 (steps=200)"}
    assert res.notes == ["z1-lr0.0001, z1-lr0.001, z2-lr0.0001, z2-lr0.001: their runs ran with different settings "
                         "(steps: 300 / 200): reported as 2 conditions each, never as repeats of one."]  # fmt: skip
    # a run of each part is in the part whose steps it ran
    for c in res.conds:
        assert {r.params["steps"] for r in c.runs} == {c.settings["steps"]}


def test_a_started_run_without_a_header_joins_its_condition() -> None:
    """Killed during start-up: no world size, no model shape; it is still a repeat (not a condition of its own)."""
    done, early = run("z1"), run("z1", status="killed", reason="cancelled", header=False)
    res = compute([done, early])
    (c,) = res.conds
    assert c.n_runs == 2 and c.n_usable == 1 and c.statuses == "1 done, 1 killed"


def test_an_empty_setting_on_one_side_is_a_difference_an_unknown_one_is_not() -> None:
    """extra_args is left out of the params when empty: a record with settings and without it ran with none."""
    plain, extra = run("z1"), run("z1", batch="b2", extra_args='["--foo"]')
    res = compute([plain, extra])
    assert sorted(c.label for c in res.conds) == ["z1 (extra_args=(unset))", 'z1 (extra_args=["--foo"])']
    # lr is never empty: a record without it (older) says nothing about it
    older = run("z1", batch="b0", drop=("lr",))
    assert len(compute([run("z1"), older]).conds) == 1


def test_a_pooled_older_record_is_said() -> None:
    newer, older = run("z1"), run("z1", batch="b0", drop=("deepspeed.version", "world_size"))
    res = compute([newer, older])
    assert len(res.conds) == 1
    assert res.notes == ["z1: run z1-r0 (b0) records no deepspeed.version, world_size; pooled with the other runs "
                         "of the condition on the values it does record."]  # fmt: skip


def test_revisions_are_matched_across_their_deepspeed_versions() -> None:
    """Two revisions run different DeepSpeeds by design: one condition, two labels; a changed DeepSpeed under
    one revision name (an upgrade between batches) is two conditions."""
    a = run("z1", revision="stable")
    b = run("z1", revision="main", **{"deepspeed.version": "0.20.0"})
    res = compute([a, b])
    assert [c.label for c in res.conds] == ["z1 @ stable", "z1 @ main"]
    assert {r.condition_label for r in res.started} == {"z1"}
    upgraded = run("z1", batch="b2", **{"deepspeed.version": "0.20.0"})
    assert sorted(c.label for c in compute([run("z1"), upgraded]).conds) == [
        "z1 (deepspeed.version=0.19.8)", "z1 (deepspeed.version=0.20.0)"]  # fmt: skip


# -- properties ---------------------------------------------------------------------

AXES = {"steps": ("6", "200"), "lr": ("0.0001", "0.001"), "zero_stage": ("1", "2")}
identities = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in AXES.items()})
full_runs = st.lists(st.tuples(st.sampled_from(["a", "b"]), identities), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None)
@given(full_runs, st.lists(st.sampled_from(["a", "b", "c"]), max_size=5), st.randoms(use_true_random=False))
def test_never_started_runs_change_no_grouping(spec: list, cancelled: list[str], rnd: random.Random) -> None:
    runs = [run(name, **ident) for name, ident in spec]
    assign_labels(runs)
    before = partition(runs)
    mixed = [*runs, *(never_started(n) for n in cancelled)]
    rnd.shuffle(mixed)
    assign_labels(mixed)
    assert partition(mixed) == before
    assert sum(c.n_runs for c in condition_stats(mixed)) == len(runs)  # never-started: in no condition


@settings(max_examples=60, deadline=None)
@given(full_runs, st.randoms(use_true_random=False))
def test_full_records_group_exactly_by_name_and_settings(spec: list, rnd: random.Random) -> None:
    runs = [run(name, **ident) for name, ident in spec]
    expected: dict[tuple, set[str]] = {}
    for r, (name, ident) in zip(runs, spec, strict=True):
        expected.setdefault((name, tuple(sorted(ident.items()))), set()).add(r.run_id)
    rnd.shuffle(runs)  # the order runs come in decides nothing
    assign_labels(runs)
    assert partition(runs) == {frozenset(g) for g in expected.values()}
    assert len({r.label for r in runs}) == len(expected)  # every condition has a label of its own


droppable = sorted({*HEADER, *HEADER_TAGS, "lr", "steps", "optimizer"})


@settings(max_examples=60, deadline=None)
@given(identities, st.lists(st.lists(st.sampled_from(droppable), unique=True), min_size=1, max_size=8))
def test_missing_values_never_split_a_condition(ident: dict, drops: list[list[str]]) -> None:
    """Runs that ran alike stay one condition however many values their records lack."""
    runs = [run("z1", drop=tuple(d), **ident) for d in drops]
    runs += [run("z1", status="killed", reason="cancelled", header=False, **ident)]
    assign_labels(runs)
    assert len(partition(runs)) == 1
    res = compute(runs)
    assert len(res.conds) == 1 and res.conds[0].n_runs == len(runs)
