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

from dstui.core import names, secrets
from dstui.core.errors import SpecError
from dstui.spec import ulysses_rules

Offload = Literal["none", "cpu", "nvme"]
Dtype = Literal["fp32", "bf16", "fp16"]
Kind = Literal["train", "verify", "command"]
MetricsFormat = Literal["jsonl", "seed"]
SpMode = Literal["eager", "compile", "deepcompile"]


def _safe_name(v: str) -> str:
    """Names become folders and MLflow names: one rule for all (see :mod:`dstui.core.names`)."""
    why = names.problem(v)
    if why:
        raise ValueError(why)
    return v


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
    env_visible: list[str] = Field(default_factory=list, description="env names (or PREFIX_*) shown in files, params and logs; every other env value is masked (core.secrets).")
    extra_args: list[str] = Field(default_factory=list, description="More runner arguments (argv list).")
    hung_after_s: float = Field(600.0, gt=0, description="No new output for this long = hung.")
    stall_after_s: float | None = Field(
        None, gt=0, description="No new training step for this long = stalled (catches a run that prints while stuck)."
    )
    max_runtime_s: float | None = Field(None, gt=0, description="Kill a run that runs longer than this.")

    @field_validator("env_visible")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not secrets.ENV_NAME.match(n)]
        if bad:
            raise ValueError(f"not an environment variable name (or PREFIX_*): {bad[0]!r}")
        return v

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
        return self


SETTING_NAMES = tuple(Settings.model_fields)
SUPERVISION_ONLY = ("stall_after_s", "max_runtime_s", "env_visible")  # how a run is watched or shown: not part of its key


class Revision(_Strict):
    """A DeepSpeed revision to run every condition against (see revisions.py)."""

    name: str
    pypi: str | None = Field(None, description="A DeepSpeed release from PyPI, e.g. '0.18.0'.")
    git: str | None = Field(None, description="A local clone; with 'ref'.")
    ref: str | None = Field(None, description="Branch, tag or commit in 'git'.")
    path: str | None = Field(None, description="A working tree used as it is now.")
    installed: bool = Field(False, description="The DeepSpeed of the current environment.")

    _name_ok = field_validator("name")(classmethod(lambda cls, v: _safe_name(v)))

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

    _name_ok = field_validator("name")(classmethod(lambda cls, v: _safe_name(v)))


class SlurmOptions(_Strict):
    """How each run goes to Slurm with ``executor: slurm`` (see docs/CLUSTERS.md).

    A run's ``nodes`` and ``gpus`` (ranks per node) give the job's nodes and tasks;
    these say where and with what else the job asks for.
    """

    partition: str | None = Field(None, description="sbatch --partition; None = the cluster's default.")
    account: str | None = Field(None, description="sbatch --account.")
    time_limit: str | None = Field(None, description="Per job: '30m', '2h', '90' (minutes) or Slurm's '[D-]HH:MM:SS'.")
    gpus_per_node: int | None = Field(None, ge=0, description="sbatch --gpus-per-node; None = as many as the run's ranks per node on a GPU run, none on CPU.")
    cpus_per_task: int = Field(1, ge=1, description="sbatch --cpus-per-task (one task per rank).")
    mem: str | None = Field(None, description="sbatch --mem per node, e.g. '64G'.")
    extra_sbatch: list[str] = Field(default_factory=list, description="More sbatch options, one per item, e.g. '--qos=high'.")
    max_jobs: int | None = Field(None, ge=1, description="At most this many of the batch's jobs pending or running at once; None = all.")
    requeue: int = Field(1, ge=0, description="Resubmit a run whose job was PREEMPTED or hit NODE_FAIL this many times.")

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, v: str | None) -> str | None:
        """Normalised to Slurm's [D-]HH:MM:SS; Slurm counts whole minutes."""
        if v is None:
            return v
        text = str(v).strip().lower()
        units = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
        num, unit = text.rstrip("smindh"), text[len(text.rstrip("smindh")):] or "m"
        if num.replace(".", "", 1).isdigit() and unit in units:
            secs = int(float(num) * units[unit])
        else:
            days, _, clock = text.rpartition("-")
            parts = clock.split(":")
            if not (days.isdigit() or not days) or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
                raise ValueError("use '30m', '2h', '90' (minutes) or '[D-]HH:MM:SS'")
            h, m, s_ = ([0] * (3 - len(parts)) + [int(p) for p in parts]) if len(parts) > 1 else (0, int(parts[0]), 0)
            secs = int(days or 0) * 86400 + h * 3600 + m * 60 + s_
        if secs <= 0:
            raise ValueError("must be positive")
        d, rest = divmod(max(60, -(-secs // 60) * 60), 86400)
        clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:00"
        return f"{d}-{clock}" if d else clock


class Guard(_Strict):
    """Live divergence/NaN guard (dstui/execute/guard.py): flag, and optionally stop, runs that go wrong."""

    baseline: str | None = Field(None, description="Condition whose loss the others follow; default: the spec's baseline.")
    rtol: float | None = Field(None, ge=0, description="Relative loss tolerance; with atol unset too, divergence is not checked.")
    atol: float | None = Field(None, ge=0, description="Absolute loss tolerance.")
    stop_on: list[Literal["nan", "divergence"]] = Field(
        default_factory=list, description="End a flagged run early (state killed) on these."
    )


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
    executor: Literal["local", "slurm"] = Field("local", description="Where runs start: this machine, or one Slurm job each.")
    slurm: SlurmOptions = Field(default_factory=SlurmOptions, description="Slurm job options (executor: slurm).")
    guard: Guard = Field(default_factory=Guard, description="Live NaN/divergence guard.")
    skip_predicted_oom: bool = Field(False, description="Skip runs whose memory forecast exceeds the GPU's memory.")
    gpu_memory_gib: float | None = Field(
        None, gt=0, description="GPU memory to forecast against (default: GPU 0 of this machine)."
    )

    _name_ok = field_validator("name")(classmethod(lambda cls, v: _safe_name(v)))


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
            # how long dstui waits for a run does not change what the run computes
            "settings": self.settings.model_dump(mode="json", exclude=set(SUPERVISION_ONLY)),
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
    """A readable condition name from axis values, made safe as a folder name (see core.names)."""
    parts = []
    for field, value in values.items():
        fmt = _SHORT.get(field)
        text = fmt(value) if fmt else f"{field}{value}"
        if text:
            parts.append(str(text))
    return names.make_safe("-".join(parts) or "base")


# -- loading ----------------------------------------------------------------


def _field_of(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or "(spec)"


def _raise_validation(e: ValidationError, *, file: str | None, condition: str | None) -> None:
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
        _raise_validation(e, file=file, condition=condition)
        raise AssertionError("unreachable") from None
    refused = ulysses_rules.refusal(s)
    if refused is not None:
        raise SpecError(refused[1], file=file, condition=condition, field=refused[0])
    from dstui.spec.capabilities import refusal  # what the runner of this kind can do

    cannot = refusal(s)
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
