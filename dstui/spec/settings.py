"""The settings of one condition: the typed model every other part of dstui reads.

``Settings`` is the single list of what a condition can set. Its fields carry
their type, default and description, and say which bundled runners take them as
a command-line flag (``runners`` in the field's extra schema):
:mod:`dstui.spec.flags` derives the runners' argparse and the launcher's argv
from that, so a new setting is declared here once.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dstui.core import names, secrets
from dstui.spec import messages

Offload = Literal["none", "cpu", "nvme"]
Dtype = Literal["fp32", "bf16", "fp16"]
Kind = Literal["train", "verify", "command"]
MetricsFormat = Literal["jsonl", "seed"]
SpMode = Literal["eager", "compile", "deepcompile", "ring"]
# runners/parity_patterns.py: how a verify step turns a micro-batch into the loss
LossPattern = Literal["standard", "second_forward", "logits_in_loss", "outside_branch", "frozen"]
ZERO_STAGES = (0, 1, 2, 3)


def safe_name(v: str) -> str:
    """Names become folders and MLflow names: one rule for all (see :mod:`dstui.core.names`)."""
    why = names.problem(v)
    if why:
        raise ValueError(why)
    return v


def _runners(*kinds: str) -> dict[str, Any]:
    """The field's flag goes to these bundled runners (``--dash-form``; see dstui.spec.flags)."""
    return {"runners": list(kinds)}


TRAIN = _runners("train")
VERIFY = _runners("verify")
BOTH = _runners("train", "verify")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Launcher(StrictModel):
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


