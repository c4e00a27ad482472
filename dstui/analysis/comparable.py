"""Which settings change a run's numerics: what a loss comparison may judge (issue 28.5).

A report compares each condition's loss with the baseline's. That check finds
bugs only where the two *should* compute the same numbers: ZeRO stage, offload,
torch.compile, DeepCompile, a DeepSpeed revision partition or schedule the same
computation. Where a setting changes the computation by design (micro batch,
gradient accumulation, sequence length, dtype, model, learning rate, seed ...),
a loss difference is the setting's effect, not a regression, and calling it
FAIL misleads. This module is the one place that says which is which:

* :data:`CHANGES_NUMERICS` maps each numerics-changing setting of
  :class:`dstui.spec.settings.Settings` to why;
* :data:`KEEPS_NUMERICS` lists the settings that should not change them (or
  only how a run is watched), also with why;
* every Settings field is in exactly one of the two (a unit test holds that, so
  a new setting cannot slip past the judgement unclassified);
* the resolved DeepSpeed config (``ds.*`` params) is judged by key: the
  partitioning/compile/logging keys keep the numerics (:data:`DS_KEEPS_PREFIXES`),
  any other key that differs (batch sizes, precision, optimizer, clipping) changes them;
* any other param (``revision``, ``repeat``, ``run_key``, derived figures such
  as ``tokens_per_step`` or a model's shape, versions) is bookkeeping or follows
  from the settings above, and is not judged itself.

:func:`numerics_differences` lists why two conditions are not comparable;
:func:`reference_of` finds, for a condition the baseline cannot judge, another
condition with the same numerics to compare it with instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dstui.analysis.identity import EMPTY, keys_of, known

if TYPE_CHECKING:  # pragma: no cover
    from dstui.analysis.rundata import RunData
    from dstui.analysis.stats import ConditionStats

_BATCH = "changes how many samples each optimizer step averages over"
_RANKS = "changes the data-parallel ranks, so the samples each optimizer step averages over"
_DATA = "trains on different data"

CHANGES_NUMERICS: dict[str, str] = {
    "kind": "a different program",
    "model": "a different model",
    "load_weights": "different initial weights",
    "dataset": _DATA,
    "dataset_config": _DATA,
    "dataset_percent": _DATA,
    "seq_length": "changes the tokens per sample",
    "micro_batch": _BATCH,
    "grad_accum": _BATCH,
    "gpus": _RANKS,
    "nodes": _RANKS,
    "sequence_parallel": _RANKS + " (ranks that share one sequence)",
    "dtype": "changes the precision of the arithmetic",
    "lr": "a different learning rate",
    "seed": "different initial weights, data order and dropout",
    "command": "a different command: dstui cannot tell what it computes",
    "extra_args": "different runner arguments: dstui cannot tell what they change",
    "loss_pattern": "a different loss (verify)",
}

KEEPS_NUMERICS: dict[str, str] = {
    "zero_stage": "partitions the same computation",
    "offload": "moves the same optimizer step to another device",
    "offload_params": "moves the same parameters to another device",
    "nvme_path": "where offloaded state is kept",
    "compile": "compiles the same computation",
    "deepcompile": "compiles the same computation",
    "sp_mode": "computes the same attention (Ulysses eagerly or compiled, or as a ring)",
    "activation_checkpointing": "recomputes the same activations",
    "torch_adam": "the same AdamW from another implementation",
    "deterministic": "the same computation in a fixed order",
    "ds_config": "judged through the resolved ds.* params",
    "ds_overrides": "judged through the resolved ds.* params",
    "launcher": "how ranks are started",
    "env": "the process environment",
    "env_visible": "what files and logs show",
    "metrics_format": "how metrics are read",
    "steps": "losses are compared on the steps both logged",
    "warmup_steps": "which steps timing statistics leave out",
    "log_interval": "how often steps are logged",
    "hung_after_s": "supervision only",
    "stall_after_s": "supervision only",
    "max_runtime_s": "supervision only",
    "sp_check": "an extra check after training",
    "mirror_zero3_hooks": "verify runs only",
    "rtol": "verify runs only",
    "atol": "verify runs only",
    "pipeline_stages": "splits the same layers over pipeline stages (verify)",
}

# resolved ds_config keys (params ``ds.<key>``) that partition, compile or log the same computation
DS_KEEPS_PREFIXES = (
    "zero_optimization", "compile", "activation_checkpointing", "aio", "steps_per_print", "wall_clock_breakdown",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "flops_profiler", "comms_logger", "timers",
    "tensorboard", "wandb", "csv_monitor", "memory_breakdown", "dump_state", "checkpoint",
)  # fmt: skip
# ds keys absent on one side only when an equivalent client optimizer replaces DeepSpeed's (torch_adam)
DS_ONE_SIDED_OK = ("optimizer",)


@dataclass(frozen=True)
class Difference:
    """One setting whose values differ between two conditions, and why that changes the numerics."""

    setting: str
    ours: str
    theirs: str
    why: str

    def text(self) -> str:
        return f"{self.setting} {self.ours} vs {self.theirs}: {self.why}"


def _ds_changes(key: str) -> bool:
    sub = key[3:]
    return not any(sub == p or sub.startswith(p + ".") for p in DS_KEEPS_PREFIXES)


def _judged(key: str) -> bool:
    """The key decides a run's numerics (see the module docstring)."""
    return (key.startswith("ds.") and _ds_changes(key)) or key.split(".", 1)[0] in CHANGES_NUMERICS


