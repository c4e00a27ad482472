"""Options, DeepSpeed config and model of the parity runner (``runners/compare_loss.py``).

The setting flags are derived from dstui's Settings model (dstui.spec.flags:
names, types, help; a few defaults of its own) and accept the seed's spellings
too. A config given with ``--ds-config`` (what dstui passes) is used as it is;
without one the config is base.json + the flags, with ``--gradient-clipping``
(default 0: no clipping) written over it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import common
from parity import canonical_dtype, option_names
from pydantic import ValidationError

from dstui.spec import dsconfig, flags
from dstui.spec.settings import Settings

# Keys of a model preset that only the parity runner understands (transformers ignores them).
LAYER_SCHEDULE_KEY = "dstui_layer_schedule"

# Where the parity runner departs from the Settings model: its own standalone defaults
# (short runs, an lr large enough that an lr bug shows at step 1), the seed's dtype
# spellings and the stages it can compare.
OVERRIDES: dict[str, dict[str, Any]] = {
    "seq_length": {"default": 64},
    "steps": {"default": 5},
    "lr": {"default": 1e-3},
    "dtype": {"type": canonical_dtype},
    "zero_stage": {"type": int, "choices": [0, 1, 2, 3], "default": 1},
}
# The seed's spellings of two options, accepted beside the dash and underscore forms.
ALIASES = {"offload": ("--offload_device", "--offload-device"), "torch_adam": ("--use_torch_adam", "--use-torch-adam")}
NOTES = {
    "model": "also tiny-llama-shared (tied embeddings and a layer applied twice) or a config .json",
    "grad_accum": "flag-built config only (a --ds-config's gradient_accumulation_steps wins)",
    "lr": "large enough that an lr bug shows at step 1",
    "dtype": "torch.float32, torch.bfloat16, torch.float16 accepted too",
    "torch_adam": "the exact-parity setting",
    "compile": "here the baseline is compiled too",
    "deepcompile": "implies --compile for the engine",
}


def build_parser() -> argparse.ArgumentParser:
    """The Settings flags of kind verify (dash and underscore forms), then the runner's own."""
    p = argparse.ArgumentParser(
        prog="compare_loss.py",
        description="DeepSpeed ZeRO vs plain PyTorch parity (loss, gradient norm, per-parameter "
                    "gradients and parameters, step by step). Exit 0 PASS, 1 FAIL, 2 error.",
    )
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1, help="Set by the launcher.")
    flags.add_setting_flags(p, "verify", spell=lambda name: option_names(name, *ALIASES.get(name, ())),
                            overrides=OVERRIDES, notes=NOTES)
    p.add_argument("--tolerance", choices=["auto", "exact", "measured"], default="auto",
                   help="auto: bit-exact where the arithmetic is the same, else measured from a twin "
                        "baseline's noise (runners/parity_tolerance.py says when and how).")
    p.add_argument("--gradient-clipping", "--gradient_clipping", type=float, default=0.0,
                   help="Flag-built config only: clip at this global norm (0: no clipping).")
    p.add_argument(*option_names("verbose_logging"), action="store_true",
                   help="torch._logging recompiles/guards/graph breaks.")
    p.add_argument(*option_names("ds_config"), default=None,
                   help="A generated DeepSpeed config, used as it is (else built from the flags).")
    p.add_argument(*option_names("metrics_file"), default=os.environ.get("DSTUI_METRICS_FILE"),
                   help="metrics.jsonl to append to (default: $DSTUI_METRICS_FILE).")
    p.add_argument("--inject", choices=["none", "lr", "grad"], default="none",
                   help="Deliberately break DeepSpeed's side in the runner (see also "
                        "$DSTUI_PARITY_INJECT, runners/parity_inject.py, for faults inside the engine).")
    p.add_argument("--inject-step", "--inject_step", type=int, default=3,
                   help="Step whose gradient --inject grad perturbs (1-based).")
    p.add_argument("--cases", default=None, metavar="FILE",
                   help="Run several parity runs in this one launch, each with its own argv, environment, "
                        "log and exit file (JSON; runners/parity_cases.py): the ranks start once.")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.deepcompile:
        args.compile = True
    return args


