"""The compose screen's editing model over a spec mapping (no textual here).

A spec is edited as the plain mapping YAML gives (what ``dstui run`` reads), so
the file can be written back by changing only the edited keys
(:func:`dstui.spec.loading.updated_text`). A form field with one value goes to
``settings``; with several values it becomes an axis; with none it falls back
to the default. Every Settings field has a form row, chosen by its type
(:func:`field_kind`): toggles for booleans and fixed choices, a comma list for
numbers and words, a YAML/JSON text for mappings, lists and nested options
(``ds_overrides``, ``command``, ``launcher``; read by
:mod:`dstui.tui.compose_texts`). :func:`preview_rows` builds the preview's rows.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from dstui.core.paths import CONFIGS_DIR
from dstui.spec.experiment import RunSpec
from dstui.spec.settings import Settings
from dstui.usecases import varying_settings

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
    "dataset_config": "dataset cfg",
    "dataset_percent": "dataset %",
    "sequence_parallel": "seq parallel",
    "mirror_zero3_hooks": "zero3 hooks",
    "metrics_format": "metrics fmt",
    "hung_after_s": "hung after s",
    "stall_after_s": "stall after s",
    "max_runtime_s": "max runtime s",
    "load_weights": "load weights",
}
LABEL_WIDTH = 13  # the form's label column holds this many characters and a space
FORM_ORDER = (
    "model", "zero_stage", "offload", "offload_params", "deepcompile", "compile", "dtype",
    "micro_batch", "seq_length", "grad_accum", "activation_checkpointing", "gpus", "steps",
)  # fmt: skip


def _plain(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without ``| None``, whether None is allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def field_kind(field: str) -> str:
    """How the form edits a Settings field: 'choice' (toggles), 'list' (comma list) or 'yaml' (a text)."""
    if field in CHOICES:
        return "choice"
    if field in LIST_FIELDS:
        return "list"
    ann, _ = _plain(Settings.model_fields[field].annotation)
    if ann is bool or typing.get_origin(ann) is Literal:
        return "choice"
    if ann in (int, float, str):
        return "list"
    return "yaml"


def choices_of(field: str) -> list[Any]:
    if field in CHOICES:
        return CHOICES[field]
    ann, _ = _plain(Settings.model_fields[field].annotation)
    return [False, True] if ann is bool else list(typing.get_args(ann))


def scalar_type(field: str) -> type:
    if field in LIST_FIELDS:
        return LIST_FIELDS[field]
    return _plain(Settings.model_fields[field].annotation)[0]


def label_of(field: str) -> str:
    return LABELS.get(field) or field.replace("_", " ")


# every other Settings field, in the model's order, below the main ones
MORE_ORDER = tuple(f for f in Settings.model_fields if f not in FORM_ORDER)


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
    value = Settings.model_fields[field].get_default(call_default_factory=True)
    return value.model_dump(mode="json", exclude_defaults=True) if hasattr(value, "model_dump") else value


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
    had_settings = "settings" in data
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
    if not settings and not had_settings:
        data.pop("settings")  # an edit undone leaves the mapping as it was
    return data


def parse_list(field: str, text: str) -> list[Any]:
    """Comma-separated values of a list field (numbers: spaces too); ValueError names the bad one."""
    kind = scalar_type(field)
    parts = text.replace(",", " ").split() if kind in (int, float) or field == "model" else [p.strip() for p in text.split(",")]
    out: list[Any] = []
    for part in (p for p in parts if p):
        if kind is int:
            try:
                out.append(int(part))
            except ValueError:
                raise ValueError(f"{label_of(field)}: '{part}' is not a whole number") from None
        elif kind is float:
            try:
                out.append(float(part))
            except ValueError:
                raise ValueError(f"{label_of(field)}: '{part}' is not a number") from None
        else:
            out.append(part)
    return out


# -- the preview's rows ------------------------------------------------------------------

PREVIEW_COLUMNS = ("#", "run", "mem/GPU", "step", "zero", "offload", "compile", "dtype", "mb", "seq", "ga", "gpus", "model", "other")
SHOWN = {"zero_stage", "offload", "offload_params", "deepcompile", "compile", "kind", "dtype", "micro_batch",
         "seq_length", "grad_accum", "gpus", "nodes", "model"}  # fmt: skip
OTHER_MAX = 60


def other_text(r: RunSpec, columns: Sequence[str] = ()) -> str:
    """The run's settings that differ from the defaults and have no column of their own (``columns``:
    the varying ones the preview shows in columns), short."""
    s = r.settings
    parts = []
    for name in Settings.model_fields:
        if name in SHOWN or name in columns:
            continue
        value = getattr(s, name)
        if value == default(name) or (name == "warmup_steps" and value == 2) or name == "steps":
            continue
        if hasattr(value, "model_dump"):
            value = value.model_dump(exclude_defaults=True)
            if not value:
                continue
        text = yaml.safe_dump(value, default_flow_style=True, width=4096).strip().removesuffix("...").strip()
        parts.append(name if value is True else f"{name}={text}")
    out = " ".join(parts)
    return out if len(out) <= OTHER_MAX else out[: OTHER_MAX - 1] + "…"


def preview_row(r: RunSpec, varying: Sequence[str] = ()) -> tuple[str, ...]:
    """One run of the preview (the mem/GPU and step cells are filled later by the check); ``varying``:
    the settings beyond the fixed columns that differ between the runs, in columns after the step time."""
    s = r.settings
    off = s.offload if s.offload_params == "none" else f"{s.offload}/{s.offload_params}"
    comp = "cmd" if s.kind == "command" else "dc" if s.deepcompile else "tc" if s.compile else "-"
    return (
        str(r.order), r.name, "", "", *(varying_settings.value_text(getattr(s, n)) for n in varying),
        f"z{s.zero_stage}", off, comp, s.dtype, str(s.micro_batch), str(s.seq_length), str(s.grad_accum),
        str(s.gpus * s.nodes), Path(s.model).name, other_text(r, varying),
    )  # fmt: skip


def preview_columns(varying: Sequence[str]) -> tuple[str, ...]:
    """The preview's columns: an axis beyond the fixed ones (lr) after the step time (issue 38.6: it was
    only in the last, cut-off 'other' column)."""
    return (*PREVIEW_COLUMNS[:4], *varying, *PREVIEW_COLUMNS[4:])


def preview_rows(runs: list[RunSpec], varying: Sequence[str] = ()) -> list[tuple[str, ...]]:
    """The preview's rows, in run order: the place where a per-run mark (e.g. 'why not') joins them."""
    return [preview_row(r, varying) for r in runs]


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
REVISION_INSTALLS = ("auto", "pip", "source")  # the spec's Revision.install, default first


