"""DeepSpeed config generation and validation.

A template from ``configs/deepspeed/`` holds what settings do not cover
(bucket sizes, communication options, ...); the condition's settings are
written over it, and ``ds_overrides`` over that. Validation is DeepSpeed's
own: :class:`deepspeed.runtime.config.DeepSpeedConfig`, imported lazily so
that the core stays light.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from dstui.core import ds_answers
from dstui.core.errors import SpecError
from dstui.core.paths import CONFIGS_DIR
from dstui.spec import messages
from dstui.spec.experiment import RunSpec
from dstui.spec.settings import Settings

TEMPLATES_DIR = CONFIGS_DIR / "deepspeed"


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def template_path(name: str, *, spec_dir: Path | None = None) -> Path:
    candidates = [Path(name)]
    if spec_dir is not None:
        candidates.append(spec_dir / name)
    candidates.append(TEMPLATES_DIR / name)
    for c in candidates:
        if c.is_file():
            return c
    raise FileNotFoundError(name)


def load_template(
    name: str, *, spec_dir: Path | None = None, condition: str | None = None, file: str | None = None
) -> dict:
    try:
        path = template_path(name, spec_dir=spec_dir)
    except FileNotFoundError:
        raise SpecError(
            f"DeepSpeed config template '{name}' not found (looked in {TEMPLATES_DIR})",
            file=file,
            condition=condition,
            field="ds_config",
        ) from None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"invalid JSON: {e}", file=str(path), condition=condition) from None
    if not isinstance(data, dict):
        raise SpecError("a DeepSpeed config must be a JSON object", file=str(path), condition=condition)
    return data


def _offload(device: str, nvme_path: str) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block


def from_settings(s: Settings) -> dict[str, Any]:
    """The part of a ds_config that a condition's settings decide."""
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "steps_per_print": max(s.steps, 1) * 10,  # dstui logs itself; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": s.zero_stage},
        "bf16": {"enabled": s.dtype == "bf16"},
        "fp16": {"enabled": s.dtype == "fp16"},
    }
    if s.dtype == "fp16":
        cfg["fp16"].update({"initial_scale_power": 8, "loss_scale_window": 100})
    if not s.torch_adam:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": s.lr, "weight_decay": 0.0}}
    elif s.offload != "none":
        cfg["zero_force_ds_cpu_optimizer"] = False
    if s.offload != "none":
        cfg["zero_optimization"]["offload_optimizer"] = _offload(s.offload, s.nvme_path)
    if s.offload_params != "none":
        cfg["zero_optimization"]["offload_param"] = _offload(s.offload_params, s.nvme_path)
    # the runner turns DeepCompile on for `deepcompile: true` and for Ulysses with
    # `sp_mode: deepcompile`: the recorded ds_config (and the ds.* params) must say so too
    if s.deepcompile or (s.sequence_parallel > 1 and s.sp_mode == "deepcompile"):
        cfg["compile"] = {"deepcompile": True}
    if s.sequence_parallel > 1:
        cfg["sequence_parallel_size"] = s.sequence_parallel
    return cfg


# Where a setting lands in the ds_config, and what the config means when the key is absent.
# An override at one of these paths that disagrees with the setting would make the run's
# name, tags and report say one thing while DeepSpeed does another, so it is refused.
_SETTING_PATHS: dict[tuple[str, ...], tuple[str, Any]] = {
    ("train_micro_batch_size_per_gpu",): ("micro_batch", None),
    ("gradient_accumulation_steps",): ("grad_accum", None),
    ("zero_optimization", "stage"): ("zero_stage", 0),
    ("bf16", "enabled"): ("dtype", False),
    ("fp16", "enabled"): ("dtype", False),
    ("zero_optimization", "offload_optimizer", "device"): ("offload", "none"),
    ("zero_optimization", "offload_param", "device"): ("offload_params", "none"),
    ("compile", "deepcompile"): ("deepcompile", False),
    ("sequence_parallel_size",): ("sequence_parallel", 1),
}
SETTING_PATHS = tuple(_SETTING_PATHS)  # ds_config paths a setting decides (MLflow logs the setting, not these twice)
_MISSING = object()