class Settings(StrictModel):
    """Everything that defines one condition. Axes and conditions override these."""

    KEY_WORD: ClassVar[str] = "setting"  # what an error calls an unknown key (dstui.spec.messages)

    kind: Kind = Field("train", description="train: runners/train.py; verify: compare_loss.py; command: your argv.")
    model: str = Field("tiny-llama", description="Preset in configs/models/ (random-initialised from its config), a hub id or a local path.", json_schema_extra=BOTH)
    load_weights: bool = Field(False, description="Load pretrained weights of a hub/local model (default: its config only, random init).", json_schema_extra=TRAIN)
    dataset: str = Field("tiny-corpus", description="'tiny-corpus' (shipped text, byte tokens), 'synthetic' (seeded random tokens) or a Hugging Face dataset name (needs the hub or its cache).", json_schema_extra=TRAIN)
    dataset_config: str | None = Field(None, description="HF dataset config, e.g. 'wikitext-2-raw-v1'.", json_schema_extra=TRAIN)
    dataset_percent: float = Field(100.0, gt=0, le=100, description="Percentage of the HF split (or of tiny-corpus) to use.", json_schema_extra=TRAIN)
    seq_length: int = Field(128, ge=1, description="Tokens per sample.", json_schema_extra=BOTH)
    micro_batch: int = Field(1, ge=1, description="Samples per rank per micro step (train_micro_batch_size_per_gpu).", json_schema_extra=BOTH)
    grad_accum: int = Field(1, ge=1, description="Micro steps per optimizer step (gradient_accumulation_steps).", json_schema_extra=BOTH)
    steps: int = Field(10, ge=1, description="Optimizer steps to run.", json_schema_extra=BOTH)
    warmup_steps: int = Field(2, ge=0, description="Leading steps left out of the timing statistics.", json_schema_extra=TRAIN)
    log_interval: int = Field(1, ge=1, description="Write a step record every N optimizer steps (the last step is always logged).", json_schema_extra=TRAIN)
    dtype: Dtype = Field("fp32", description="Training precision.", json_schema_extra=BOTH)
    zero_stage: int = Field(0, description="ZeRO stage: 0, 1, 2 or 3.", json_schema_extra=BOTH)
    offload: Offload = Field("none", description="Offload of optimizer state (ZeRO >= 1; cpu needs DeepSpeedCPUAdam, JIT-built).", json_schema_extra=BOTH)
    offload_params: Offload = Field("none", description="Offload of parameters (ZeRO-3 only).", json_schema_extra=BOTH)
    nvme_path: str = Field("/tmp/dstui_nvme", description="Swap folder for nvme offload.", json_schema_extra=BOTH)
    deepcompile: bool = Field(False, description="DeepSpeed DeepCompile: compile.deepcompile=true and engine.compile().", json_schema_extra=BOTH)
    compile: bool = Field(False, description="torch.compile the engine (engine.compile()).", json_schema_extra=BOTH)
    activation_checkpointing: bool = Field(False, description="HF gradient checkpointing (recompute activations in backward).", json_schema_extra=TRAIN)
    sequence_parallel: int = Field(1, ge=1, description="Sequence-parallel degree (ranks that share one sequence; Ulysses or ring, see sp_mode); 1 = off.", json_schema_extra=TRAIN)
    sp_mode: SpMode = Field(
        "eager",
        description="How the sequence is shared: Ulysses all-to-all run eagerly (eager), under torch.compile (compile) or "
        "DeepCompile (deepcompile, CUDA only), or ring attention over the sequence-parallel group (ring: PyTorch's "
        "context-parallel ring, eager).",
        json_schema_extra=TRAIN,
    )
    sp_check: bool = Field(
        False,
        description="Sequence parallelism: after the run, train the same steps on the same samples without it and "
        "compare (1) Q/K/V before and after the exchange and the attention outputs of chosen layers at step 1 "
        "(a FAIL names the first layer and stage that differ) and (2) the losses of every logged step. The run "
        "fails when either differs beyond its tolerance, derived from the dtype and a measured noise run "
        "(see runners/sp_check.py, runners/sp_tensors.py).",
        json_schema_extra=TRAIN,
    )
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (constant).", json_schema_extra=BOTH)
    torch_adam: bool = Field(False, description="Use torch.optim.AdamW as a client optimizer instead of DeepSpeed's AdamW.", json_schema_extra=BOTH)
    seed: int = Field(42, description="Seed of init, data order and dropout.", json_schema_extra=BOTH)
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms(True) (slower; sets CUBLAS_WORKSPACE_CONFIG).", json_schema_extra=TRAIN)
    gpus: int = Field(1, ge=1, description="Ranks per node (GPUs, or CPU processes without GPUs).")
    nodes: int = Field(1, ge=1, description="Number of nodes (needs launcher.hostfile).")
    mirror_zero3_hooks: bool = Field(
        False,
        description="verify: wrap the PyTorch baseline like ZeRO-3 wraps modules, so ZeRO-3 can match exactly "
        "(ZeRO-3's hooks regroup gradient sums: ulp-level differences otherwise).",
        json_schema_extra=VERIFY,
    )
    loss_pattern: LossPattern = Field(
        "standard",
        description="verify: how a step makes its loss, on both sides: standard (one forward, .loss), second_forward "
        "(two forwards per backward), logits_in_loss (loss + z-loss on the same output's logits), outside_branch "
        "(a term the wrapped module computes outside the engine's forward), frozen (input embeddings frozen); "
        "runners/parity_patterns.py.",
        json_schema_extra=VERIFY,
    )
    pipeline_stages: int = Field(
        1, ge=1,
        description="verify: DeepSpeed's pipeline engine with this many stages (>= 2; ZeRO 0/1, grad_accum micro-batches "
        "per step) against the same layers unpipelined (runners/parity_pipeline.py); 1 = data parallel only.",
        json_schema_extra=VERIFY,
    )
    rtol: float = Field(0.0, ge=0, description="verify: relative tolerance; with atol, a fixed tolerance instead of the automatic one.", json_schema_extra=VERIFY)
    atol: float = Field(0.0, ge=0, description="verify: absolute tolerance.", json_schema_extra=VERIFY)
    ds_config: str = Field("base.json", description="Template in configs/deepspeed/ or a path.")
    ds_overrides: dict[str, Any] = Field(default_factory=dict, description="Merged into the generated ds_config.")
    command: list[str] | None = Field(
        None,
        description="kind=command: argv list, never a shell string. '{env:NAME}' in an element takes NAME's value "
        "(run env, else dstui's environment) for the process only; files show the reference.",
    )
    metrics_format: MetricsFormat = Field("jsonl", description="How dstui reads the program's metrics.")
    launcher: Launcher = Field(default_factory=Launcher, description="deepspeed launcher options.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    env_visible: list[str] = Field(default_factory=list, description="env names (or PREFIX_*) shown in files, params and logs; every other env value is masked (core.secrets).")
    extra_args: list[str] = Field(default_factory=list, description="More runner arguments (argv list; '{env:NAME}' as in command).")
    hung_after_s: float = Field(600.0, gt=0, description="No new output for this long = hung.")
    stall_after_s: float | None = Field(
        None, ge=0, description="No new training step for this long = stalled (catches a run that prints while stuck). "
        "Unset: automatic, after the first step max(10x the slowest step so far, 300 s); 0: off."
    )
    max_runtime_s: float | None = Field(None, gt=0, description="Kill a run that runs longer than this.")

    @field_validator("zero_stage")
    @classmethod
    def _zero_stage(cls, v: int) -> int:
        """Checked here, not only by DeepSpeed, whose enum message names its own field ('stage') and lists 3 twice."""
        if v not in ZERO_STAGES:
            raise ValueError(messages.one_of(ZERO_STAGES, v))
        return v

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
