"""Expansion: a spec's axes x conditions x revisions x repeats -> one RunSpec each.

Pure Python, so that the TUI can re-expand on every keystroke. Conditions get
readable names from their axis values (:func:`short_name`); every condition is
validated as :class:`~dstui.spec.settings.Settings` and against what its runner
can do (:mod:`dstui.spec.capabilities`).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dstui.core import executors, names
from dstui.core.errors import SpecError
from dstui.spec import capabilities, messages, ulysses_rules
from dstui.spec.experiment import ExperimentSpec, RunSpec
from dstui.spec.settings import SETTING_NAMES, Settings

# -- readable names ---------------------------------------------------------

_SHORT: dict[str, Any] = {
    "zero_stage": lambda v: f"z{v}",
    "deepcompile": lambda v: "dc" if v else "",
    "compile": lambda v: "tc" if v else "",
    "activation_checkpointing": lambda v: "ac" if v else "",
    "offload": lambda v: "" if v == "none" else f"off{v}",
    "offload_params": lambda v: "" if v == "none" else f"poff{v}",
    "micro_batch": lambda v: f"mb{v}",
    "seq_length": lambda v: f"s{v}",
    "grad_accum": lambda v: f"ga{v}",
    "gpus": lambda v: f"g{v}",
    "nodes": lambda v: f"n{v}",
    "dtype": lambda v: str(v),
    "sequence_parallel": lambda v: f"sp{v}",
    "sp_mode": lambda v: str(v),
    "torch_adam": lambda v: "tadam" if v else "",
    "model": lambda v: Path(str(v)).name.replace("_", "-"),
    "pipeline_stages": lambda v: f"pp{v}" if v != 1 else "",
    "loss_pattern": lambda v: "" if v == "standard" else str(v).replace("_", "-"),
}


def short_name(values: dict[str, Any]) -> str:
    """A readable condition name from axis values, made safe as a folder name (see core.names)."""
    parts = []
    for field, value in values.items():
        fmt = _SHORT.get(field)
        text = fmt(value) if fmt else f"{field}{value}"
        if text:
            parts.append(str(text))
    return names.make_safe("-".join(parts) or "base")


# -- expansion --------------------------------------------------------------


def _matches(values: dict[str, Any], pattern: dict[str, Any]) -> bool:
    return all(k in values and values[k] == v for k, v in pattern.items())


@dataclass
class _Named:
    """The names a spec expands to, before any setting is validated: cheap enough for every keystroke."""

    conditions: list[tuple[str, dict[str, Any]]]  # (unique name, merged setting values)
    excluded: dict[str, int]  # axis-derived name -> index of the first exclusion that drops it
    hits: list[int]  # per exclusion: how many axis combinations it matches


def _named(spec: ExperimentSpec, *, file: str | None) -> _Named:
    size = 1
    for vals in spec.axes.values():
        size *= len(vals)
    _check_size(size, file=file, field="axes")
    varying = [a for a, vals in spec.axes.items() if len(vals) > 1]
    combos: list[dict[str, Any]] = []
    if spec.axes:
        axis_names = list(spec.axes)
        for values in itertools.product(*(spec.axes[n] for n in axis_names)):
            combos.append(dict(zip(axis_names, values, strict=True)))
    elif not spec.conditions:
        combos.append({})

    out: list[tuple[str, dict[str, Any]]] = []
    excluded: dict[str, int] = {}
    hits = [0] * len(spec.exclude)
    for combo in combos:
        merged = {**spec.settings, **combo}
        name = short_name({k: combo[k] for k in varying}) if varying else "base"
        matched = [i for i, pat in enumerate(spec.exclude) if _matches(merged, pat)]
        for i in matched:
            hits[i] += 1
        if matched:
            excluded.setdefault(name, matched[0])
            continue
        out.append((name, merged))

    from_axes = len(out)
    explicit: dict[str, int] = {}
    for i, cond in enumerate(spec.conditions):
        if cond.name in explicit:
            raise SpecError(
                f"condition name {cond.name!r} is used twice (also conditions.{explicit[cond.name]}.name); names must be unique",
                file=file,
                field=f"conditions.{i}.name",
            )
        explicit[cond.name] = i
        overrides = {k: v for k, v in cond.model_dump().items() if k != "name"}
        for key in overrides:
            if key not in SETTING_NAMES:
                raise SpecError(messages.unknown("setting", key, SETTING_NAMES), file=file, condition=cond.name,
                                field=f"conditions.{i}.{key}")  # fmt: skip
        out.append((cond.name, {**spec.settings, **overrides}))

    _check_footprint(spec, from_axes=from_axes, explicit=[merged for _, merged in out[from_axes:]], file=file)
    # axis-derived names can repeat (e.g. two model paths with one basename): number them,
    # never onto a name that is already taken
    taken = {name for name, _ in out}
    seen: set[str] = set()
    unique = []
    for name, merged in out:
        if name in seen:
            n = 1
            while f"{name}-{n}" in taken:
                n += 1
            name = f"{name}-{n}"
            taken.add(name)
        seen.add(name)
        unique.append((name, merged))
    return _Named(unique, excluded, hits)


def _shown(pattern: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in pattern.items()) + "}"


def check_names(spec: ExperimentSpec, *, file: str | None = None) -> list[str]:
    """The spec's condition names; refuses a baseline that names none and an exclusion that matches none.

    The baseline must be a condition of the whole spec: ``--only`` narrows a batch later and
    may leave it out (the report then compares against what ran), but a baseline that an
    exclusion removes could never run, so it is refused like a typo.
    """
    named = _named(spec, file=file)
    names = [n for n, _ in named.conditions]
    for i, pattern in enumerate(spec.exclude):
        if named.hits[i] == 0:
            values = "; ".join(f"{k} takes {', '.join(repr(v) for v in spec.axes[k])}" for k in pattern if k in spec.axes)
            fixed = "; ".join(f"{k} is {spec.settings[k]!r}" for k in pattern if k not in spec.axes and k in spec.settings)
            where = "; ".join(w for w in (values, fixed) if w)
            if not spec.axes:
                where = "exclusions drop axis combinations and this spec has no axes"
            raise SpecError(f"exclusion {_shown(pattern)} matches no axis combination ({where})",
                            file=file, field=f"exclude.{i}")  # fmt: skip
    for field, wanted in (("baseline", spec.baseline), ("guard.baseline", spec.guard.baseline)):
        if wanted is None or wanted in names:
            continue
        if wanted in named.excluded:
            i = named.excluded[wanted]
            why = f"{wanted!r} is removed by exclude.{i} {_shown(spec.exclude[i])}"
        else:
            why = f"{wanted!r} is not a condition of this spec"
            # a new axis renames conditions (z0 -> z0-deterministicFalse): the old name is then a prefix
            close = messages.nearest(wanted, names) or [n for n in names if n.startswith(f"{wanted}-")][:3]
            if close:
                why += f"; did you mean {' or '.join(repr(c) for c in close)}?"
        shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
        raise SpecError(f"{why} (conditions: {shown or 'none'})", file=file, field=field)
    return names


def conditions(spec: ExperimentSpec, *, file: str | None = None) -> list[tuple[str, Settings]]:
    """The named, validated conditions of a spec (before revisions and repeats)."""
    named = _named(spec, file=file)
    if not named.conditions:
        raise SpecError("the spec expands to no runs (everything excluded?)", file=file)
    return [(name, _settings(merged, file=file, condition=name, executor=spec.executor)) for name, merged in named.conditions]


def _settings(values: dict[str, Any], *, file: str | None, condition: str, executor: str = executors.DEFAULT) -> Settings:
    try:
        s = Settings.model_validate(values)
    except ValidationError as e:
        messages.raise_validation(e, file=file, condition=condition, model=Settings)
        raise AssertionError("unreachable") from None
    refused = ulysses_rules.refusal(s)
    if refused is not None:
        raise SpecError(refused[1], file=file, condition=condition, field=refused[0])
    cannot = capabilities.refusal(s)  # what the runner of this kind can do
    if cannot:
        raise SpecError(cannot.message, file=file, condition=condition, field=cannot.field)
    # an executor that allocates nodes (Slurm's job) says which; otherwise DeepSpeed needs a hostfile
    if s.nodes > 1 and not s.launcher.hostfile and not executors.places_nodes(executor):
        placing = " or ".join(f"executor: {n}" for n in executors.names() if executors.places_nodes(n))
        raise SpecError(f"nodes > 1 needs launcher.hostfile (or {placing})", file=file, condition=condition, field="nodes")
    return s


def expand(spec: ExperimentSpec, *, file: str | None = None) -> list[RunSpec]:
    """One RunSpec per condition x revision x repeat, interleaved for fairness.

    Repeats are the outer loop and revisions the inner one, so two revisions
    alternate (A B A B ...) and machine drift cannot pose as a regression.
    """
    conds = conditions(spec, file=file)
    revisions = [r.name for r in spec.revisions] or ["installed"]
    if len(set(revisions)) != len(revisions):
        raise SpecError("revision names must be unique", file=file, field="revisions")
    _check_size(len(conds) * len(revisions) * spec.repeats, file=file, field="repeats")
    runs: list[RunSpec] = []
    for repeat in range(spec.repeats):
        for name, settings in conds:
            for rev in revisions:
                runs.append(
                    RunSpec(
                        experiment=spec.name,
                        condition=name,
                        settings=settings,
                        repeat=repeat,
                        revision=rev,
                        order=len(runs),
                    )
                )
    _check_run_names(runs, file=file)
    return runs


MAX_RUNS = 10_000


def _check_size(n: int, *, file: str | None, field: str) -> None:
    if n > MAX_RUNS:
        raise SpecError(f"the spec expands to {n} runs; at most {MAX_RUNS} per batch", file=file, field=field)


MAX_EXPANSION_BYTES = 32 << 20


def _size(value: Any) -> int:
    return len(json.dumps(value, default=str))


def _check_footprint(spec: ExperimentSpec, *, from_axes: int, explicit: list[dict[str, Any]], file: str | None) -> None:
    """Refuse a spec whose settings, repeated in every run's folder, would pass :data:`MAX_EXPANSION_BYTES`.

    Each run's folder holds its condition's settings (spec.json, cmd.txt, ds_config.json,
    MLflow params): a 514-byte spec once became 1.35 GB of run folders. Measured before
    any condition is validated, from the spec's own values: an axis condition holds at
    most the base settings and the longest value of each axis.
    """
    base = _size(spec.settings)
    per_axis_condition = base + sum(max(map(_size, values), default=0) for values in spec.axes.values())
    per_round = from_axes * per_axis_condition + sum(map(_size, explicit))
    runs = (from_axes + len(explicit)) * max(1, len(spec.revisions)) * spec.repeats
    total = per_round * max(1, len(spec.revisions)) * spec.repeats
    if total > MAX_EXPANSION_BYTES:
        raise SpecError(f"refused: the spec expands to {runs} runs holding {total / 2**20:.0f} MiB of settings in their folders; "
                        f"at most {MAX_EXPANSION_BYTES >> 20} MiB (fewer runs, or smaller values)", file=file)  # fmt: skip


def _check_run_names(runs: list[RunSpec], *, file: str | None) -> None:
    """Run names are folder and MLflow names: each must obey the rule and be unique."""
    first: dict[str, RunSpec] = {}
    for r in runs:
        why = names.problem(r.name, max_len=names.RUN_NAME_MAX)
        if why:
            raise SpecError(f"run {why}", file=file, condition=r.condition)
        if r.name in first:
            other = first[r.name]
            raise SpecError(
                f"run name {r.name!r} is made twice (condition {other.condition!r} revision {other.revision!r} "
                f"and condition {r.condition!r} revision {r.revision!r}); rename a condition or revision",
                file=file,
                condition=r.condition,
            )
        first[r.name] = r
