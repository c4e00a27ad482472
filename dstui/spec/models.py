"""Experiment specs: typed models, matrix expansion, readable names, run keys.

A spec is a YAML file with base ``settings``, ``axes`` whose cartesian product
gives conditions, an ``exclude`` list, explicit named ``conditions``,
``repeats`` and ``revisions``. :func:`expand` turns it into one
:class:`RunSpec` per condition x revision x repeat. Everything here is pure
Python so that the TUI can re-expand on every keystroke.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dstui.core.errors import SpecError

Offload = Literal["none", "cpu", "nvme"]
Dtype = Literal["fp32", "bf16", "fp16"]
Kind = Literal["train", "verify", "command"]
MetricsFormat = Literal["jsonl", "seed"]
SpMode = Literal["eager", "compile", "deepcompile"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Launcher(_Strict):
    """How DeepSpeed's own launcher starts the ranks (single node or many)."""

    launcher: Literal["pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi"] | None = Field(
        None, description="Multi-node backend of the deepspeed launcher; None = local only."
    )
    hostfile: str | None = Field(None, description="DeepSpeed hostfile ('host slots=N' lines).")
    include: str | None = Field(None, description="deepspeed --include filter, e.g. 'node1:0,1'.")
    exclude: str | None = Field(None, description="deepspeed --exclude filter.")
    master_addr: str | None = Field(None, description="Rendezvous address for multi-node runs.")
    master_port: int | None = Field(
        None, ge=1, le=65535, description="Fixed port; default is a free port per run."
    )
    extra_args: list[str] = Field(
        default_factory=list, description="More deepspeed launcher arguments, as an argv list."
    )


class Settings(_Strict):
    """Everything that defines one condition. Axes and conditions override these."""

    kind: Kind = Field("train", description="train: runners/train.py; verify: compare_loss.py; command: your argv.")
    model: str = Field("tiny-llama", description="Preset in configs/models/, a hub id or a local path.")
    load_weights: bool = Field(False, description="Load pretrained weights (default: config only, random init).")
    dataset: str = Field("tiny-corpus", description="'tiny-corpus' (shipped), 'synthetic', or an HF dataset name.")
    dataset_config: str | None = Field(None, description="HF dataset config, e.g. 'wikitext-2-raw-v1'.")
    dataset_percent: float = Field(100.0, gt=0, le=100, description="Percentage of the HF split to use.")
    seq_length: int = Field(128, ge=1, description="Tokens per sample.")
    micro_batch: int = Field(1, ge=1, description="train_micro_batch_size_per_gpu.")
    grad_accum: int = Field(1, ge=1, description="gradient_accumulation_steps.")
    steps: int = Field(10, ge=1, description="Optimizer steps to run.")
    warmup_steps: int = Field(2, ge=0, description="Leading steps excluded from timing statistics.")
    log_interval: int = Field(1, ge=1, description="Log every N optimizer steps.")
    dtype: Dtype = Field("fp32", description="Training precision.")
    zero_stage: int = Field(0, description="ZeRO stage 0-3 (checked by DeepSpeed's own config model).")
    offload: Offload = Field("none", description="Offload of optimizer state (ZeRO >= 1).")
    offload_params: Offload = Field("none", description="Offload of parameters (ZeRO-3 only).")
    nvme_path: str = Field("/tmp/dstui_nvme", description="Swap folder for nvme offload.")
    deepcompile: bool = Field(False, description="DeepSpeed DeepCompile (compile.deepcompile).")
    compile: bool = Field(False, description="torch.compile the engine.")
    activation_checkpointing: bool = Field(False, description="HF gradient checkpointing.")
    sequence_parallel: int = Field(1, ge=1, description="Ulysses sequence-parallel degree.")
    sp_mode: SpMode = Field("eager", description="Ulysses mode: eager, compile or deepcompile.")
    sp_check: bool = Field(
        False, description="Ulysses: also train without sequence parallelism and compare the losses."
    )
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate.")
    torch_adam: bool = Field(False, description="Use torch.optim.AdamW instead of DeepSpeed's.")
    seed: int = Field(42, description="Seed for init, data order and dropout.")
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms.")
    gpus: int = Field(1, ge=1, description="Ranks per node (GPUs, or CPU processes without GPUs).")
    nodes: int = Field(1, ge=1, description="Number of nodes (needs launcher.hostfile).")
    mirror_zero3_hooks: bool = Field(
        False,
        description="verify: wrap the PyTorch baseline like ZeRO-3 wraps modules, so ZeRO-3 can match exactly "
        "(ZeRO-3's hooks regroup gradient sums: ulp-level differences otherwise).",
    )
    rtol: float = Field(0.0, ge=0, description="verify: relative tolerance.")
    atol: float = Field(0.0, ge=0, description="verify: absolute tolerance.")
    ds_config: str = Field("base.json", description="Template in configs/deepspeed/ or a path.")
    ds_overrides: dict[str, Any] = Field(default_factory=dict, description="Merged into the generated ds_config.")
    command: list[str] | None = Field(None, description="kind=command: argv list, never a shell string.")
    metrics_format: MetricsFormat = Field("jsonl", description="How dstui reads the program's metrics.")
    launcher: Launcher = Field(default_factory=Launcher, description="deepspeed launcher options.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    extra_args: list[str] = Field(default_factory=list, description="More runner arguments (argv list).")
    hung_after_s: float = Field(600.0, gt=0, description="No new output for this long = hung.")

    @field_validator("command")
    @classmethod
    def _argv_list(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("must be a non-empty argv list")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if self.kind == "command" and not self.command:
            raise ValueError("kind 'command' needs 'command:' (an argv list)")
        if self.offload != "none" and self.zero_stage == 0:
            raise ValueError("offload needs ZeRO stage 1, 2 or 3 (zero_stage is 0)")
        if self.offload_params != "none" and self.zero_stage != 3:
            raise ValueError(f"offload_params needs ZeRO stage 3 (zero_stage is {self.zero_stage})")
        if self.warmup_steps >= self.steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})"
            )
        if self.nodes > 1 and not self.launcher.hostfile:
            raise ValueError("nodes > 1 needs launcher.hostfile")
        return self


