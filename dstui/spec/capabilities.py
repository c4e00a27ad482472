"""What each runner kind can do, checked when a spec is validated.

A setting that a bundled runner cannot honour must be refused before any
revision environment is built or any process launched: by ``dstui list``,
``dstui run`` and the TUI's compose screen alike, since all of them expand the
spec through :func:`dstui.spec.expand.conditions`, which calls
:func:`refusal` for every condition. The answer is one line that names the
condition (the caller adds the file, condition and field) and says why.

Rules are data (:data:`RULES`), so that a runner that learns a recipe drops
its rule here in the same change. Only explicitly given settings are judged
where the default would otherwise trip a rule (``dataset`` defaults to the
shipped corpus, which verify simply does not read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dstui.spec import flags

RUNNER_OF = {"train": "runners/train.py", "verify": "runners/compare_loss.py"}

# DeepSpeed optimizer types whose update the parity baseline reproduces with torch.optim.
VERIFY_OPTIMIZERS = ("adam", "adamw")
VERIFY_ONLY = flags.only_for("verify")  # mirror_zero3_hooks, rtol, atol


@dataclass(frozen=True)
class Refusal:
    field: str
    message: str


@dataclass(frozen=True)
class Rule:
    kind: str
    field: str
    refuses: Callable[[Any], bool]
    why: str


def _given(s: Any, name: str) -> bool:
    return name in s.model_fields_set


def _ds_optimizer(s: Any) -> str | None:
    opt = (s.ds_overrides or {}).get("optimizer")
    return str(opt.get("type", "")).lower() if isinstance(opt, dict) else None


RULES: tuple[Rule, ...] = (
    Rule("verify", "sequence_parallel", lambda s: s.sequence_parallel > 1,
         "the parity check compares data-parallel ZeRO only (use kind: train with sp_check)"),
    Rule("verify", "activation_checkpointing", lambda s: s.activation_checkpointing,
         "the parity runner does not enable activation checkpointing"),
    Rule("verify", "load_weights", lambda s: s.load_weights,
         "the parity runner starts both sides from the same random init"),
    Rule("verify", "dataset", lambda s: _given(s, "dataset") and s.dataset != "synthetic",
         "the parity runner trains on synthetic tokens only (dataset: synthetic)"),
    Rule("verify", "ds_overrides.optimizer",
         lambda s: _ds_optimizer(s) not in (None, *VERIFY_OPTIMIZERS),
         f"the baseline has a torch twin only for optimizer types {', '.join(VERIFY_OPTIMIZERS)}"),
    Rule("verify", "ds_overrides.pipeline", lambda s: "pipeline" in (s.ds_overrides or {}) and s.pipeline_stages < 2,
         "a pipeline block alone builds nothing: set pipeline_stages: N (>= 2) for the pipeline parity check"),
    Rule("verify", "pipeline_stages", lambda s: s.pipeline_stages > 1 and (s.gpus * s.nodes) % s.pipeline_stages != 0,
         "the ranks (gpus x nodes) must be a multiple of pipeline_stages"),
    Rule("verify", "pipeline_stages", lambda s: s.pipeline_stages > 1 and s.zero_stage > 1,
         "DeepSpeed's pipeline engine supports ZeRO stage 0 and 1 only"),
    Rule("verify", "pipeline_stages", lambda s: s.pipeline_stages > 1 and s.loss_pattern != "standard",
         "the pipeline parity check computes the standard loss only"),
    Rule("train", "ds_overrides.pipeline", lambda s: "pipeline" in (s.ds_overrides or {}),
         "runners/train.py builds no pipeline engine: it would train data-parallel and ignore the block "
         "(for pipeline parity use kind: verify with pipeline_stages: N)"),
    *(Rule("train", name, (lambda s, n=name: _given(s, n) and getattr(s, n) != type(s).model_fields[n].default),
           "it is a setting of kind: verify") for name in VERIFY_ONLY),
)


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def refusal(settings: Any) -> Refusal | None:
    """The first rule the settings break, as a one-line reason; None when the runner can do them."""
    for rule in RULES:
        if rule.kind != settings.kind or not rule.refuses(settings):
            continue
        head, _, rest = rule.field.partition(".")
        value = getattr(settings, head)
        if rest:
            value = (value or {}).get(rest)
            if isinstance(value, dict) and "type" in value:
                value = value["type"]
        return Refusal(rule.field, f"kind '{settings.kind}' ({RUNNER_OF[settings.kind]}) cannot do "
                                   f"{rule.field}={_shown(value)}: {rule.why}")
    return None
