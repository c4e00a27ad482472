"""Per-node system readings of a Slurm job: node files merged into system.jsonl once, bad lines counted.

The sampler itself runs inside real jobs in tests/e2e/test_slurm_nodes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.execute.backends.slurm_nodes import OFFSETS_FILE, merge
from dstui.execute.injob.node_sampler import NODES_DIR, node_label


def _write(run: Path, node: str, data: bytes) -> None:
    (run / NODES_DIR).mkdir(exist_ok=True)
    with open(run / NODES_DIR / f"{node}.jsonl", "ab") as fh:
        fh.write(data)


def _system(run: Path) -> list[dict]:
    f = run / "system.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def test_each_complete_line_once_labelled_by_its_file(tmp_path: Path) -> None:
    rec = {"time": 1.0, "node": "elsewhere", "cpu_percent": 50.0, "mem_used_bytes": 10}
    _write(tmp_path, "node1", (json.dumps(rec) + "\n").encode())
    _write(tmp_path, "node2", (json.dumps({**rec, "time": 2.0}) + "\n").encode() + b'{"time": 3.0, "cpu_')
    assert merge(tmp_path, tmp_path / "system.jsonl") == 2
    assert merge(tmp_path, tmp_path / "system.jsonl") == 0  # nothing new: nothing copied again
    _write(tmp_path, "node2", b'percent": 7}\n')  # the half-written line, finished
    assert merge(tmp_path, tmp_path / "system.jsonl") == 1
    got = _system(tmp_path)
    assert [(r["node"], r["time"]) for r in got] == [("node1", 1.0), ("node2", 2.0), ("node2", 3.0)]
    assert got[2]["cpu_percent"] == 7


def test_bad_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    _write(tmp_path, "n", b'not json\n["a list"]\n{"no_time": 1}\n' + b"x" * 70_000 + b'\n{"time": 1, "cpu_percent": 1, "label": "<b>"}\n')
    assert merge(tmp_path, tmp_path / "system.jsonl") == 1
    assert _system(tmp_path) == [{"time": 1, "node": "n", "cpu_percent": 1}]  # strings other than node dropped
    assert json.loads((tmp_path / NODES_DIR / OFFSETS_FILE).read_text())["bad_lines"] == 4


def test_node_label_is_a_safe_key() -> None:
    assert node_label("node1") == "node1"
    assert node_label("a/b c") == "a_b_c"
    assert node_label("") == "node"
    assert len(node_label("x" * 500)) == 64


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.binary(max_size=200), max_size=8))
def test_any_bytes_never_raise_and_copy_only_objects(tmp_path_factory, chunks: list[bytes]) -> None:
    run = tmp_path_factory.mktemp("run")
    for c in chunks:
        _write(run, "n1", c)
        merge(run, run / "system.jsonl")
    for rec in _system(run):
        assert rec["node"] == "n1" and isinstance(rec["time"], (int, float))
