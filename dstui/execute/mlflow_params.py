"""What a child run logs as MLflow params: the settings a person compares runs on.

MLflow's compare view ("show diff only", parallel coordinates) offers every
param as an axis, so params hold only what describes the computation: the
resolved settings the run's program takes (a ``kind: command`` run: only what
dstui itself does with it), the DeepSpeed config beyond what the settings
already say, the optimizer and scheduler, and once the runner reported them,
the DeepSpeed version and source and the model's shape. Nothing is empty.
Identity and bookkeeping (run key, repeat, batch, timeouts) are tags
(:mod:`dstui.tracking.tags`). docs/ARCHITECTURE.md, "MLflow layout", lists them.
"""

from __future__ import annotations

import json
from typing import Any

from dstui.core.secrets import redact
from dstui.spec import dsconfig, flags

# dstui's own settings that describe what a run computes on (besides its program's flags)
PLACEMENT = ("gpus", "nodes")
# what dstui does with a `kind: command` run: launch its argv on gpus x nodes, read its
# metrics, leave its first warmup_steps out of the statistics, count steps against steps
COMMAND_SETTINGS = ("command", "gpus", "nodes", "steps", "warmup_steps")
# ds_config entries that a setting already is (dsconfig writes them from it) or that only
# quieten DeepSpeed: a second param of the same thing would only double the compare view
DS_NOISE = frozenset(
    {"ds." + ".".join(path) for path in dsconfig.SETTING_PATHS}
    | {"ds.optimizer.params.lr", "ds.steps_per_print", "ds.wall_clock_breakdown"}
)
# header fields (runners' first record) that become params, under the name they get
HEADER_PARAMS = {
    "tokens_per_step": "tokens_per_step",
    "world_size": "world_size",
    "params": "model.parameters",
    "flops_per_token": "model.flops_per_token",
    "peak_tflops": "peak_tflops",
}
MODEL_SHAPE = ("layers", "hidden", "heads", "kv_heads", "vocab")


def text(value: Any) -> str:
    """One spelling for a param: strings as they are, everything else JSON (``true``, ``[..]``)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def settings_params(settings: dict[str, Any], ds_config: dict[str, Any]) -> dict[str, str]:
    """The params of a run from its resolved settings and generated ds_config (secrets masked)."""
    s = redact(settings)
    kind = s.get("kind") or "train"
    out: dict[str, Any] = {}
    if kind == "command":
        names: tuple[str, ...] = COMMAND_SETTINGS
    else:
        names = (*flags.runner_settings(kind), *PLACEMENT, "ds_config", "extra_args")
    for name in names:
        out[name] = s.get(name)
    if kind != "command":
        out.update(_optimizer(s, ds_config))
        out.update({k: v for k, v in dsconfig.flatten(ds_config).items() if k not in DS_NOISE})
        _drop_inert(out, s)
    for name, value in sorted((s.get("env") or {}).items()):
        out[f"env.{name}"] = value
    for name, value in (s.get("launcher") or {}).items():
        out[f"launcher.{name}"] = value
    return {k: text(v) for k, v in out.items() if not empty(v)}


def _optimizer(s: dict[str, Any], ds_config: dict[str, Any]) -> dict[str, Any]:
    """The optimizer and learning-rate schedule the runner ends up with (runners/trainer.py)."""
    opt = ds_config.get("optimizer") or {}
    if s.get("torch_adam") or not opt:  # the runner hands DeepSpeed torch's AdamW itself
        out = {"optimizer": "torch.optim.AdamW", "optimizer.weight_decay": 0.0}
    else:
        params = opt.get("params") or {}
        out = {"optimizer": f"deepspeed {opt.get('type', '?')}"}
        out.update({f"optimizer.{k}": v for k, v in params.items() if k != "lr"})
    sched = ds_config.get("scheduler") or {}
    out["scheduler"] = sched.get("type") or "constant"
    return out


def _drop_inert(out: dict[str, Any], s: dict[str, Any]) -> None:
    """Settings that do nothing under this run's other settings are no axis to compare on."""
    if "nvme" not in (s.get("offload"), s.get("offload_params")):
        out.pop("nvme_path", None)
    if int(s.get("sequence_parallel") or 1) == 1:
        out.pop("sp_mode", None)
        out.pop("sp_check", None)


def header_params(header: dict[str, Any], revision: dict[str, Any] | None = None) -> dict[str, str]:
    """Params from a runner's header record: the DeepSpeed it ran, the model's shape and size.

    ``deepspeed.source`` says where that DeepSpeed came from: ``pypi``, ``git:<sha>``,
    ``path:<folder>`` (a working tree, ``+diff`` when it had uncommitted changes) or
    ``installed`` (``installed git:<sha>`` when the installed one is a git checkout).
    """
    out: dict[str, Any] = {}
    version = (header.get("versions") or {}).get("deepspeed")
    if version:
        out["deepspeed.version"] = version
        out["deepspeed.source"] = deepspeed_source(revision or {}, header.get("deepspeed_git_sha"))
    for key, name in HEADER_PARAMS.items():
        out[name] = header.get(key)
    shape = header.get("model_shape") or {}
    for key in MODEL_SHAPE:
        out[f"model.{key}"] = shape.get(key)
    return {k: text(v) for k, v in out.items() if not empty(v)}


def deepspeed_source(revision: dict[str, Any], git_sha: str | None) -> str:
    """Where the run's DeepSpeed came from (see :func:`header_params`)."""
    kind = revision.get("kind") or "installed"
    sha = revision.get("sha") or git_sha
    if kind == "pypi":
        return "pypi"
    if kind == "git":
        return f"git:{sha}" if sha else "git"
    if kind == "path":
        where = f"path:{revision.get('requested') or '?'}"
        return where + ("+diff" if revision.get("diff_path") else "")
    return f"installed git:{sha}" if sha else "installed"
