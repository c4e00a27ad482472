"""Reading and writing spec files: size and encoding checks, YAML, one-line errors.

Every problem becomes a :class:`~dstui.core.errors.SpecError` that names the
file, condition and field, so the CLI and the TUI show one line, never a
pydantic dump.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dstui.core.errors import SpecError
from dstui.spec.experiment import ExperimentSpec
from dstui.spec.settings import SETTING_NAMES


def _field_of(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or "(spec)"


def raise_validation(e: ValidationError, *, file: str | None, condition: str | None) -> None:
    first = e.errors()[0]
    field = _field_of(first)
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    msg = first["msg"].removeprefix("Value error, ")
    raise SpecError(msg + more, file=file, condition=condition, field=field) from None


def parse_spec(data: Any, *, file: str | None = None) -> ExperimentSpec:
    if not isinstance(data, dict):
        raise SpecError("a spec must be a YAML mapping", file=file)
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise_validation(e, file=file, condition=None)
    for key in list(spec.settings) + list(spec.axes):
        if key not in SETTING_NAMES:
            raise SpecError(
                f"unknown setting '{key}'; known: {', '.join(SETTING_NAMES)}", file=file, field=key
            )
    for axis, values in spec.axes.items():
        if not values:
            raise SpecError("an axis needs at least one value", file=file, field=f"axes.{axis}")
    return spec


def load_spec(path: str | Path) -> ExperimentSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError("no such spec file", file=str(path))
    text = read_spec_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = str(getattr(e, "problem", None) or e).split("\n")[0]  # one line, whatever PyYAML says
        raise SpecError(f"invalid YAML{where}: {' '.join(what.split())}", file=str(path)) from None
    return parse_spec(data, file=str(path))


MAX_SPEC_BYTES = 1 << 20


def read_spec_text(path: Path) -> str:
    """The spec's text: UTF-8, at most 1 MiB; anything else is one line naming the file."""
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(f"is {size / 2**20:.1f} MiB; a spec is at most {MAX_SPEC_BYTES >> 20} MiB", file=str(path))
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror or e}", file=str(path)) from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise SpecError("is UTF-16; save it as UTF-8", file=str(path))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SpecError(f"is not UTF-8 (byte 0x{raw[e.start]:02x} at line {line}); save it as UTF-8", file=str(path)) from None


def dump_spec(spec: ExperimentSpec) -> str:
    """YAML text that :func:`load_spec` reads back to the same runs."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data.setdefault("name", spec.name)
    return yaml.safe_dump(data, sort_keys=False)


def save_spec(spec: ExperimentSpec, path: str | Path) -> None:
    Path(path).write_text(dump_spec(spec))