def revision_source(rev: dict[str, Any]) -> tuple[str, str, str]:
    """(source kind, value, ref) of a revision mapping, for the editor's fields."""
    for kind in ("pypi", "git", "path"):
        if rev.get(kind) is not None:
            return kind, str(rev[kind]), str(rev.get("ref") or "")
    return "installed", "", ""


def revision_install(rev: dict[str, Any]) -> str:
    """How a revision's env is built (``install``: auto, pip or source); ``auto`` when the spec does not say."""
    return str(rev.get("install") or REVISION_INSTALLS[0])


def revision_text(rev: dict[str, Any]) -> str:
    """One line: ``stable: pypi=0.18.0``, ``main: git=~/ds@master (install: pip)``, ``base: installed``."""
    kind, value, ref = revision_source(rev)
    src = "installed" if kind == "installed" else f"{kind}={value}"
    install = revision_install(rev)
    return f"{rev.get('name')}: {src}" + (f"@{ref}" if ref else "") + (f" (install: {install})" if install != "auto" else "")


def make_revision(name: str, kind: str, value: str, ref: str = "", install: str = "auto") -> dict[str, Any]:
    """A revision mapping from the editor's fields, checked by the spec's own model (ValueError if wrong).

    Every field of the spec's revision has one here: an edit saved from the
    editor keeps what the spec said (``install`` was once dropped by an edit).
    """
    from pydantic import ValidationError

    from dstui.spec.experiment import Revision

    name, kind, value, ref = name.strip(), kind.strip().lower(), value.strip(), ref.strip()
    install = install.strip().lower() or REVISION_INSTALLS[0]
    if not name:
        raise ValueError("a revision needs a name")
    if kind not in REVISION_SOURCES:
        raise ValueError(f"source must be one of {', '.join(REVISION_SOURCES)} (got '{kind}')")
    if install not in REVISION_INSTALLS:
        raise ValueError(f"install must be one of {', '.join(REVISION_INSTALLS)} (got '{install}')")
    rev: dict[str, Any] = {"name": name}
    if kind == "installed":
        rev["installed"] = True
    else:
        if not value:
            raise ValueError(f"'{kind}' needs a value ({'a version' if kind == 'pypi' else 'a folder'})")
        rev[kind] = value
        if ref:
            rev["ref"] = ref
    if install != REVISION_INSTALLS[0]:  # 'auto' is the default: a spec that never said it stays so
        rev["install"] = install
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
