"""Compose's YAML texts: mappings, lists and nested options of a setting, exclusions, explicit
conditions and the spec's run options (no textual here).

A text is untrusted typing: bounded (:data:`MAX_TEXT`), read with PyYAML (JSON is
YAML too) within bounded_yaml's limits, and checked against what it fills (the Settings field's own type via
pydantic, setting names for exclusions and conditions) before it reaches the
spec mapping. Whatever does not fit is a ValueError with one line to show.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from dstui.core.errors import SpecError
from dstui.spec import bounded_yaml
from dstui.spec.bounded_yaml import SpecLimit
from dstui.spec.settings import SETTING_NAMES, Settings
from dstui.tui import compose_model as cm

MAX_TEXT = 64 * 1024  # a text longer than this is refused, not parsed


def yaml_text(value: Any) -> str:
    """A value as the form's YAML text; empty for nothing (an empty mapping or list, None)."""
    if value in (None, {}, []):
        return ""
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=None, allow_unicode=True, width=4096)


def read_yaml(text: str, what: str) -> Any:
    """The value of a YAML (or JSON) text; ValueError with the line when it is not YAML."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"{what}: {len(text)} characters; at most {MAX_TEXT}")
    try:
        return bounded_yaml.load(text) if text.strip() else None
    except SpecLimit as e:
        raise ValueError(f"{what}: {e.message}") from None
    except SpecError as e:
        raise ValueError(f"{what}: not valid YAML/JSON{e.message.removeprefix('invalid YAML')}") from None


def _check_value(field: str, value: Any) -> str | None:
    """None when ``value`` fits the Settings field's type, else pydantic's first complaint."""
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(Settings.model_fields[field].annotation).validate_python(value)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        return (f"{loc}: " if loc else "") + err["msg"]
    return None


def parse_yaml_field(field: str, text: str) -> list[Any]:
    """The values of a YAML field: one value of the field's type, or a list of them (an axis); [] when empty."""
    what = cm.label_of(field)
    value = read_yaml(text, what)
    if value is None:
        return []
    why = _check_value(field, value)
    if why is None:
        return [value]
    if isinstance(value, list) and len(value) > 1 and all(_check_value(field, v) is None for v in value):
        return value  # several values: an axis
    raise ValueError(f"{what}: {why}")


def parse_exclusions(text: str) -> list[dict[str, Any]]:
    """Exclusions: a list of partial matches (setting: value); ValueError names the bad item."""
    value = read_yaml(text, "exclusions")
    if value is None:
        return []
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ValueError("exclusions: a list of mappings, e.g. - {zero_stage: 0, offload: cpu}")
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not item:
            raise ValueError(f"exclusions item {i + 1}: a mapping of setting: value")
        bad = [k for k in item if k not in SETTING_NAMES]
        if bad:
            raise ValueError(f"exclusions item {i + 1}: unknown setting '{bad[0]}'")
    return value


def parse_conditions(text: str) -> list[dict[str, Any]]:
    """Explicit conditions: a list of {name, setting: value...}; ValueError names the bad item."""
    value = read_yaml(text, "conditions")
    if value is None:
        return []
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ValueError("conditions: a list of mappings, e.g. - {name: fast, micro_batch: 4}")
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ValueError(f"conditions item {i + 1}: a mapping with a 'name'")
        bad = [k for k in item if k != "name" and k not in SETTING_NAMES]
        if bad:
            raise ValueError(f"conditions item {i + 1} ({item['name']}): unknown setting '{bad[0]}'")
    return value


# the spec's own options besides settings, axes, exclusions, conditions, repeats, revisions, baseline
RUN_OPTIONS = ("description", "executor", "slurm", "guard", "skip_predicted_oom", "gpu_memory_gib", "tune")


def run_options(data: dict[str, Any]) -> dict[str, Any]:
    return {k: data[k] for k in RUN_OPTIONS if k in data}


def parse_run_options(text: str) -> dict[str, Any]:
    """The 'run options' text: a mapping of executor, slurm, guard, ...; ValueError when something else."""
    value = read_yaml(text, "run options")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"run options: a mapping of {', '.join(RUN_OPTIONS)}")
    bad = [k for k in value if k not in RUN_OPTIONS]
    if bad:
        raise ValueError(f"run options: '{bad[0]}' is not one; known: {', '.join(RUN_OPTIONS)}")
    return value


def set_run_options(data: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for k in RUN_OPTIONS:
        if k in options:
            out[k] = options[k]
        else:
            out.pop(k, None)
    return out
