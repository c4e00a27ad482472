"""A Slurm job's node readings into its run's ``system.jsonl``: the supervisor's side of the node samplers.

The supervisor alone writes ``system.jsonl`` (one writer: appends from several
hosts to one file on a network filesystem can interleave). Each node's sampler
(:mod:`dstui.execute.injob.node_sampler`) writes ``nodes/<node>.jsonl``;
:func:`merge` copies each such file's new complete lines there, so ingestion,
MLflow (``system/<node>/...``) and the Live view read every node as they read a
local run's readings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dstui.execute.injob.node_sampler import NODES_DIR, node_label

OFFSETS_FILE = "merged.json"  # in nodes/: how far each node's file is copied into system.jsonl
MAX_LINE = 64 * 1024  # a longer line is no sampler record: skipped and counted


def merge(run_dir: Path, system_file: Path) -> int:
    """Append each node file's new complete lines to ``system_file``; returns how many were copied.

    Offsets are saved after the append: a supervisor killed in between copies
    those few lines once more on its next pass (two readings of the same
    instant), never loses one. Lines that are not a JSON object of at most
    ``MAX_LINE`` bytes are skipped and counted in the offsets file.
    """
    folder = run_dir / NODES_DIR
    if not folder.is_dir():
        return 0
    offsets_path = folder / OFFSETS_FILE
    try:
        offsets = json.loads(offsets_path.read_text())
        if not isinstance(offsets, dict):
            offsets = {}
    except (OSError, ValueError):
        offsets = {}
    lines: list[str] = []
    changed = False
    for f in sorted(folder.glob("*.jsonl")):
        node = node_label(f.stem)
        start = int(offsets.get(node, 0)) if str(offsets.get(node, 0)).isdigit() else 0
        try:
            with open(f, "rb") as fh:
                fh.seek(start)
                data = fh.read()
        except OSError:
            continue
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next pass
        if end <= 0:
            continue
        for raw in data[:end].splitlines():
            rec = _record(raw)
            if rec is None:
                offsets["bad_lines"] = int(offsets.get("bad_lines", 0) or 0) + 1
                continue
            rec["node"] = node  # the file says which node; a record cannot claim another
            lines.append(json.dumps(rec) + "\n")
        offsets[node] = start + end
        changed = True
    if lines:
        with open(system_file, "a") as fh:
            fh.write("".join(lines))
    if changed:
        tmp = offsets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(offsets))
        tmp.replace(offsets_path)
    return len(lines)


def _record(raw: bytes) -> dict[str, Any] | None:
    if len(raw) > MAX_LINE:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("time"), (int, float)):
        return None
    return {k: v for k, v in rec.items() if k in ("time", "node") or (isinstance(v, (int, float)) and not isinstance(v, bool))}
