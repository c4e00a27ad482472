"""Spec validation as a new user meets it: every name the spec uses must exist, and a refusal says which it meant.

Each test writes a real YAML file and reads it through the real loader (load_spec, expand_file,
batch.plan: what `dstui list`, `dstui run --dry-run` and the TUI's Compose use), so a spec that
passes here is one the CLI would call "validated".
"""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml
from helpers import dstui
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.core.errors import SpecError
from dstui.execute import batch
from dstui.spec import dsconfig
from dstui.spec.experiment import ExperimentSpec, Guard, Revision, SlurmOptions
from dstui.spec.loading import expand_file, load_spec
from dstui.spec.settings import SETTING_NAMES

GRID = {"name": "g", "axes": {"zero_stage": [1, 2]}}


def write(tmp: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    return path


def refusal(path: Path) -> SpecError:
    """The error the loader gives, checked to be one line that starts with the file."""
    with pytest.raises(SpecError) as err:
        load_spec(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and "\n" not in text, text
    return err.value


# -- 1. baseline --------------------------------------------------------------


def test_baseline_that_names_no_condition_is_refused_at_load(tmp_path: Path) -> None:
    path = write(tmp_path, {**GRID, "baseline": "z9"})
    e = refusal(path)
    assert str(e) == f"{path}: field 'baseline': 'z9' is not a condition of this spec (conditions: z1, z2)"
    # the CLI's loader (list, run, run --dry-run) refuses it before calling anything validated
    with pytest.raises(SpecError, match="'z9' is not a condition"):
        batch.plan(path, validate=False, resolve_revisions=False)


def test_baseline_typo_gets_the_nearest_condition(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "g", "axes": {"zero_stage": [1, 3], "offload": ["none", "cpu"]}, "baseline": "z3-ofcpu"})
    assert "'z3-ofcpu' is not a condition of this spec; did you mean 'z3-offcpu'" in str(refusal(path))


def test_baseline_renamed_by_a_new_axis_points_at_its_new_names(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "g", "axes": {"zero_stage": [0, 1], "dtype": ["fp32", "bf16"]}, "baseline": "z0"})
    assert "did you mean 'z0-fp32' or 'z0-bf16'?" in str(refusal(path))


def test_baseline_may_name_explicit_conditions_and_be_left_out_by_only(tmp_path: Path) -> None:
    path = write(tmp_path, {**GRID, "conditions": [{"name": "ref", "zero_stage": 0}], "baseline": "ref"})
    assert load_spec(path).baseline == "ref"
    # --only narrows the batch, not the spec: the baseline is a condition of the whole spec
    plan = batch.plan(path, validate=False, resolve_revisions=False, only=["z1"])
    assert [r.condition for r in plan.runs] == ["z1"]


def test_baseline_removed_by_an_exclusion_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "g", "axes": {"zero_stage": [1, 3]}, "exclude": [{"zero_stage": 3}], "baseline": "z3"})
    e = refusal(path)
    assert e.field == "baseline"
    assert "'z3' is removed by exclude.0 {zero_stage: 3} (conditions: z1)" in str(e)


def test_guard_baseline_is_checked_like_the_baseline(tmp_path: Path) -> None:
    e = refusal(write(tmp_path, {**GRID, "guard": {"baseline": "z7", "rtol": 0.1}}))
    assert e.field == "guard.baseline" and "(conditions: z1, z2)" in str(e)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(baseline=st.text(min_size=1, max_size=30).filter(lambda s: s not in ("z1", "z2")))
def test_any_baseline_not_among_the_conditions_is_one_line(tmp_path_factory, baseline: str) -> None:
    path = write(tmp_path_factory.mktemp("b"), {**GRID, "baseline": baseline})
    e = refusal(path)
    assert e.field == "baseline"


