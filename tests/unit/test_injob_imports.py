"""The in-job programs stay small: they start once per job, rank or node, often on a node without dstui's extras.

Each program of dstui/execute/injob is imported in a fresh interpreter together with every dstui
module it imports anywhere (inside functions too, as it may when it runs): what gets loaded must be
the standard library and dstui's core helpers, never a third-party package (pydantic, MLflow, psutil
...) or the supervisor's modules. ``node_sampler`` reads psutil/NVML through ``execute.sysmetrics``
by design, so only its import itself is held to the rule.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from helpers import REPO

INJOB = REPO / "dstui" / "execute" / "injob"
PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps({"third_party": sorted({n.split(".")[0] for n in sys.modules} - set(sys.stdlib_module_names)),
                  "dstui": sorted(n for n in sys.modules if n.startswith("dstui"))}))
"""
# what a program may bring along of dstui: file names, names, paths, the trace, masking, the bytecode prefix
ALLOWED_DSTUI = ("dstui.core", "dstui.execute.bytecode", "dstui.execute.injob")


def dstui_imports(path) -> list[str]:
    """Every dstui module the file imports, at module level or inside a function."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dstui"):
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("dstui")]
    return out


@pytest.mark.parametrize("program", ["wrap", "ranks", "slurm_rank", "node_sampler"])
def test_an_in_job_program_loads_only_the_standard_library_and_dstui_core(program: str) -> None:
    path = INJOB / f"{program}.py"
    wanted = [f"dstui.execute.injob.{program}"]
    if program != "node_sampler":
        wanted += dstui_imports(path)
    out = subprocess.run([sys.executable, "-c", PROBE, *wanted], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert [m for m in loaded["third_party"] if not m.startswith("_") and m != "dstui"] == []
    assert [m for m in loaded["dstui"] if m not in ("dstui", "dstui.execute") and not m.startswith(ALLOWED_DSTUI)] == []
