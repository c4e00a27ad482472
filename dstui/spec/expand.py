"""Expansion: a spec's axes x conditions x revisions x repeats -> one RunSpec each.

Pure Python, so that the TUI can re-expand on every keystroke. Conditions get
readable names from their axis values (:func:`short_name`); every condition is
validated as :class:`~dstui.spec.settings.Settings` and against what its runner
can do (:mod:`dstui.spec.capabilities`).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dstui.core import names
from dstui.core.errors import SpecError
from dstui.spec import capabilities, ulysses_rules
from dstui.spec.experiment import ExperimentSpec, RunSpec
from dstui.spec.loading import load_spec, raise_validation
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
    return all(values.get(k) == v for k, v in pattern.items())


def conditions(spec: ExperimentSpec, *, file: str | None = None) -> list[tuple[str, Settings]]:
    """The named, validated conditions of a spec (before revisions and repeats)."""
    out: list[tuple[str, Settings]] = []
    varying = [a for a, vals in spec.axes.items() if len(vals) > 1]
    combos: list[dict[str, Any]] = []
    size = 1
    for vals in spec.axes.values():
        size *= len(vals)
    _check_size(size, file=file, field="axes")
    if spec.axes:
        names = list(spec.axes)
        for values in itertools.product(*(spec.axes[n] for n in names)):
            combos.append(dict(zip(names, values, strict=True)))
    elif not spec.conditions:
        combos.append({})

    for combo in combos:
        merged = {**spec.settings, **combo}
        if any(_matches(merged, pat) for pat in spec.exclude):
            continue
        name = short_name({k: combo[k] for k in varying}) if varying else "base"
        out.append((name, _settings(merged, file=file, condition=name, executor=spec.executor)))

    explicit: dict[str, int] = {}
    for i, cond in enumerate(spec.conditions):
        if cond.name in explicit:
            raise SpecError(
                f"condition name {cond.name!r} is used twice (also conditions.{explicit[cond.name]}.name); names must be unique",
                file=file,
                field=f"conditions.{i}.name",
            )
        explicit[cond.name] = i
    for cond in spec.conditions:
        overrides = {k: v for k, v in cond.model_dump().items() if k != "name"}
        for key in overrides:
            if key not in SETTING_NAMES:
                raise SpecError(f"unknown setting '{key}'", file=file, condition=cond.name, field=key)
        merged = {**spec.settings, **overrides}
        out.append((cond.name, _settings(merged, file=file, condition=cond.name, executor=spec.executor)))

    # axis-derived names can repeat (e.g. two model paths with one basename): number them,
    # never onto a name that is already taken
    taken = {name for name, _ in out}
    seen: set[str] = set()
    unique = []
    for name, settings in out:
        if name in seen:
            n = 1
            while f"{name}-{n}" in taken:
                n += 1
            name = f"{name}-{n}"
            taken.add(name)
        seen.add(name)
        unique.append((name, settings))
    if not unique:
        raise SpecError("the spec expands to no runs (everything excluded?)", file=file)
    return unique


def _settings(values: dict[str, Any], *, file: str | None, condition: str, executor: str = "local") -> Settings:
    try:
        s = Settings.model_validate(values)
    except ValidationError as e:
        raise_validation(e, file=file, condition=condition)
        raise AssertionError("unreachable") from None
    refused = ulysses_rules.refusal(s)
    if refused is not None:
        raise SpecError(refused[1], file=file, condition=condition, field=refused[0])
    cannot = capabilities.refusal(s)  # what the runner of this kind can do
    if cannot:
        raise SpecError(cannot.message, file=file, condition=condition, field=cannot.field)
    # under Slurm the job's allocation says which nodes; locally DeepSpeed needs a hostfile
    if s.nodes > 1 and not s.launcher.hostfile and executor != "slurm":
        raise SpecError("nodes > 1 needs launcher.hostfile (or executor: slurm)", file=file, condition=condition, field="nodes")
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


def expand_file(path: str | Path) -> tuple[ExperimentSpec, list[RunSpec]]:
    spec = load_spec(path)
    return spec, expand(spec, file=str(path))
