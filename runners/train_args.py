"""Command line of runners/train.py: flags named after dstui's Settings, and the ds_config they imply.

Apart from the training code so that ``--help`` and argument errors answer
without torch being imported, and so that tools (benchmarks/gpu/sync_profile.py)
can build the same arguments.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import common
from common import RunnerError

from dstui.spec import dsconfig
from dstui.spec.models import Settings

_D = Settings.model_fields


def _default(name: str) -> Any:
    return _D[name].default


def build_parser() -> argparse.ArgumentParser:
    """Flags named after the Settings fields; defaults come from Settings so the two never drift."""
    p = argparse.ArgumentParser(
        prog="runners/train.py",
        description=(
            "Train a causal LM with DeepSpeed for a fixed number of optimizer steps and "
            "record loss, iteration time, throughput and memory (dstui's bundled runner). "
            "Start it with the DeepSpeed launcher, e.g. `deepspeed --num_gpus 2 runners/train.py ...`."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    a = p.add_argument
    a(
        "--model",
        default=_default("model"),
        help=f"model preset in configs/models/ ({', '.join(common.presets())}), a hub id or a local path; "
        "presets are random-initialised from their config",
    )
    a(
        "--load-weights",
        action="store_true",
        help="load pretrained weights of a hub/local model (default: its config only, random init)",
    )
    a(
        "--dataset",
        default=_default("dataset"),
        help="'tiny-corpus' (shipped text, byte tokens), 'synthetic' (seeded random tokens) "
        "or a Hugging Face dataset name (needs the hub or its cache)",
    )
    a(
        "--dataset-config",
        default=_default("dataset_config"),
        help="HF dataset config name, e.g. wikitext-2-raw-v1",
    )
    a(
        "--dataset-percent",
        type=float,
        default=_default("dataset_percent"),
        help="percentage of the train split (or of tiny-corpus) to use",
    )
    a("--seq-length", type=int, default=_default("seq_length"), help="tokens per sample")
    a(
        "--micro-batch",
        type=int,
        default=_default("micro_batch"),
        help="samples per rank per micro step (train_micro_batch_size_per_gpu)",
    )
    a(
        "--grad-accum",
        type=int,
        default=_default("grad_accum"),
        help="micro steps per optimizer step (gradient_accumulation_steps)",
    )
    a("--steps", type=int, default=_default("steps"), help="optimizer steps to run")
    a(
        "--warmup-steps",
        type=int,
        default=_default("warmup_steps"),
        help="leading steps left out of the timing statistics of the summary",
    )
    a(
        "--log-interval",
        type=int,
        default=_default("log_interval"),
        help="write a step record every N optimizer steps (the last step is always logged)",
    )
    a(
        "--dtype",
        choices=["fp32", "bf16", "fp16"],
        default=_default("dtype"),
        help="training precision",
    )
    a("--zero-stage", type=int, default=_default("zero_stage"), help="ZeRO stage 0-3")
    a(
        "--offload",
        choices=["none", "cpu", "nvme"],
        default=_default("offload"),
        help="offload optimizer state (ZeRO >= 1; cpu needs DeepSpeedCPUAdam, JIT-built)",
    )
    a(
        "--offload-params",
        choices=["none", "cpu", "nvme"],
        default=_default("offload_params"),
        help="offload parameters (ZeRO-3 only)",
    )
    a("--nvme-path", default=_default("nvme_path"), help="swap folder for nvme offload")
    a(
        "--deepcompile",
        action="store_true",
        help="DeepSpeed DeepCompile: compile.deepcompile=true and engine.compile()",
    )
    a("--compile", action="store_true", help="torch.compile the engine (engine.compile())")
    a(
        "--activation-checkpointing",
        action="store_true",
        help="HF gradient checkpointing (recompute activations in backward)",
    )
    a(
        "--sequence-parallel",
        type=int,
        default=_default("sequence_parallel"),
        help="Ulysses sequence-parallel degree (ranks that share one sequence); 1 = off",
    )
    a(
        "--sp-mode",
        choices=["eager", "compile", "deepcompile"],
        default=_default("sp_mode"),
        help="how the Ulysses model runs: eager, torch.compile, or DeepCompile",
    )
    a(
        "--sp-check",
        action="store_true",
        help="after the sequence-parallel run, train the same steps on the same samples without "
        "sequence parallelism and compare the losses (exit 1 when they differ beyond the "
        "tolerance: derived from the dtype and a measured noise run unless --sp-rtol/--sp-atol "
        "are given; see runners/sp_check.py)",
    )
    a("--sp-rtol", type=float, default=None, help="relative tolerance of --sp-check (fixed)")
    a("--sp-atol", type=float, default=None, help="absolute tolerance of --sp-check (fixed)")
    a(
        "--sp-inject",
        choices=["none", "head-split"],
        default="none",
        help="break the Ulysses attention on purpose (head-split: each rank's value heads "
        "rotated after the all-to-all) to prove --sp-check catches it",
    )
    a("--lr", type=float, default=_default("lr"), help="AdamW learning rate (constant)")
    a(
        "--torch-adam",
        action="store_true",
        help="use torch.optim.AdamW as a client optimizer instead of DeepSpeed's AdamW",
    )
    a("--seed", type=int, default=_default("seed"), help="seed of init, data order and dropout")
    a(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True) (slower; sets CUBLAS_WORKSPACE_CONFIG)",
    )
    a(
        "--ds-config",
        default=None,
        help="DeepSpeed config JSON to use as-is (dstui writes one per run); without it the "
        "runner builds one from these flags over configs/deepspeed/base.json",
    )
    a(
        "--metrics-file",
        default=os.environ.get("DSTUI_METRICS_FILE"),
        help="file rank 0 appends the JSON records to (default: $DSTUI_METRICS_FILE; unset = none)",
    )
    a(
        "--local_rank",
        "--local-rank",
        dest="local_rank",
        type=int,
        default=int(os.environ.get("LOCAL_RANK", 0)),
        help="set by the launcher",
    )
    return p


def settings_of(args: argparse.Namespace) -> Settings:
    """The args as a validated Settings, so the runner refuses what dstui itself would refuse."""
    from pydantic import ValidationError

    # --ds-config is a path to a finished config, not Settings.ds_config (a template name).
    fields = {k: v for k, v in vars(args).items() if k in _D and k != "ds_config"}
    try:
        return Settings(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        flag = f"--{where.replace('_', '-')}: " if where else ""
        msg = str(err["msg"]).removeprefix(
            "Value error, "
        )  # pydantic's prefix says nothing to a user
        raise RunnerError(f"{flag}{msg}") from None


def ds_config_of(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    """The given config as-is, or one generated by dstui.spec.dsconfig (standalone use)."""
    if args.ds_config:
        path = Path(args.ds_config)
        if not path.is_file():
            raise RunnerError(f"--ds-config: no such file: {path}")
        import json

        try:
            cfg = json.loads(path.read_text())
        except ValueError as e:
            raise RunnerError(f"--ds-config {path}: invalid JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise RunnerError(f"--ds-config {path}: not a JSON object")
        return cfg
    return dsconfig.deep_merge(dsconfig.load_template("base.json"), dsconfig.from_settings(s))