SETTING_NAMES = tuple(Settings.model_fields)


class Revision(_Strict):
    """A DeepSpeed revision to run every condition against (see revisions.py)."""

    name: str
    pypi: str | None = Field(None, description="A DeepSpeed release from PyPI, e.g. '0.18.0'.")
    git: str | None = Field(None, description="A local clone; with 'ref'.")
    ref: str | None = Field(None, description="Branch, tag or commit in 'git'.")
    path: str | None = Field(None, description="A working tree used as it is now.")
    installed: bool = Field(False, description="The DeepSpeed of the current environment.")

    @model_validator(mode="after")
    def _one_source(self) -> Revision:
        sources = [self.pypi is not None, self.git is not None, self.path is not None, self.installed]
        if sum(sources) != 1:
            raise ValueError("give exactly one of pypi, git (+ref), path or installed: true")
        if self.git is not None and not self.ref:
            raise ValueError("'git' needs 'ref' (branch, tag or commit)")
        return self


class Condition(BaseModel):
    """An explicit named condition: a name plus setting overrides."""

    model_config = ConfigDict(extra="allow")
    name: str


class ExperimentSpec(_Strict):
    name: str = Field(description="Experiment name; also the MLflow experiment.")
    description: str = ""
    settings: dict[str, Any] = Field(default_factory=dict, description="Base settings.")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="Cartesian product.")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="Partial matches to drop.")
    conditions: list[Condition] = Field(default_factory=list, description="Explicit conditions.")
    repeats: int = Field(1, ge=1, description="Runs per condition and revision.")
    revisions: list[Revision] = Field(default_factory=list, description="DeepSpeed revisions.")
    baseline: str | None = Field(None, description="Condition that reports compare against.")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not v.strip() or "/" in v:
            raise ValueError("must be a non-empty name without '/'")
        return v