def settings_of(args: argparse.Namespace, world: int) -> Settings:
    """The dstui Settings these flags describe (validated: offload needs ZeRO, ...)."""
    given = {name: getattr(args, name) for name in flags.runner_settings("verify")}
    return Settings(kind="verify", dataset="synthetic", warmup_steps=0, gpus=world, **given)


def ds_config_of(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """The DeepSpeed config: ``--ds-config`` as it is, else base.json + the flags."""
    if args.ds_config:
        return json.loads(Path(args.ds_config).read_text())
    try:
        s = settings_of(args, world)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "options"
        raise SystemExit(f"compare_loss.py: error: {where}: {first['msg']}") from None
    cfg = dsconfig.deep_merge(dsconfig.load_template("base.json"), dsconfig.from_settings(s))
    cfg["gradient_clipping"] = args.gradient_clipping
    cfg["steps_per_print"] = 10**9
    return cfg


def dtype_of(cfg: dict[str, Any]) -> str:
    if cfg.get("bf16", {}).get("enabled"):
        return "bf16"
    return "fp16" if cfg.get("fp16", {}).get("enabled") else "fp32"


def clipping_of(cfg: dict[str, Any]) -> float:
    """An absent key is not "no clipping": DeepSpeed's default applies, and the baseline must match."""
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    return float(cfg.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT) or 0.0)


def adam_spec(cfg: dict[str, Any], lr: float) -> tuple[str, dict[str, Any]]:
    """(class name, kwargs) of the torch optimizer equivalent to the config's.

    DeepSpeed's "Adam" type means AdamW unless ``adam_w_mode`` is false; with no
    optimizer block the runner hands DeepSpeed a torch AdamW itself.
    """
    opt = cfg.get("optimizer")
    if not opt:
        return "AdamW", {"lr": lr, "weight_decay": 0.0}
    params = dict(opt.get("params", {}))
    kind = str(opt.get("type", "AdamW")).lower()
    adam_w = kind == "adamw" or bool(params.get("adam_w_mode", True))
    kwargs = {k: params[k] for k in ("lr", "betas", "eps", "weight_decay") if k in params}
    kwargs.setdefault("lr", lr)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    if kind not in ("adam", "adamw"):
        print(f"compare_loss: optimizer type '{opt.get('type')}' has no torch twin; "
              "the baseline uses AdamW with the same lr", flush=True)
    return ("AdamW" if adam_w else "Adam"), kwargs


def build_model(name: str) -> tuple[Any, Any]:
    """(model, config) with random init from the global RNG (seeded by the caller).

    A preset's ``dstui_layer_schedule`` (e.g. ``[0, 1, 0]``) lists which
    decoder layer runs at each depth: a layer named twice is one module applied
    twice per step, its gradient the sum of both uses.
    """
    from transformers import AutoModelForCausalLM

    try:
        config = common.model_config(name)
    except common.RunnerError as e:
        raise SystemExit(f"compare_loss.py: error: {e}") from None
    schedule = getattr(config, LAYER_SCHEDULE_KEY, None)
    model = AutoModelForCausalLM.from_config(config)
    if schedule:
        import torch

        layers = model.model.layers
        if max(schedule) >= len(layers) or min(schedule) < 0:
            raise SystemExit(f"compare_loss.py: error: {name}: {LAYER_SCHEDULE_KEY} {schedule} names a layer "
                             f"outside 0..{len(layers) - 1}")
        model.model.layers = torch.nn.ModuleList(layers[i] for i in schedule)
        config.num_hidden_layers = len(schedule)
    model.train()
    return model, config