@pytest.mark.e2e  # the real CLI in a subprocess
def test_cli_list_and_dry_run_refuse_a_baseline_that_names_no_condition(tmp_path: Path) -> None:
    path = write(tmp_path, {**GRID, "baseline": "z9"})
    env = {"DSTUI_HOME": str(tmp_path / "home"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"}
    for args in (("list", str(path)), ("run", "--dry-run", str(path))):
        proc = dstui(*args, env=env)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "validated: True" not in proc.stdout
        assert "field 'baseline': 'z9' is not a condition of this spec (conditions: z1, z2)" in proc.stderr
        assert "Traceback" not in proc.stderr


# -- 2. exclusions --------------------------------------------------------------


def test_exclusion_with_a_typo_key_is_refused_with_the_key_it_meant(tmp_path: Path) -> None:
    path = write(tmp_path, {**GRID, "exclude": [{"zero_stag": 1}]})
    e = refusal(path)
    assert e.field == "exclude.0.zero_stag"
    assert "unknown exclusion key 'zero_stag'; did you mean 'zero_stage'?" in str(e)


def test_exclusion_on_a_setting_the_spec_does_not_give_is_refused(tmp_path: Path) -> None:
    e = refusal(write(tmp_path, {**GRID, "exclude": [{"dtype": "bf16"}]}))
    assert e.field == "exclude.0.dtype" and "not an axis or a setting of this spec" in str(e)


def test_exclusion_that_matches_no_combination_is_refused(tmp_path: Path) -> None:
    e = refusal(write(tmp_path, {**GRID, "exclude": [{"zero_stage": 1}, {"zero_stage": 3}]}))
    assert e.field == "exclude.1"
    assert "exclusion {zero_stage: 3} matches no axis combination (zero_stage takes 1, 2)" in str(e)
    e = refusal(write(tmp_path, {"name": "c", "conditions": [{"name": "a"}], "settings": {"dtype": "bf16"},
                                 "exclude": [{"dtype": "bf16"}]}))  # fmt: skip
    assert "this spec has no axes" in str(e)


def test_empty_exclusion_is_refused(tmp_path: Path) -> None:
    assert refusal(write(tmp_path, {**GRID, "conditions": [{"name": "a"}], "exclude": [{}]})).field == "exclude.0"


def test_exclusions_that_match_still_drop_runs(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "g", "settings": {"dtype": "bf16"}, "axes": {"zero_stage": [1, 2, 3]},
                            "exclude": [{"zero_stage": 2, "dtype": "bf16"}], "baseline": "z3"})  # fmt: skip
    _, runs = expand_file(path)
    assert [r.condition for r in runs] == ["z1", "z3"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(alphabet=string.ascii_letters + "_ -.", min_size=1, max_size=20).filter(lambda k: k != "zero_stage"))
def test_any_exclusion_key_the_spec_does_not_give_is_refused(tmp_path_factory, key: str) -> None:
    e = refusal(write(tmp_path_factory.mktemp("x"), {**GRID, "exclude": [{key: 1}]}))
    assert e.field == f"exclude.0.{key}"


# -- 3. allowed values, in the user's words --------------------------------------


def test_zero_stage_out_of_range_names_zero_stage_and_its_values(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "z", "axes": {"zero_stage": [1, 5]}})
    with pytest.raises(SpecError) as err:
        expand_file(path)
    assert str(err.value) == f"{path}: condition 'z5': field 'zero_stage': must be one of 0, 1, 2, 3 (got 5)"


def test_choice_fields_list_each_allowed_value_once(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "d", "settings": {"dtype": "fp8"}})
    with pytest.raises(SpecError, match=r"field 'dtype': must be one of 'fp32', 'bf16', 'fp16' \(got 'fp8'\)$"):
        expand_file(path)
    e = refusal(write(tmp_path, {"name": "d", "executor": "slrum"}))
    assert str(e).endswith("field 'executor': must be one of 'local', 'slurm' (got 'slrum')")


def test_deepspeed_refusal_names_the_setting_and_lists_values_once() -> None:
    """DeepSpeed's enum for the stage has an alias, so pydantic lists 3 twice and names its own field 'stage'."""
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 5}}
    with pytest.raises(SpecError) as err:
        dsconfig.validate(cfg, world_size=1, condition="c", file="s.yaml")
    assert err.value.field == "zero_stage"
    assert "must be one of 0, 1, 2, 3 (got 5)" in str(err.value) and "3 or 3" not in str(err.value)


# -- 4. unknown keys, at every level ---------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "meant"),
    [
        ({"name": "x", "repeat": 3}, "repeat", "repeats"),
        ({"name": "x", "settings": {"zero_stag": 1}}, "settings.zero_stag", "zero_stage"),
        ({"name": "x", "axes": {"micro_bach": [1, 2]}}, "axes.micro_bach", "micro_batch"),
        ({"name": "x", "conditions": [{"name": "a", "zero_stag": 1}]}, "conditions.0.zero_stag", "zero_stage"),
        ({"name": "x", "revisions": [{"name": "a", "pypi": "0.18.0", "instal": "pip"}]}, "revisions.0.instal", "install"),
        ({"name": "x", "slurm": {"partiton": "gpu"}}, "slurm.partiton", "partition"),
        ({"name": "x", "guard": {"rtl": 0.1}}, "guard.rtl", "rtol"),
    ],
)
def test_unknown_keys_suggest_the_nearest_name(tmp_path: Path, data: dict, field: str, meant: str) -> None:
    e = refusal(write(tmp_path, data))
    assert e.field == field
    assert f"did you mean '{meant}'" in str(e)


