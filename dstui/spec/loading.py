"""Reading and writing spec files: size and encoding checks, YAML, one-line errors.

Every problem becomes a :class:`~dstui.core.errors.SpecError` that names the
file, condition and field, so the CLI and the TUI show one line, never a
pydantic dump.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dstui.core.errors import SpecError
from dstui.spec import bounded_yaml, expand, messages
from dstui.spec.experiment import ExperimentSpec, Revision, RunSpec
from dstui.spec.settings import SETTING_NAMES


def parse_spec(data: Any, *, file: str | None = None) -> ExperimentSpec:
    """A spec checked whole: every name it uses (settings, axes, exclusions, baseline) must exist.

    The checks that need the condition names (baseline, exclusions) expand the names only,
    not the settings, so that every loader (CLI, TUI Compose) refuses a bad spec here,
    before anything is listed as "validated".
    """
    if not isinstance(data, dict):
        raise SpecError("a spec must be a YAML mapping", file=file)
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as e:
        messages.raise_validation(e, file=file, condition=None, model=ExperimentSpec)
    for part in ("settings", "axes"):
        for key in getattr(spec, part):
            if key not in SETTING_NAMES:
                raise SpecError(messages.unknown("setting", key, SETTING_NAMES), file=file, field=f"{part}.{key}")
    for axis, values in spec.axes.items():
        if not values:
            raise SpecError("an axis needs at least one value", file=file, field=f"axes.{axis}")
    _check_exclusion_keys(spec, file=file)
    check_revision_names(spec.revisions, file=file)
    expand.check_names(spec, file=file)  # also each explicit condition's keys
    return spec


def _check_exclusion_keys(spec: ExperimentSpec, *, file: str | None) -> None:
    """An exclusion can only match values the spec gives (axes, settings); any other key excludes nothing."""
    given = list(dict.fromkeys([*spec.axes, *spec.settings]))
    for i, pattern in enumerate(spec.exclude):
        if not pattern:
            raise SpecError("an empty exclusion matches every axis combination; give axis: value pairs",
                            file=file, field=f"exclude.{i}")  # fmt: skip
        for key in pattern:
            if key in given:
                continue
            if key in SETTING_NAMES:
                why = f"'{key}' is not an axis or a setting of this spec, so this exclusion matches nothing"
                raise SpecError(f"{why}; axes: {', '.join(spec.axes) or '(none)'}", file=file, field=f"exclude.{i}.{key}")
            raise SpecError(messages.unknown("exclusion key", key, given or SETTING_NAMES), file=file, field=f"exclude.{i}.{key}")


def check_revision_names(revisions: Sequence[Revision], *, file: str | None = None) -> None:
    """Each revision named once: at load, and again where revisions are resolved (dstui.revisions.envs)."""
    names = [r.name for r in revisions]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise SpecError(f"revision names must be unique (repeated: {', '.join(dups)})", file=file, field="revisions")


def load_spec(path: str | Path) -> ExperimentSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError("no such spec file", file=str(path))
    text = read_spec_text(path)
    return parse_spec(bounded_yaml.load(text, file=str(path)), file=str(path))


@contextmanager
def naming_file(file: str | None) -> Iterator[None]:
    """Errors found after loading (resolving revisions, building configs) still start with the spec's file.

    Code that checks one part of a spec (dstui.revisions, for example) does not know which
    file it came from; the caller that does wraps it in this.
    """
    try:
        yield
    except SpecError as e:
        if e.file is None and file is not None:
            e.file = file
            e.args = (str(e),)
        raise


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


# -- the user's file: round-trip saving, shipped specs -----------------------------------
#
# A spec file is the user's: a save changes the keys that were edited and nothing else.
# ruamel.yaml loads the file into a CommentedMap (comments, key order, flow/block style and
# quoting attached); :func:`updated_text` walks the difference between what the file meant
# (PyYAML's reading, the one every other part of dstui uses) and the edited mapping, and
# changes only those keys in place before dumping. New scalars are written so that PyYAML
# reads them back as they were meant (ruamel speaks YAML 1.2, PyYAML 1.1: ``'yes'``,
# ``1.0e-05``); the result is read back and compared before anything is written.


def shipped_spec_dirs() -> list[Path]:
    """Folders of the specs dstui ships: the checkout's configs/experiments/ and the installed copy."""
    from dstui.core import paths

    return [paths.CONFIGS_DIR / "experiments", paths.PACKAGE_DIR / "bundled" / "configs" / "experiments"]


