"""The runner flags and the Settings model agree: every setting a runner takes has its flag, and back.

The runners' argparse (runners/train_args.py, runners/parity_options.py) and the
launcher's argv (dstui.execute.launch) are derived from the Settings model
(dstui.spec.flags). These tests read the real parsers: a setting added without a
runner flag, a hand-written flag named like a setting but not declared on it, or
a flag whose type cannot carry the setting's value fails here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from helpers import RunnerModule

from dstui.core.rundir import RunDir
from dstui.execute import launch
from dstui.spec import flags
from dstui.spec.experiment import RunSpec
from dstui.spec.settings import Settings

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runners"))

import train_args  # noqa: E402

# Settings that dstui itself acts on (how to start, watch and configure a run), never a runner flag.
# A new setting must be declared for a runner (``runners`` on its Field) or listed here, on purpose.
DSTUI_ONLY = {
    "kind", "gpus", "nodes", "ds_config", "ds_overrides", "command", "metrics_format", "launcher", "env",
    "env_visible", "extra_args", "hung_after_s", "stall_after_s", "max_runtime_s",
}  # fmt: skip
# Flags of a runner's own that carry a setting's name with another meaning: --ds-config is the path of
# the finished config dstui wrote, Settings.ds_config the template it was built from.
SAME_NAME_OTHER_MEANING = {"ds_config"}
# Where the parity runner's standalone defaults differ from the model (short runs, a large lr).
PARITY_DEFAULTS = {"seq_length": 64, "steps": 5, "lr": 1e-3, "zero_stage": 1}

parity_options = RunnerModule("parity_options")  # torch at first use, not at every worker's collection
PARSERS = {"train": train_args.build_parser, "verify": lambda: parity_options.build_parser()}


def _setting_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        a.dest: a for a in parser._actions if a.dest in Settings.model_fields and a.dest not in SAME_NAME_OTHER_MEANING
    }


def _other(name: str) -> Any:
    """A valid value of the setting that is not its default (so a lost value shows)."""
    field = Settings.model_fields[name]
    base = flags.base_type(field.annotation)
    if base is bool:
        return True
    if get_origin(base) is Literal:
        return next(c for c in get_args(base) if c != field.default)
    if name == "zero_stage":
        return 3
    if base is int:
        return (field.default or 0) + 2
    if base is float:
        return 0.25 if name in ("dataset_percent", "rtol", "atol") else (field.default or 1.0) * 3
    return f"value-of-{name}"


def test_every_setting_is_a_runner_flag_or_dstuis_own() -> None:
    declared = {n for kind in flags.RUNNER_KINDS for n in flags.runner_settings(kind)}
    assert declared.isdisjoint(DSTUI_ONLY)
    assert declared | DSTUI_ONLY == set(Settings.model_fields), "declare the new setting for a runner or in DSTUI_ONLY"


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_runner_parser_has_exactly_the_declared_setting_flags(kind: str) -> None:
    actions = _setting_actions(PARSERS[kind]())
    assert set(actions) == set(flags.runner_settings(kind))
    for name, action in actions.items():
        assert flags.flag(name) in action.option_strings, name
        desc = Settings.model_fields[name].description or ""
        assert desc and action.help and action.help.startswith(desc.rstrip(".")), name  # help = the description


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_runner_defaults_are_the_models(kind: str) -> None:
    args = PARSERS[kind]().parse_args([])
    for name in flags.runner_settings(kind):
        want = PARITY_DEFAULTS.get(name, Settings.model_fields[name].default) if kind == "verify" else Settings.model_fields[name].default
        assert getattr(args, name) == want, name


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_every_setting_survives_launch_argv_to_runner_args(kind: str) -> None:
    """Types agree: a non-default value of every flag goes through launch's argv and the runner's parser unchanged."""
    values = {name: _other(name) for name in flags.runner_settings(kind)}
    s = Settings.model_construct(**{**Settings().model_dump(), "kind": kind, **values})
    run = RunSpec(experiment="e", condition="c", settings=s)
    argv = launch.script_args(run, RunDir(Path("/nonexistent/run")))
    assert argv[0].endswith(("train.py", "compare_loss.py"))
    args = PARSERS[kind]().parse_args(argv[1:])
    for name, value in values.items():
        got = getattr(args, name)
        assert got == value and type(got) is type(value), (name, got, value)
    assert args.ds_config == "/nonexistent/run/ds_config.json"


def test_a_flag_the_model_cannot_express_is_refused() -> None:
    """The derivation fails loudly instead of writing a flag that cannot carry the setting."""
    for name in ("launcher", "env", "command"):
        with pytest.raises(TypeError, match=name):
            flags.argparse_kwargs(name)


def test_train_settings_of_rebuilds_the_settings() -> None:
    args = train_args.build_parser().parse_args(["--zero-stage", "2", "--offload", "cpu", "--steps", "4", "--warmup-steps", "1"])
    s = train_args.settings_of(args)
    assert (s.zero_stage, s.offload, s.steps, s.warmup_steps, s.kind) == (2, "cpu", 4, 1, "train")


def test_parity_settings_of_rebuilds_the_settings() -> None:
    args = parity_options.parse_args(["--zero_stage", "3", "--offload-params", "cpu", "--dtype", "torch.bfloat16",
                                      "--use_torch_adam", "--mirror-zero3-hooks"])  # fmt: skip
    s = parity_options.settings_of(args, world=2)
    assert (s.kind, s.zero_stage, s.offload_params, s.dtype, s.torch_adam, s.mirror_zero3_hooks, s.gpus) == (
        "verify", 3, "cpu", "bf16", True, True, 2)  # fmt: skip
