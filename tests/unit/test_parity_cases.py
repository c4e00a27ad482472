"""``compare_loss.py --cases`` (runners/parity_cases.py) without a process group: the file, the environment,
the output and the exit files. The bits a shared launch gives are held to a launch of its own's in
tests/unit/test_compare_loss.py::test_a_case_run_beside_others_gives_the_bits_it_gives_alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runners"))

import parity_cases  # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20)  # fmt: skip


def _case(tmp: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> dict:
    return {"argv": argv, "env": env or {}, "log": str(tmp / f"{name}.log"), "exit_file": str(tmp / f"{name}.exit")}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON | st.lists(st.fixed_dictionaries({"argv": JSON, "log": JSON, "exit_file": JSON}), max_size=3))
def test_any_json_is_a_list_of_cases_or_one_line_refusal(tmp_path: Path, value: object) -> None:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(value))
    try:
        cases = parity_cases.load(str(path))
    except SystemExit as e:
        assert isinstance(e.code, str) and e.code.startswith("compare_loss.py: error: --cases ") and "\n" not in e.code
        return
    assert isinstance(value, list) and len(cases) == len(value) >= 1
    assert all(isinstance(a, str) for c in cases for a in c.argv)


def test_unreadable_oversized_and_empty_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps([_case(tmp_path, "a", ["x" * 100])] * 20000))
    for path, why in ((tmp_path / "missing.json", "No such file"), (big, "over"), (tmp_path / "empty.json", "list")):
        if path.name == "empty.json":
            path.write_text("[]")
        with pytest.raises(SystemExit, match=why):
            parity_cases.load(str(path))


def test_one_pipeline_topology_per_launch() -> None:
    parity_cases.refuse_mixed_topologies([2, 2])
    with pytest.raises(SystemExit, match=r"mixes --pipeline-stages \[1, 2\]"):
        parity_cases.refuse_mixed_topologies([1, 2, 1])


# run_all in a process of its own: pytest's capture replaces sys.stdout with objects that bypass fd 1
CHILD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import parity_cases
tmp, mode = sys.argv[2], sys.argv[3]
seen, barriers = [], []

def run_one(argv):
    seen.append((os.environ.get("DSTUI_PARITY_INJECT"), os.environ.get("ONLY_IN_B")))
    print("stdout of", argv[0], flush=True)
    os.write(2, f"fd 2 of {argv[0]}\\n".encode())  # what a C++ side or a logger writes
    if argv[0] == "b" and mode != "ok":
        raise ValueError("boom") if mode == "raise" else SystemExit("compare_loss.py: error: bad value")
    return int(argv[1])

def on_error(code):
    print("launch ends", code, flush=True)
    os._exit(code)

cases = parity_cases.load(os.path.join(tmp, "cases.json"))
parity_cases.run_all(cases, run_one, rank=lambda: 0, barrier=lambda: barriers.append(1),
                     cleared=("DSTUI_PARITY_INJECT",), on_error=on_error)
print(json.dumps({"seen": seen, "barriers": len(barriers), "env": os.environ.get("DSTUI_PARITY_INJECT"),
                  "only_in_b": os.environ.get("ONLY_IN_B")}))
"""


def _run_all(tmp: Path, mode: str) -> subprocess.CompletedProcess[str]:
    cases = [_case(tmp, "a", ["a", "0"]),
             _case(tmp, "b", ["b", "1"], {"DSTUI_PARITY_INJECT": "drop_bucket:step=2", "ONLY_IN_B": "1"}),
             _case(tmp, "c", ["c", "0"])]  # fmt: skip
    (tmp / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "DSTUI_PARITY_INJECT": "launch-wide"}
    env.pop("ONLY_IN_B", None)
    return subprocess.run([sys.executable, "-c", CHILD, str(REPO / "runners"), str(tmp), mode], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_each_case_gets_its_env_output_and_exit_code_and_the_launch_gets_its_own_back(tmp_path: Path) -> None:
    proc = _run_all(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["seen"] == [[None, None], ["drop_bucket:step=2", "1"], [None, None]]
    assert got["env"] == "launch-wide" and got["only_in_b"] is None and got["barriers"] == 3
    assert [(tmp_path / f"{n}.exit").read_text() for n in "abc"] == ["0\n", "1\n", "0\n"]
    for n in "abc":
        assert (tmp_path / f"{n}.log").read_text() == f"stdout of {n}\nfd 2 of {n}\n"
    assert "stdout of" not in proc.stdout + proc.stderr  # the launch's own streams got none of it


@pytest.mark.parametrize(("mode", "reason"), [("raise", "ValueError: boom"), ("refuse", "compare_loss.py: error: bad value")])
def test_an_error_writes_exit_2_and_its_reason_then_ends_the_launch(tmp_path: Path, mode: str, reason: str) -> None:
    proc = _run_all(tmp_path, mode)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (tmp_path / "a.exit").read_text() == "0\n" and (tmp_path / "b.exit").read_text() == "2\n"
    assert not (tmp_path / "c.exit").exists() and not (tmp_path / "c.log").exists()
    log = (tmp_path / "b.log").read_text()
    assert reason in log and log.rstrip().endswith("launch ends 2")  # the case's reason is in its own log