def test_unknown_nested_setting_suggests_within_its_own_options(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "x", "settings": {"launcher": {"hostfil": "hosts"}}})
    with pytest.raises(SpecError) as err:
        expand_file(path)
    assert str(err.value) == f"{path}: condition 'base': field 'launcher.hostfil': unknown key 'hostfil'; did you mean 'hostfile'?"


def test_unknown_key_with_nothing_close_lists_the_valid_names(tmp_path: Path) -> None:
    e = refusal(write(tmp_path, {"name": "x", "qqqqqq": 1}))
    assert "unknown key 'qqqqqq'; known: name, description, settings, axes" in str(e)


LEVELS = [
    (lambda k: {"name": "x", k: 1}, list(ExperimentSpec.model_fields)),
    (lambda k: {"name": "x", "settings": {k: 1}}, list(SETTING_NAMES)),
    (lambda k: {"name": "x", "conditions": [{"name": "a", k: 1}]}, list(SETTING_NAMES)),
    (lambda k: {"name": "x", "revisions": [{"name": "a", "pypi": "0.18.0", k: 1}]}, list(Revision.model_fields)),
    (lambda k: {"name": "x", "slurm": {k: 1}}, list(SlurmOptions.model_fields)),
    (lambda k: {"name": "x", "guard": {k: 1}}, list(Guard.model_fields)),
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(level=st.integers(0, len(LEVELS) - 1), data=st.data())
def test_a_key_one_letter_short_is_refused_with_the_key_it_was(tmp_path_factory, level: int, data) -> None:
    make, valid = LEVELS[level]
    meant = data.draw(st.sampled_from([k for k in valid if len(k) >= 4 and k != "name"]))
    i = data.draw(st.integers(0, len(meant) - 1))
    typo = meant[:i] + meant[i + 1 :]
    if typo in valid:
        return
    e = refusal(write(tmp_path_factory.mktemp("k"), make(typo)))
    assert f"'{meant}'" in str(e).split("did you mean", 1)[-1], str(e)


# -- 5. revisions: every error starts with the file ---------------------------------


def test_revision_that_is_no_version_is_refused_at_load_naming_the_file(tmp_path: Path) -> None:
    e = refusal(write(tmp_path, {"name": "r", "revisions": [{"name": "a", "pypi": "banana"}]}))
    assert e.field == "revisions.0.pypi" and "'banana' is not a version number" in str(e)


def test_repeated_revision_names_are_refused_at_load_naming_the_file(tmp_path: Path) -> None:
    revs = [{"name": "a", "pypi": "0.18.0"}, {"name": "a", "pypi": "0.17.0"}]
    e = refusal(write(tmp_path, {"name": "r", "revisions": revs}))
    assert e.field == "revisions" and "repeated: a" in str(e)


def test_errors_found_after_loading_are_given_the_file() -> None:
    from dstui.spec.loading import naming_file

    with pytest.raises(SpecError) as err, naming_file("s.yaml"):
        raise SpecError("revision 'a': no such folder /x", field="revisions.a.git")
    assert str(err.value) == "s.yaml: field 'revisions.a.git': revision 'a': no such folder /x"
    assert err.value.args == (str(err.value),)


def test_a_revision_refused_when_resolved_names_the_spec_file(tmp_path: Path) -> None:
    """`dstui run` resolves revisions after loading; its refusal still starts with the file, as a load error does."""
    spec = write(tmp_path, {"name": "r", "settings": {"model": "tiny-llama"},
                            "revisions": [{"name": "mine", "path": str(tmp_path / "no-such-clone")}]})  # fmt: skip
    with pytest.raises(SpecError) as err:
        batch.plan(spec, validate=False, resolve_revisions=True)
    assert str(err.value).startswith(f"{spec}: field 'revisions.mine."), str(err.value)
    assert "no-such-clone" in str(err.value)


revision_dicts = st.dictionaries(
    st.sampled_from(["name", "pypi", "git", "ref", "path", "installed", "install", "instal", "pipy"]),
    st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.text(max_size=8), st.sampled_from(["0.18.0", "a", "pip"])),
    max_size=4,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(revs=st.lists(revision_dicts, max_size=3))
def test_every_revisions_error_starts_with_the_file(tmp_path_factory, revs: list) -> None:
    path = write(tmp_path_factory.mktemp("r"), {"name": "r", "revisions": revs})
    try:
        expand_file(path)
    except SpecError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e), str(e)
