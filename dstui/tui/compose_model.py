"""The compose screen's editing model over a spec mapping (no textual here).

A spec is edited as the plain mapping YAML gives (so fields the form does not
show, like ``exclude`` or explicit ``conditions``, survive a save). A form
field with one value goes to ``settings``; with several values it becomes an
axis; with none it falls back to the default.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from dstui.core.paths import CONFIGS_DIR
from dstui.spec.models import Settings

# (field, label, kind, choices) in form order. kind: "choice" (toggles), "list" (comma list)
CHOICES: dict[str, list[Any]] = {
    "zero_stage": [0, 1, 2, 3],
    "offload": ["none", "cpu", "nvme"],
    "offload_params": ["none", "cpu", "nvme"],
    "dtype": ["fp32", "bf16", "fp16"],
    "deepcompile": [False, True],
    "compile": [False, True],
    "activation_checkpointing": [False, True],
}
LIST_FIELDS: dict[str, type] = {
    "model": str,
    "micro_batch": int,
    "seq_length": int,
    "grad_accum": int,
    "gpus": int,
    "steps": int,
}
LABELS = {
    "zero_stage": "ZeRO stage",
    "offload": "optim offload",
    "offload_params": "param offload",
    "dtype": "dtype",
    "deepcompile": "DeepCompile",
    "compile": "torch.compile",
    "activation_checkpointing": "act. checkpt",
    "model": "model",
    "micro_batch": "micro batch",
    "seq_length": "seq length",
    "grad_accum": "grad accum",
    "gpus": "GPUs/node",
    "steps": "steps",
}
FORM_ORDER = (
    "model", "zero_stage", "offload", "offload_params", "deepcompile", "compile", "dtype",
    "micro_batch", "seq_length", "grad_accum", "activation_checkpointing", "gpus", "steps",
)  # fmt: skip


def choice_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def model_presets() -> list[str]:
    return sorted(p.stem for p in (CONFIGS_DIR / "models").glob("*.json"))


def experiment_files() -> list[Path]:
    return sorted((CONFIGS_DIR / "experiments").glob("*.yaml"))


def new_spec(name: str) -> dict[str, Any]:
    return {"name": name or "experiment", "settings": {"model": "tiny-llama", "steps": 10}, "axes": {}}


def default(field: str) -> Any:
    return Settings.model_fields[field].default


def values_of(data: dict[str, Any], field: str) -> list[Any]:
    """The values a form field shows: the axis, else the base setting, else the default."""
    axes = data.get("axes") or {}
    if field in axes and isinstance(axes[field], list):
        return list(axes[field])
    settings = data.get("settings") or {}
    if field in settings:
        return [settings[field]]
    return [default(field)]


def set_values(data: dict[str, Any], field: str, values: list[Any]) -> dict[str, Any]:
    """A copy of ``data`` with the field's values set (one: setting; several: axis)."""
    data = copy.deepcopy(data)
    settings = data.setdefault("settings", {}) or {}
    data["settings"] = settings
    axes = data.get("axes") or {}
    # de-duplicate, keep order
    seen: list[Any] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    if len(seen) > 1:
        axes[field] = seen
        settings.pop(field, None)
    else:
        axes.pop(field, None)
        if seen and seen[0] != default(field):
            settings[field] = seen[0]
        elif seen and field in settings:
            settings[field] = seen[0]  # keep an explicit default that was written
        else:
            settings.pop(field, None)
    data["axes"] = axes
    if not axes:
        data.pop("axes")
    return data


def parse_list(field: str, text: str) -> list[Any]:
    """Comma- or space-separated values of a list field; ValueError names the bad one."""
    kind = LIST_FIELDS[field]
    out: list[Any] = []
    for part in text.replace(",", " ").split():
        if kind is int:
            try:
                out.append(int(part))
            except ValueError:
                raise ValueError(f"{LABELS[field]}: '{part}' is not a whole number") from None
        else:
            out.append(part)
    return out


def list_text(values: list[Any]) -> str:
    return ", ".join(str(v) for v in values)


def set_top(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    if value in (None, ""):
        data.pop(key, None)
    else:
        data[key] = value
    return data


# -- revisions ------------------------------------------------------------------------

REVISION_SOURCES = ("pypi", "git", "path", "installed")


def revision_source(rev: dict[str, Any]) -> tuple[str, str, str]:
    """(source kind, value, ref) of a revision mapping, for the editor's fields."""
    for kind in ("pypi", "git", "path"):
        if rev.get(kind) is not None:
            return kind, str(rev[kind]), str(rev.get("ref") or "")
    return "installed", "", ""


def revision_text(rev: dict[str, Any]) -> str:
    """One line: ``stable: pypi=0.18.0``, ``main: git=~/ds@master``, ``base: installed``."""
    kind, value, ref = revision_source(rev)
    src = "installed" if kind == "installed" else f"{kind}={value}"
    return f"{rev.get('name')}: {src}" + (f"@{ref}" if ref else "")


def make_revision(name: str, kind: str, value: str, ref: str = "") -> dict[str, Any]:
    """A revision mapping from the editor's fields, checked by the spec's own model (ValueError if wrong)."""
    from pydantic import ValidationError

    from dstui.spec.models import Revision

    name, kind, value, ref = name.strip(), kind.strip().lower(), value.strip(), ref.strip()
    if not name:
        raise ValueError("a revision needs a name")
    if kind not in REVISION_SOURCES:
        raise ValueError(f"source must be one of {', '.join(REVISION_SOURCES)} (got '{kind}')")
    rev: dict[str, Any] = {"name": name}
    if kind == "installed":
        rev["installed"] = True
    else:
        if not value:
            raise ValueError(f"'{kind}' needs a value ({'a version' if kind == 'pypi' else 'a folder'})")
        rev[kind] = value
        if ref:
            rev["ref"] = ref
    try:
        Revision.model_validate(rev)
    except ValidationError as e:
        raise ValueError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
    return rev


def put_revision(data: dict[str, Any], rev: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    """Add (index None) or replace a revision; names stay unique."""
    out = copy.deepcopy(data)
    revs = list(out.get("revisions") or [])
    others = [r.get("name") for i, r in enumerate(revs) if i != index and isinstance(r, dict)]
    if rev["name"] in others:
        raise ValueError(f"a revision named '{rev['name']}' exists already")
    if index is None:
        revs.append(rev)
    else:
        revs[index] = rev
    out["revisions"] = revs
    return out


def remove_revision(data: dict[str, Any], index: int) -> dict[str, Any]:
    """Drop a revision; the key goes when the list is empty (the installed DeepSpeed is then used)."""
    out = copy.deepcopy(data)
    revs = list(out.get("revisions") or [])
    del revs[index]
    if revs:
        out["revisions"] = revs
    else:
        out.pop("revisions", None)
    return out