def _at(cfg: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = cfg
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


def check_overrides(s: Settings, *, condition: str | None = None, file: str | None = None) -> None:
    """Refuse ``ds_overrides`` that contradict one of the condition's own settings."""
    ours = from_settings(s)
    for path, (setting, absent) in _SETTING_PATHS.items():
        over = _at(s.ds_overrides, path)
        if over is _MISSING:
            continue
        want = _at(ours, path)
        if want is _MISSING:
            want = absent
        if want is None or over == want:
            continue
        raise SpecError(
            f"ds_overrides.{'.'.join(path)} = {json.dumps(over)} contradicts the setting "
            f"{setting} = {json.dumps(getattr(s, setting))}; change the setting instead",
            file=file,
            condition=condition,
            field="ds_overrides",
        )


def build(run: RunSpec, *, spec_dir: Path | None = None, file: str | None = None) -> dict[str, Any]:
    s = run.settings
    check_overrides(s, condition=run.condition, file=file)
    base = load_template(s.ds_config, spec_dir=spec_dir, condition=run.condition, file=file)
    return deep_merge(deep_merge(base, from_settings(s)), s.ds_overrides)


class _WorldSize:
    """Just enough of an mpu for DeepSpeedConfig to compute batch sizes."""

    def __init__(self, n: int) -> None:
        self._n = n

    def get_data_parallel_world_size(self) -> int:
        return self._n


def validate(cfg: dict[str, Any], *, world_size: int, condition: str | None = None, file: str | None = None) -> None:
    """Check a config with DeepSpeed's own models; raise SpecError naming the field.

    A config this DeepSpeed install accepted before is not checked again
    (:mod:`dstui.core.ds_answers`); a refusal is always DeepSpeed's fresh word.
    """
    ds_answers.remembered("config-accepted", {"config": cfg, "world_size": world_size},
                          lambda: _ask_deepspeed(cfg, world_size=world_size, condition=condition, file=file))  # fmt: skip


def _ask_deepspeed(cfg: dict[str, Any], *, world_size: int, condition: str | None, file: str | None) -> bool:
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:  # pragma: no cover - deepspeed is a runtime need
        raise SpecError("deepspeed is not installed; cannot validate", condition=condition) from None
    from pydantic import ValidationError

    try:
        DeepSpeedConfig(copy.deepcopy(cfg), mpu=_WorldSize(world_size))
    except ValidationError as e:
        err = e.errors()[0]
        field = _user_field(e.title, tuple(str(p) for p in err.get("loc", ())))
        raise SpecError(f"DeepSpeed: {messages.error_message(err, model=_ds_model(e.title))} (in {e.title})", file=file, condition=condition, field=field) from None
    except (AssertionError, ValueError, KeyError, TypeError) as e:
        raise SpecError(f"DeepSpeed: {e}", file=file, condition=condition, field="ds_config") from None
    return True


# DeepSpeed validates each section of the config with its own model, so an error's loc starts
# inside the section; these put the section's key back in front.
_SECTION_OF = {
    "DeepSpeedZeroConfig": ("zero_optimization",),
    "DeepSpeedBF16Config": ("bf16",),
    "DeepSpeedFP16Config": ("fp16",),
    "CompileConfig": ("compile",),
}
_MODULE_OF = {
    "DeepSpeedZeroConfig": "deepspeed.runtime.zero.config",
    "DeepSpeedBF16Config": "deepspeed.runtime.precision_config",
    "DeepSpeedFP16Config": "deepspeed.runtime.precision_config",
    "CompileConfig": "deepspeed.compile.config",
}


def _ds_model(title: str) -> Any:
    """DeepSpeed's model of a config section, so that a mistyped key gets its nearest name; None if unknown."""
    import importlib

    try:
        return getattr(importlib.import_module(_MODULE_OF[title]), title)
    except (KeyError, ImportError, AttributeError):
        return None


def _user_field(title: str, loc: tuple[str, ...]) -> str:
    """The name the user wrote for what DeepSpeed refused: the setting that decides that key, else its ds_config path.

    DeepSpeed names only the key inside its section ('stage' for zero_optimization.stage); the
    user wrote zero_stage, or a ds_overrides / template key, and must be able to find it.
    """
    path = (*_SECTION_OF.get(title, ()), *loc)
    setting = _SETTING_PATHS.get(path)
    if setting is not None:
        return setting[0]
    return ".".join(path) or title


def world_size(s: Settings) -> int:
    """Data-parallel ranks: all ranks divided by the sequence-parallel degree."""
    return max(1, s.gpus * s.nodes // s.sequence_parallel)


def build_and_validate(runs: list[RunSpec], *, file: str | None = None, spec_dir: Path | None = None) -> dict[str, dict]:
    """Configs for every run, keyed by run name; the first bad one raises."""
    out: dict[str, dict] = {}
    checked: dict[str, None] = {}
    for run in runs:
        cfg = build(run, spec_dir=spec_dir, file=file)
        blob = json.dumps(cfg, sort_keys=True) + str(world_size(run.settings))
        if blob not in checked and run.settings.kind != "command":
            validate(cfg, world_size=world_size(run.settings), condition=run.condition, file=file)
            checked[blob] = None
        out[run.name] = cfg
    return out


def flatten(cfg: dict[str, Any], prefix: str = "ds.") -> dict[str, str]:
    """Dotted keys for MLflow params (e.g. ds.zero_optimization.stage)."""
    flat: dict[str, str] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = json.dumps(value) if not isinstance(value, str) else value
    return flat
