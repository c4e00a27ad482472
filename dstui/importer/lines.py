"""One line of an old log in the formats the importer understands besides the seed's step line.

* the closing summary line of DeepSpeedExamples' ``run_acc_lm.py`` (:func:`parse_summary_line`);
* ``key=value`` step and summary lines (:func:`parse_kv_line`);
* an argparse ``Namespace(...)`` dump (:func:`parse_namespace`).

Pure functions of a line; :mod:`~dstui.importer.parse` reads whole logs with them.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from dstui.core.records import in_int64
from dstui.importer.names import ALIASES, STEP_KEYS, SUMMARY_METRICS, number_of, value_of

GIB = 1024**3
_KV = re.compile(r"([A-Za-z_][\w./-]*)=(\"[^\"]*\"|'[^']*'|[^\s,;]+)")
_SUMMARY_TAIL = re.compile(r"([A-Za-z_/]+(?: [a-z]+)?):\s*([-+]?[0-9.]+(?:[eE][-+]?\d+)?|None|nan|inf)(\s*GB)?")
_ITER_TIME = re.compile(r"\biteration time:\s*([-+]?[0-9.]+(?:[eE][-+]?\d+)?)")
_NAMESPACE = re.compile(r"Namespace\((.*?)\)(?=Namespace\(|\s*$)")


def parse_summary_line(line: str) -> tuple[dict[str, Any], dict[str, float]] | None:
    """(settings, summary metrics) of a run_acc_lm summary line, else None."""
    m = _ITER_TIME.search(line)
    if not m:
        return None
    head, tail = line[: m.start()], line[m.start() :]
    params: dict[str, Any] = {}
    tokens = head.split()
    # result.txt prefixes a timestamp (digits); the model is the first token without '='
    for tok in tokens:
        if "=" in tok or tok.isdigit() or tok.startswith("["):
            continue
        params["model"] = tok
        break
    summary: dict[str, float] = {}
    for key, val in _KV.findall(head):
        name = key.lower()
        if name in SUMMARY_METRICS:
            num = number_of(val)
            if num is not None:
                summary[SUMMARY_METRICS[name]] = num
        elif name in ALIASES:
            params[ALIASES[name]] = value_of(val)
    for key, val, gb in _SUMMARY_TAIL.findall(tail):
        name = key.lower()
        if name not in SUMMARY_METRICS:
            continue
        num = number_of(val)
        if num is None:
            continue
        if gb and name in ("alloc_mem", "peak_mem", "reserved_mem", "peak_reserved_mem"):
            num = num * GIB
        summary[SUMMARY_METRICS[name]] = num
    if "iter_time_mean" not in summary:
        return None
    return params, summary


def parse_kv_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """('step', record) or ('summary', {'params', 'summary'}) for a key=value line."""
    pairs = {k.lower(): v for k, v in _KV.findall(line)}
    if len(pairs) < 2:
        return None
    if "step" in pairs and "loss" in pairs:
        step = value_of(pairs["step"]) if len(pairs["step"]) <= 20 else None
        if not in_int64(step):
            raise ValueError("step is not a 64-bit integer")
        rec: dict[str, Any] = {"type": "step", "step": step}
        if "epoch" in pairs and isinstance(value_of(pairs["epoch"]), int):
            rec["epoch"] = value_of(pairs["epoch"])
        for key, name in STEP_KEYS.items():
            if key in pairs:
                num = number_of(pairs[key])
                if num is None and key == "loss":
                    raise ValueError("loss is not a number")
                if num is not None:
                    rec[name] = num
        return "step", rec
    summ = {SUMMARY_METRICS[k]: number_of(v) for k, v in pairs.items() if k in SUMMARY_METRICS}
    summ = {k: v for k, v in summ.items() if v is not None}
    params = {ALIASES[k]: value_of(v) for k, v in pairs.items() if k in ALIASES}
    if "iter_time_mean" in summ and params:
        return "summary", {"params": params, "summary": summ}
    return None


def parse_namespace(line: str) -> dict[str, Any]:
    """Settings from an argparse ``Namespace(...)`` dump (literal values only)."""
    m = _NAMESPACE.search(line.strip())
    if not m:
        return {}
    try:
        call = ast.parse(f"f({m.group(1)})", mode="eval").body
    except SyntaxError:
        return {}
    out: dict[str, Any] = {}
    for kw in getattr(call, "keywords", []):
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            continue
    return out
