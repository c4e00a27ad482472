"""Names and values in old logs: setting aliases, summary/step metric names, log-name codes.

The seeds' scripts spell one setting several ways (``np``, ``world_size``,
``num_processes``); everything here maps them onto dstui's setting and metric
names, so the parser (:mod:`dstui.importer.parse`) and the writer
(:mod:`dstui.importer.seedlogs`) agree on one vocabulary.
"""

from __future__ import annotations

import re
from typing import Any

# summary / key=value names -> dstui setting names
ALIASES = {
    "model": "model",
    "model_name": "model",
    "np": "world_size",
    "world_size": "world_size",
    "num_processes": "world_size",
    "batch_size": "micro_batch",
    "micro_batch": "micro_batch",
    "micro_batch_size": "micro_batch",
    "bs": "micro_batch",
    "seq": "seq_length",
    "seq_length": "seq_length",
    "seq_len": "seq_length",
    "zero_stage": "zero_stage",
    "stage": "zero_stage",
    "acc": "grad_accum",
    "gradient_accumulation_steps": "grad_accum",
    "grad_accum": "grad_accum",
    "ac": "activation_checkpointing",
    "activation_checkpointing": "activation_checkpointing",
    "compile": "compile",
    "deepcompile": "deepcompile",
    "backend": "backend",
    "passes": "passes",
    "schedule": "schedule",
    "ds": "deepspeed",
    "dataset_name": "dataset",
    "dataset": "dataset",
    "dataset_percentage": "dataset_percent",
    "learning_rate": "lr",
    "lr": "lr",
    "num_layers": "num_layers",
    "offload_opt_states": "offload_opt_states",
    "sp_size": "sequence_parallel",
    "dtype": "dtype",
    "offload": "offload",
}
# summary names -> summary.<field> metric
SUMMARY_METRICS = {
    "iteration time": "iter_time_mean",
    "iter_time_mean": "iter_time_mean",
    "iteration_time": "iter_time_mean",
    "avg_iter_time": "iter_time_mean",
    "mean_iter_time": "iter_time_mean",
    "compile_time": "compile_time",
    "alloc_mem": "mem_alloc",
    "peak_mem": "mem_peak_max",
    "mem_peak_max": "mem_peak_max",
    "reserved_mem": "mem_reserved",
    "peak_reserved_mem": "mem_reserved_max",
    "tokens/s": "tokens_per_s_mean",
    "tokens_per_s": "tokens_per_s_mean",
    "samples/s": "samples_per_s_mean",
}
# key=value step names -> step metric names
STEP_KEYS = {
    "loss": "loss",
    "time": "iter_time",
    "iter_time": "iter_time",
    "alloc_mem": "mem_alloc",
    "mem_alloc": "mem_alloc",
    "peak_mem": "mem_peak",
    "mem_peak": "mem_peak",
    "tokens_per_s": "tokens_per_s",
    "lr": "lr",
}


def value_of(text: str) -> Any:
    """Like analysis.parse_value, but quotes around a value are dropped first."""
    from dstui.analysis.rundata import parse_value

    return parse_value(text.strip().strip("'\""))


def number_of(text: str) -> float | None:
    v = value_of(text)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


# -- settings from file names, commands and metadata ---------------------------------------

# seed 000/003 log names: debug_n0_Meta-Llama-3-8B_deepspeed_np2z3c0dc0E0b1seq512g1a1pALL.log
_NAME_CODES = (
    (re.compile(r"np(\d+)"), "world_size", int),
    (re.compile(r"(?:^|[_\d])z([0-3])(?=c\d|dc|_|$)"), "zero_stage", int),
    (re.compile(r"dc([01])"), "deepcompile", lambda v: v == "1"),
    (re.compile(r"(?<![a-z])c([01])(?=s\d|dc|b\d)"), "compile", lambda v: v == "1"),
    (re.compile(r"b(\d+)seq"), "micro_batch", int),
    (re.compile(r"seq(\d+)"), "seq_length", int),
)


def params_from_name(stem: str) -> dict[str, Any]:
    """Settings encoded in seed log names (np, z, c, dc, b, seq); weakest source."""
    out: dict[str, Any] = {}
    tail = stem.rsplit("_", 1)[-1]
    for rx, name, conv in _NAME_CODES:
        m = rx.search(tail)
        if m:
            out[name] = conv(m.group(1))
    return out


def params_from_command(cmd: str) -> dict[str, Any]:
    """``--zero_stage 1 --deepcompile ...`` -> settings (flags without a value are True)."""
    out: dict[str, Any] = {}
    toks = cmd.split()
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.startswith("--"):
            key = tok[2:].replace("-", "_")
            if "=" in key:
                key, val = key.split("=", 1)
                out[key] = value_of(val)
            elif i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                out[key] = value_of(toks[i + 1])
                i += 1
            else:
                out[key] = True
        i += 1
    return {ALIASES.get(k, k): v for k, v in out.items()}


def normalise(config: dict[str, Any]) -> dict[str, Any]:
    """Settings under dstui's names (``stage`` -> ``zero_stage``, ...), as params compare them."""
    return {ALIASES.get(k, k): v for k, v in config.items()}