class RunSpec(BaseModel):
    """One run: a condition under one revision, one repeat. Immutable once expanded."""

    model_config = ConfigDict(frozen=True)

    experiment: str
    condition: str
    settings: Settings
    repeat: int = 0
    revision: str = "installed"
    order: int = 0

    @property
    def name(self) -> str:
        """Folder and display name: condition, revision when not the default, repeat."""
        parts = [self.condition]
        if self.revision != "installed":
            parts.append(self.revision)
        parts.append(f"r{self.repeat}")
        return "-".join(parts)

    @property
    def key(self) -> str:
        """Stable key of the resolved settings: the same run in any batch has the same key."""
        payload = {
            "settings": self.settings.model_dump(mode="json"),
            "revision": self.revision,
            "repeat": self.repeat,
        }
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


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
    parts = []
    for field, value in values.items():
        fmt = _SHORT.get(field)
        text = fmt(value) if fmt else f"{field}{value}"
        if text:
            parts.append(str(text))
    return "-".join(parts) or "base"


# -- loading ----------------------------------------------------------------


def _field_of(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or "(spec)"


def _raise_validation(e: ValidationError, *, file: str | None, condition: str | None) -> None:
    first = e.errors()[0]
    field = _field_of(first)
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    raise SpecError(first["msg"] + more, file=file, condition=condition, field=field) from None


def parse_spec(data: Any, *, file: str | None = None) -> ExperimentSpec:
    if not isinstance(data, dict):
        raise SpecError("a spec must be a YAML mapping", file=file)
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as e:
        _raise_validation(e, file=file, condition=None)
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
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"invalid YAML{where}: {getattr(e, 'problem', e)}", file=str(path)) from None
    return parse_spec(data, file=str(path))


def dump_spec(spec: ExperimentSpec) -> str:
    """YAML text that :func:`load_spec` reads back to the same runs."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    data.setdefault("name", spec.name)
    return yaml.safe_dump(data, sort_keys=False)


def save_spec(spec: ExperimentSpec, path: str | Path) -> None:
    Path(path).write_text(dump_spec(spec))


# -- expansion --------------------------------------------------------------


def _matches(values: dict[str, Any], pattern: dict[str, Any]) -> bool:
    return all(values.get(k) == v for k, v in pattern.items())


def conditions(spec: ExperimentSpec, *, file: str | None = None) -> list[tuple[str, Settings]]:
    """The named, validated conditions of a spec (before revisions and repeats)."""
    out: list[tuple[str, Settings]] = []
    varying = [a for a, vals in spec.axes.items() if len(vals) > 1]
    combos: list[dict[str, Any]] = []
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
        out.append((name, _settings(merged, file=file, condition=name)))

    for cond in spec.conditions:
        overrides = {k: v for k, v in cond.model_dump().items() if k != "name"}
        for key in overrides:
            if key not in SETTING_NAMES:
                raise SpecError(f"unknown setting '{key}'", file=file, condition=cond.name, field=key)
        merged = {**spec.settings, **overrides}
        out.append((cond.name, _settings(merged, file=file, condition=cond.name)))

    seen: dict[str, int] = {}
    unique = []
    for name, settings in out:
        if name in seen:
            seen[name] += 1
            name = f"{name}-{seen[name]}"
        else:
            seen[name] = 0
        unique.append((name, settings))
    if not unique:
        raise SpecError("the spec expands to no runs (everything excluded?)", file=file)
    return unique


def _settings(values: dict[str, Any], *, file: str | None, condition: str) -> Settings:
    try:
        settings = Settings.model_validate(values)
    except ValidationError as e:
        _raise_validation(e, file=file, condition=condition)
        raise AssertionError("unreachable") from None
    from dstui.spec.capabilities import refusal  # what the runner of this kind can do

    refused = refusal(settings)
    if refused:
        raise SpecError(refused.message, file=file, condition=condition, field=refused.field)
    return settings


def expand(spec: ExperimentSpec, *, file: str | None = None) -> list[RunSpec]:
    """One RunSpec per condition x revision x repeat, interleaved for fairness.

    Repeats are the outer loop and revisions the inner one, so two revisions
    alternate (A B A B ...) and machine drift cannot pose as a regression.
    """
    conds = conditions(spec, file=file)
    revisions = [r.name for r in spec.revisions] or ["installed"]
    if len(set(revisions)) != len(revisions):
        raise SpecError("revision names must be unique", file=file, field="revisions")
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
    return runs


def expand_file(path: str | Path) -> tuple[ExperimentSpec, list[RunSpec]]:
    spec = load_spec(path)
    return spec, expand(spec, file=str(path))
