"""Runner flags derived from the Settings model: which settings reach which bundled runner, and how.

The bundled runners (``runners/train.py``, ``runners/compare_loss.py``) take a
run's settings as ``--dash-form`` flags. Which fields a runner takes is declared
on the field itself (``runners`` in its extra schema, :mod:`dstui.spec.settings`);
from that one declaration the launcher writes the argv (:func:`argv_of`) and the
runners build their argparse (:func:`add_setting_flags`): name, type, choices,
default and help (the field's description) all come from the model, so the
launcher, the runners and the spec cannot drift apart.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from dstui.spec.settings import Settings

RUNNER_KINDS = ("train", "verify")


def runners_of(field: FieldInfo) -> tuple[str, ...]:
    """The runner kinds a Settings field is a flag of (none: dstui itself uses it)."""
    extra = field.json_schema_extra
    return tuple(extra.get("runners", ())) if isinstance(extra, dict) else ()  # type: ignore[arg-type]


def runner_settings(kind: str) -> tuple[str, ...]:
    """The Settings fields the ``kind`` runner takes as flags, in the model's order."""
    return tuple(name for name, f in Settings.model_fields.items() if kind in runners_of(f))


def only_for(kind: str) -> tuple[str, ...]:
    """Settings that are flags of this runner kind and of no other."""
    return tuple(name for name, f in Settings.model_fields.items() if runners_of(f) == (kind,))


def flag(name: str) -> str:
    """``zero_stage`` -> ``--zero-stage``."""
    return "--" + name.replace("_", "-")


def argv_of(s: Settings, kind: str) -> list[str]:
    """The flags of the ``kind`` runner for these settings: booleans only when true, None left out."""
    args: list[str] = []
    for name in runner_settings(kind):
        value = getattr(s, name)
        if isinstance(value, bool):
            if value:
                args.append(flag(name))
        elif value is not None:
            args += [flag(name), str(value)]
    return args


def base_type(annotation: Any) -> Any:
    """``str | None`` -> ``str``; anything else as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        (base,) = (a for a in get_args(annotation) if a is not type(None))
        return base
    return annotation


def argparse_kwargs(name: str) -> dict[str, Any]:
    """``add_argument`` keywords of one setting: its type (choices of a Literal), default and help."""
    field = Settings.model_fields[name]
    base = base_type(field.annotation)
    kwargs: dict[str, Any] = {"dest": name, "help": (field.description or "").replace("%", "%%")}
    if base is bool:
        if field.default is not False:
            raise TypeError(f"setting {name}: a runner flag of a boolean must default to false")
        return {**kwargs, "action": "store_true"}
    if get_origin(base) is Literal:
        return {**kwargs, "choices": list(get_args(base)), "default": field.default}
    if base in (int, float, str):
        return {**kwargs, "type": base, "default": field.default}
    raise TypeError(f"setting {name}: no runner flag for a {field.annotation}")


def add_setting_flags(
    parser: argparse.ArgumentParser,
    kind: str,
    *,
    spell: Callable[[str], list[str]] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    notes: Mapping[str, str] | None = None,
) -> None:
    """Add the ``kind`` runner's setting flags to a parser, as the model declares them.

    ``spell`` gives a setting's option strings (default: the dash form only);
    ``overrides`` replaces argparse keywords of a setting where a runner must
    differ (the parity runner's own defaults, its dtype aliases); ``notes`` adds
    a runner's own remark after the description.
    """
    for name in runner_settings(kind):
        kwargs = argparse_kwargs(name)
        if notes and name in notes:
            kwargs["help"] = f"{kwargs['help'].rstrip('.')}; {notes[name].replace('%', '%%')}"
        kwargs.update((overrides or {}).get(name, {}))
        parser.add_argument(*(spell(name) if spell else [flag(name)]), **kwargs)
