"""Which settings a list of planned runs needs shown beside the built-in columns (both faces).

`dstui list`, its ``--json`` and Compose's run list show a fixed set of settings
(model, ZeRO stage, offload, compile, dtype, batch, sequence, ...). An axis or a
condition over any other setting (``lr: [1e-4, 1e-3]`` in lrsweep.yaml) was
invisible there but for the run names (issue 38.6). The settings whose values
differ between the runs and that no built-in column shows get a column of their
own, named after the setting, in the spec's field order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: what the run tables of `dstui list` and Compose show in columns of their own
BUILTIN = frozenset({"kind", "model", "zero_stage", "offload", "offload_params", "deepcompile", "compile", "dtype",
                     "micro_batch", "seq_length", "grad_accum", "gpus", "nodes", "steps"})  # fmt: skip
#: never a column: a command or extra arguments (long, and they may hold credentials: `--commands` shows
#: the argv masked), the environment (it may hold credentials)
NOT_SHOWN = frozenset({"command", "extra_args", "env", "env_visible"})
CELL_MAX = 24  # a table cell; --json has the value whole


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json", exclude_defaults=True) if hasattr(value, "model_dump") else value


def varying(runs: Sequence[Any]) -> list[str]:
    """The settings (by name, in their declared order) whose values differ between ``runs`` (RunSpecs)
    and that no built-in column shows."""
    if len(runs) < 2:
        return []
    names = list(type(runs[0].settings).model_fields)
    out = []
    for name in names:
        if name in BUILTIN or name in NOT_SHOWN:
            continue
        seen = {json.dumps(_plain(getattr(r.settings, name)), sort_keys=True, default=str) for r in runs}
        if len(seen) > 1:
            out.append(name)
    return out


def value_text(value: Any) -> str:
    """A setting's value in a table cell: numbers as Python writes them short (1e-04 -> 0.0001), the rest compact."""
    value = _plain(value)
    if isinstance(value, float):
        text = format(value, "g")
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    else:
        text = str(value)
    return text if len(text) <= CELL_MAX else text[: CELL_MAX - 1] + "…"


def values(run: Any, names: Sequence[str]) -> dict[str, Any]:
    """The run's values of ``names``, as JSON takes them (`dstui list --json`)."""
    return {name: _plain(getattr(run.settings, name)) for name in names}