def is_shipped(path: str | Path) -> bool:
    """Whether ``path`` is one of dstui's own specs (opened read-only; saved only under a new name)."""
    p = Path(path).resolve()
    return any(p.is_relative_to(d.resolve()) for d in shipped_spec_dirs())


def _guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) the file uses; PyYAML's (2, 2, 0) when it shows none."""
    mapping = offset = seq = None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for a, b in zip(lines, lines[1:], strict=False):
        head = a.split(" #")[0].rstrip()
        if not head.endswith(":") or head.lstrip().startswith("- "):
            continue
        ia, ib = len(a) - len(a.lstrip()), len(b) - len(b.lstrip())
        body = b.lstrip()
        if body.startswith("- ") and offset is None and ib >= ia:
            offset = ib - ia
            seq = offset + len(body) - len(body[1:].lstrip())  # dash, spaces, then the item
        elif not body.startswith("-") and mapping is None and ib > ia:
            mapping = ib - ia
    mapping = mapping or 2
    offset = offset or 0
    seq = max(seq or mapping, offset + 2)
    return mapping, seq, offset


def _yaml_rt(text: str) -> Any:
    """A ruamel round-trip YAML instance that writes ``text``'s indentation and PyYAML-readable floats."""
    from ruamel.yaml import YAML
    from ruamel.yaml.representer import RoundTripRepresenter

    class Representer(RoundTripRepresenter):
        pass

    def float_as_pyyaml(rep: Any, value: float) -> Any:
        # ruamel writes 1e-05, which PyYAML (YAML 1.1) reads as a string
        return rep.represent_scalar("tag:yaml.org,2002:float", yaml.safe_dump(value).split("\n")[0])

    Representer.add_representer(float, float_as_pyyaml)
    rt = bounded_yaml.bound_round_trip(YAML())
    rt.Representer = Representer
    rt.preserve_quotes = True
    rt.width = 4096  # never re-fold the user's long lines
    mapping, seq, offset = _guess_indent(text)
    rt.indent(mapping=mapping, sequence=seq, offset=offset)
    rt.explicit_start = text.lstrip().startswith("---")
    return rt


def _fresh(value: Any, *, flow: bool | None = None) -> Any:
    """A plain value as ruamel nodes: lists of scalars in flow style, strings quoted where PyYAML would misread them."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import SingleQuotedScalarString

    if isinstance(value, dict):
        out = CommentedMap()
        for k, v in value.items():
            out[k] = _fresh(v)
        return out
    if isinstance(value, list):
        seq = CommentedSeq(_fresh(v) for v in value)
        scalars = all(not isinstance(v, (dict, list)) for v in value)
        if flow if flow is not None else scalars:
            seq.fa.set_flow_style()
        return seq
    if isinstance(value, str):
        try:
            plain = bounded_yaml.load(value)
        except SpecError:
            plain = None
        if plain != value:
            return SingleQuotedScalarString(value)
    return value


def _split_trailing(token_value: str) -> tuple[str, str]:
    """A key's comment token: (its own end-of-line part, the lines after it that belong to what follows)."""
    i = token_value.find("\n")
    if i < 0:
        return token_value, ""
    return token_value[: i + 1], token_value[i + 1 :]


def _tail_of(node: Any, where: Any) -> tuple[Any, Any, int]:
    """Where the comment after an item's last line lives: (container, key or index, slot in ca.items)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    while True:
        child = node[where]
        if isinstance(child, (CommentedMap, CommentedSeq)) and len(child) and not child.fa.flow_style():
            node, where = child, (list(child)[-1] if isinstance(child, CommentedMap) else len(child) - 1)
        else:
            return node, where, (2 if isinstance(node, CommentedMap) else 0)


def _last_key(node: Any) -> Any:
    return (list(node)[-1] if isinstance(node, dict) else len(node) - 1) if len(node) else None


def _take_trailing(node: Any, where: Any) -> str:
    """Cut the full-line comments (and blank lines) that follow an item off it; its own end-of-line comment stays."""
    holder, key, slot = _tail_of(node, where)
    entry = holder.ca.items.get(key)
    if not entry or len(entry) <= slot or entry[slot] is None:
        return ""
    own, rest = _split_trailing(entry[slot].value)
    if own.lstrip().startswith("#"):
        entry[slot].value = own
    else:
        entry[slot] = None
    return rest


def _give_trailing(node: Any, where: Any, rest: str) -> None:
    """Put full-line comments below an item's last line."""
    from ruamel.yaml.error import CommentMark
    from ruamel.yaml.tokens import CommentToken

    if not rest.strip():
        return
    holder, key, slot = _tail_of(node, where)
    entry = holder.ca.items.setdefault(key, [None, None, None, None])
    if entry[slot] is None:
        entry[slot] = CommentToken("\n" + rest, CommentMark(0), None)
    else:
        entry[slot].value += rest


