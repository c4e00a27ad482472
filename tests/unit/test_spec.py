"""Spec models, expansion, names, keys and the bad inputs that must stop a launch."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dstui.core.errors import SpecError
from dstui.core.paths import CONFIGS_DIR
from dstui.spec import dsconfig
from dstui.spec.expand import expand
from dstui.spec.loading import dump_spec, expand_file, load_spec, parse_spec

EXPERIMENTS = sorted((CONFIGS_DIR / "experiments").glob("*.yaml"))


def write(tmp_path: Path, data: object, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def test_axes_product_exclude_and_names() -> None:
    spec = parse_spec(
        {
            "name": "grid",
            "settings": {"steps": 5, "warmup_steps": 1},
            "axes": {"zero_stage": [0, 1, 3], "offload": ["none", "cpu"], "micro_batch": [2]},
            "exclude": [{"zero_stage": 0, "offload": "cpu"}],
        }
    )
    runs = expand(spec)
    names = [r.condition for r in runs]
    # 3 x 2 minus the excluded one; micro_batch has one value so it is not in the name
    assert names == ["z0", "z1", "z1-offcpu", "z3", "z3-offcpu"]
    assert all(r.settings.micro_batch == 2 for r in runs)
    assert [r.order for r in runs] == list(range(5))


def test_named_conditions_and_repeats_interleave_revisions() -> None:
    spec = parse_spec(
        {
            "name": "revs",
            "conditions": [{"name": "a", "zero_stage": 1}, {"name": "b", "zero_stage": 2}],
            "repeats": 2,
            "revisions": [{"name": "old", "pypi": "0.18.0"}, {"name": "new", "installed": True}],
        }
    )
    runs = expand(spec)
    assert [r.name for r in runs] == [
        "a-old-r0", "a-new-r0", "b-old-r0", "b-new-r0",
        "a-old-r1", "a-new-r1", "b-old-r1", "b-new-r1",
    ]  # fmt: skip


def test_run_key_is_stable_and_depends_on_settings() -> None:
    data = {"name": "k", "axes": {"zero_stage": [1, 2]}}
    k1 = [r.key for r in expand(parse_spec(data))]
    k2 = [r.key for r in expand(parse_spec(data))]
    assert k1 == k2 and len(set(k1)) == 2
    changed = [r.key for r in expand(parse_spec({**data, "settings": {"seq_length": 256}}))]
    assert not set(changed) & set(k1)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_specs_expand_and_round_trip(path: Path, tmp_path: Path) -> None:
    spec, runs = expand_file(path)
    saved = write(tmp_path, dump_spec(spec))
    _, again = expand_file(saved)
    assert [(r.name, r.key) for r in again] == [(r.name, r.key) for r in runs]


def test_seed_specs_have_the_seed_conditions() -> None:
    _, runs = expand_file(CONFIGS_DIR / "experiments" / "zero_stages.yaml")
    assert sorted(r.condition for r in runs) == sorted(
        ["z1", "z1-dc", "z2", "z2-dc", "z3", "z3-dc"]
    )
    _, grid = expand_file(CONFIGS_DIR / "experiments" / "profile_grid.yaml")
    # 2 models x (ZeRO 0: 1 + ZeRO 1, 2: 2 optimizer offloads each + ZeRO 3: 2 x 2 with param offload) x 4 batch sizes
    assert len(grid) == 2 * (1 + 2 + 2 + 4) * 4
    assert {r.settings.offload_params for r in grid if r.settings.zero_stage == 3} == {"none", "cpu"}
    assert all(r.settings.offload_params == "none" for r in grid if r.settings.zero_stage < 3)
    _, smoke = expand_file(CONFIGS_DIR / "experiments" / "smoke.yaml")
    assert [r.settings.zero_stage for r in smoke] == [0, 1, 2, 3]
    assert all(r.settings.gpus == 2 for r in smoke)


@pytest.mark.parametrize(
    ("data", "field", "condition", "fragment"),
    [
        ({"name": "x", "settings": {"stag": 1}}, "settings.stag", None, "unknown setting"),
        ({"name": "x", "axes": {"micro_batch": [0]}}, "micro_batch", "base", "greater than or equal to 1"),
        ({"name": "x", "axes": {"zero_stage": [0], "offload": ["cpu"]}}, None, "base", "offload needs ZeRO"),
        ({"name": "x", "conditions": [{"name": "c", "dtype": "fp8"}]}, "dtype", "c", "fp32"),
        ({"name": "x", "conditions": [{"name": "c", "kind": "command"}]}, None, "c", "needs 'command:'"),
        ({"name": "x", "revisions": [{"name": "r", "git": "/tmp/ds"}]}, "revisions.0", None, "'ref'"),
        ({"name": "x", "repeats": 0}, "repeats", None, "greater than or equal to 1"),
        ({"name": "x", "axes": {"zero_stage": []}}, "axes.zero_stage", None, "at least one value"),
    ],
)
def test_bad_specs_name_file_condition_and_field(
    tmp_path: Path, data: dict, field: str | None, condition: str | None, fragment: str
) -> None:
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as err:
        expand_file(path)
    e = err.value
    assert e.file == str(path)
    assert fragment in str(e)
    if field:
        assert e.field is not None and e.field.startswith(field)
    if condition:
        assert e.condition == condition


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = write(tmp_path, "name: x\naxes: [zero_stage: 1\n")
    with pytest.raises(SpecError, match=r"invalid YAML at line \d+"):
        load_spec(bad)
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "nope.yaml")


def test_ds_config_from_template_settings_and_overrides() -> None:
    spec = parse_spec(
        {
            "name": "c",
            "settings": {"zero_stage": 3, "offload": "cpu", "offload_params": "cpu", "dtype": "bf16",
                         "micro_batch": 4, "grad_accum": 2, "deepcompile": True,
                         "ds_overrides": {"zero_optimization": {"overlap_comm": True}}},
        }  # fmt: skip
    )
    (run,) = expand(spec)
    cfg = dsconfig.build(run)
    assert cfg["train_micro_batch_size_per_gpu"] == 4
    assert cfg["gradient_accumulation_steps"] == 2
    assert cfg["zero_optimization"]["stage"] == 3
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert cfg["zero_optimization"]["overlap_comm"] is True  # override beats template
    assert cfg["zero_optimization"]["contiguous_gradients"] is True  # from base.json
    assert cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]
    assert cfg["compile"] == {"deepcompile": True}
    flat = dsconfig.flatten(cfg)
    assert flat["ds.zero_optimization.stage"] == "3"


def test_deepspeed_validation_names_condition_and_field(tmp_path: Path) -> None:
    # DeepSpeed names the key inside its section ('stag'); the user finds it under zero_optimization
    path = write(tmp_path, {"name": "v", "settings": {"ds_overrides": {"zero_optimization": {"stag": 1}}}})
    _, runs = expand_file(path)
    with pytest.raises(SpecError, match="unknown key 'stag'; did you mean 'stage'") as err:
        dsconfig.build_and_validate(runs, file=str(path))
    assert err.value.field == "zero_optimization.stag"
    assert str(err.value).startswith(f"{path}: condition 'base': ")


def test_missing_template_is_named() -> None:
    (run,) = expand(parse_spec({"name": "t", "settings": {"ds_config": "nope.json"}}))
    with pytest.raises(SpecError, match="'nope.json' not found") as err:
        dsconfig.build(run)
    assert err.value.field == "ds_config"


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"zero_stage": 3, "ds_overrides": {"zero_optimization": {"stage": 2}}}, "zero_optimization.stage = 2 contradicts the setting zero_stage = 3"),
        ({"dtype": "bf16", "ds_overrides": {"fp16": {"enabled": True}}}, 'fp16.enabled = true contradicts the setting dtype = "bf16"'),
        ({"ds_overrides": {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}}, 'offload_optimizer.device = "cpu" contradicts the setting offload = "none"'),
        ({"ds_overrides": {"compile": {"deepcompile": True}}}, "compile.deepcompile = true contradicts the setting deepcompile = false"),
        ({"micro_batch": 2, "ds_overrides": {"train_micro_batch_size_per_gpu": 4}}, "contradicts the setting micro_batch = 2"),
    ],
)
def test_overrides_that_contradict_a_setting_are_refused(tmp_path: Path, settings: dict, fragment: str) -> None:
    path = write(tmp_path, {"name": "o", "conditions": [{"name": "c1", **settings}]})
    _, runs = expand_file(path)
    with pytest.raises(SpecError) as err:
        dsconfig.build_and_validate(runs, file=str(path))
    assert fragment in str(err.value)
    assert err.value.condition == "c1" and err.value.field == "ds_overrides"


def test_overrides_that_agree_or_add_options_are_kept() -> None:
    (run,) = expand(parse_spec({"name": "o", "settings": {
        "zero_stage": 2, "ds_overrides": {"zero_optimization": {"stage": 2, "overlap_comm": True}}}}))
    cfg = dsconfig.build(run)
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["zero_optimization"]["overlap_comm"] is True