def _values(runs: Sequence[RunData], keys: set[str]) -> dict[str, set[str]]:
    """Each judged key's known values over the runs (unknown ones left out: no evidence either way)."""
    out: dict[str, set[str]] = {}
    for r in runs:
        for k, v in known(r, keys).items():
            out.setdefault(k, set()).add(v)
    return out


def _show(values: set[str]) -> str:
    shown = sorted("(unset)" if v == EMPTY else v for v in values)
    return "/".join(shown) if len(shown) <= 3 else f"{len(shown)} values"


def numerics_differences(ours: Sequence[RunData], theirs: Sequence[RunData]) -> list[Difference]:
    """Why two groups of runs (two conditions) compute different numbers; [] when they should not.

    Values are read as :mod:`dstui.analysis.identity` reads them: an empty
    setting is a value ("(unset)"), a value a record lacks (a run stopped
    before its runner reported the model's shape) is no evidence either way.
    Settings come first; ``ds.*`` keys are listed only when no setting explains
    the difference already (``micro_batch`` also changes ``ds.train_batch_size``).
    """
    keys = {k for k in keys_of([*ours, *theirs]) if _judged(k)}
    a, b = _values(ours, keys), _values(theirs, keys)
    settings, ds = [], []
    for k in sorted(set(a) & set(b)):  # a key unknown on one side is no evidence of a difference
        va, vb = a[k], b[k]
        if va == vb:
            continue
        if k.startswith("ds."):
            one_sided = EMPTY in va or EMPTY in vb
            if one_sided and any(k[3:].startswith(p + ".") or k[3:] == p for p in DS_ONE_SIDED_OK):
                continue
            ds.append(Difference(k, _show(va), _show(vb), "a different DeepSpeed config value"))
        else:
            settings.append(Difference(k, _show(va), _show(vb), CHANGES_NUMERICS[k.split(".", 1)[0]]))
    return settings or ds


def reference_of(cond: ConditionStats, candidates: Sequence[ConditionStats]) -> ConditionStats | None:
    """The first other condition (in order) with the same numerics and usable runs, or None."""
    for other in candidates:
        if other is cond or not other.n_usable:
            continue
        if not numerics_differences(cond.runs, other.runs):
            return other
    return None