def _append(node: Any, key: Any, value: Any) -> None:
    """Add an item at the end (key None: of a sequence); comments below the old last line stay at the end."""
    last = _last_key(node)
    rest = _take_trailing(node, last) if last is not None else ""
    if key is None:
        node.append(_fresh(value, flow=True if node.fa.flow_style() else None))
        key = len(node) - 1
    else:
        node[key] = _fresh(value)
    _give_trailing(node, key, rest)


def _delete(node: Any, where: Any) -> None:
    """Remove an item; the comment lines that followed it go below the item before it."""
    rest = _take_trailing(node, where)
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    pos = keys.index(where)
    del node[where]
    if pos > 0:
        _give_trailing(node, keys[pos - 1], rest)


def _apply(node: Any, old: Any, new: Any) -> None:
    """Change ``node`` (ruamel, holding what PyYAML read as ``old``) into ``new``, touching only what differs."""
    if isinstance(old, dict):
        for k in [k for k in old if k not in new]:
            _delete(node, k)
        for k, v in new.items():
            if k not in old:
                _append(node, k, v)
            elif not _same(old[k], v):
                _replace(node, k, old[k], v)
    else:
        n = min(len(old), len(new))
        for i in range(n):
            if not _same(old[i], new[i]):
                _replace(node, i, old[i], new[i])
        for i in range(len(old) - 1, n - 1, -1):
            _delete(node, i)
        for v in new[n:]:
            _append(node, None, v)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _replace(node: Any, where: Any, old: Any, new: Any) -> None:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    child = node[where]
    both_maps = isinstance(old, dict) and isinstance(new, dict) and isinstance(child, CommentedMap)
    both_seqs = isinstance(old, list) and isinstance(new, list) and isinstance(child, CommentedSeq)
    if both_maps or both_seqs:
        _apply(child, old, new)
    else:
        flow = child.fa.flow_style() if isinstance(child, CommentedSeq) else None
        node[where] = _fresh(new, flow=flow)


def plain_text(data: dict[str, Any]) -> str:
    """A new spec file's text (nothing to keep): PyYAML's block style, keys in the mapping's order."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def updated_text(original: str | None, data: dict[str, Any], *, file: str | None = None) -> str:
    """The file text ``original`` with only the keys that ``data`` changes edited (comments, order, style kept).

    SpecError when the original cannot be read as a mapping or the edit would not read back as ``data``.
    """
    if original is None or not original.strip():
        return plain_text(data)
    import io

    try:
        old = bounded_yaml.load(original, file=file)
    except bounded_yaml.SpecLimit:
        raise
    except SpecError:
        old = None
    if not isinstance(old, dict):
        raise SpecError("the file on disk is not a YAML mapping; save under a new name", file=file)
    rt = _yaml_rt(original)
    try:
        doc = rt.load(original)
        if not isinstance(doc, dict):
            raise SpecError("the file on disk is not a YAML mapping; save under a new name", file=file)
        _apply(doc, old, data)
        buf = io.StringIO()
        rt.dump(doc, buf)
    except SpecError:
        raise
    except bounded_yaml.LimitPassed as e:
        raise bounded_yaml.limit_error(e, file) from None
    except Exception as e:  # ruamel is stricter than PyYAML (e.g. a key given twice): say so, write nothing
        why = " ".join(str(e).split())[:200]
        raise SpecError(f"cannot keep this file's layout ({type(e).__name__}: {why}); save under a new name", file=file) from None
    text = buf.getvalue()
    if bounded_yaml.load(text, file=file) != data:
        raise SpecError("this edit cannot be written without changing other keys; save under a new name", file=file)
    return text


def save_spec_text(path: str | Path, text: str) -> None:
    """Write a spec file whole or not at all (a crash never leaves half a file)."""
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class SpecDraft:
    """A spec edited and not saved: launched as it is, its text kept beside the batch (never over ``origin``)."""

    data: dict[str, Any]
    text: str  # the file's text with the edits (comments kept where there was a file)
    origin: Path | None  # the file it was opened from, if any


def expand_file(path: str | Path) -> tuple[ExperimentSpec, list[RunSpec]]:
    """A spec file read, checked and expanded into its runs."""
    spec = load_spec(path)
    return spec, expand.expand(spec, file=str(path))
