"""The wording of spec errors: unknown names with their nearest valid one, allowed values once each.

Pydantic's own words are written for programmers ("Extra inputs are not
permitted", DeepSpeed's enum aliases listed twice as "0, 1, 2, 3 or 3"); a user
who mistyped a key needs the name they meant. Every spec layer (the spec file's
models, a condition's settings, DeepSpeed's config models) words its errors
here so that the same mistake reads the same wherever it is made.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterable
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from dstui.core.errors import SpecError


def nearest(word: str, valid: Iterable[str]) -> list[str]:
    """The valid names a typo most likely meant (case-insensitive, closest first)."""
    valid = list(valid)
    by_lower = {v.lower(): v for v in valid}
    return [by_lower[m] for m in difflib.get_close_matches(str(word).lower(), list(by_lower), n=3, cutoff=0.6)]


def did_you_mean(word: str, valid: Iterable[str]) -> str:
    """A hint for a typo: the close names when there are some, else the whole list (a user cannot guess it)."""
    valid = list(valid)
    close = nearest(word, valid)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "known: " + (", ".join(valid) if valid else "(none)")


def unknown(what: str, key: Any, valid: Iterable[str]) -> str:
    """One wording for every unknown name: top-level keys, settings, revision and Slurm options alike."""
    return f"unknown {what} {str(key)!r}; {did_you_mean(str(key), valid)}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``list[Revision]`` or ``Launcher | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType or origin in (list, tuple, dict):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def model_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model a pydantic error location points into (list indexes and dict keys skipped)."""
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            continue  # a dict key (settings: {...}) or pydantic's union tag
        model = _model_in(field.annotation)
    return model


def keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a model accepts: its field names, and the aliases a file may spell them with."""
    out = []
    for name, field in model.model_fields.items():
        out += [name] + ([field.alias] if field.alias and field.alias != name else [])
    return list(dict.fromkeys(out))


def one_of(allowed: Iterable[Any], got: Any) -> str:
    """A value outside a setting's choices: each allowed value once, and what was given."""
    return f"must be one of {', '.join(str(a) for a in allowed)} (got {_shown(got)})"


def _choices(expected: str) -> list[str]:
    """'0, 1, 2, 3 or 3' -> ['0', '1', '2', '3']: pydantic's list, each value once."""
    head, _, last = expected.rpartition(" or ")
    parts = [p.strip() for p in head.split(", ")] + [last.strip()] if head else [expected.strip()]
    return list(dict.fromkeys(p for p in parts if p))


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def error_message(err: dict[str, Any], *, model: type[BaseModel] | None = None) -> str:
    """One pydantic error as a user reads it; ``model`` is the model its ``loc`` starts from."""
    kind = err.get("type", "")
    loc = tuple(err.get("loc", ()))
    if kind == "extra_forbidden" and loc:
        parent = model_at(model, loc[:-1])
        if parent is not None:
            # a model whose keys a person calls settings says so (Settings): no import of it here
            what = getattr(parent, "KEY_WORD", "key")
            return unknown(what, loc[-1], keys_of(parent))
    if kind in ("literal_error", "enum") and "expected" in (err.get("ctx") or {}):
        return one_of(_choices(str(err["ctx"]["expected"])), err.get("input"))
    return re.sub(r"^(Value|Assertion) error, ", "", str(err.get("msg", "invalid")))


def field_of(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or "(spec)"


def raise_validation(
    e: ValidationError, *, file: str | None, condition: str | None, model: type[BaseModel] | None = None
) -> None:
    """The first pydantic error as one SpecError; ``model`` (where ``loc`` starts) lets a typo get its suggestion."""
    first = e.errors()[0]
    field = field_of(first)
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    raise SpecError(error_message(first, model=model) + more, file=file, condition=condition, field=field) from None
