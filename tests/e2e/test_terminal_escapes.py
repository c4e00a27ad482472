"""Issue 40.4 through the real CLI: a run's escape sequences never reach the user's terminal.

A `kind: command` run prints OSC (title, clipboard), CSI (clear, colours), a C1 CSI and BEL,
and dies of an exception whose message holds them too; its command line holds one as well.
Every byte `dstui run` (progress lines, the "! FAILED" note, the final table and reasons),
`dstui run --dry-run`, `dstui status -v` and `dstui list --commands` print is free of them,
the text around them is there; `--json` keeps the reason as the run wrote it, escaped the
way JSON escapes control characters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from helpers import dstui

PROGRAM = """
import sys
print("\\x1b]0;PWNED\\x07\\x1b[2J\\x1b]52;c;cm0gLXJmIH4=\\x07hello", flush=True)
raise RuntimeError("boom \\x1b]0;TITLE\\x07 \\x1b[31mred\\x1b[0m \\x9b2J\\x07end")
"""
CONTROLS = ("\x1b", "\x07", "\x9b")
INSIDE = ("PWNED", "TITLE", "cm0gLXJmIH4=")  # what the sequences carried: gone with them (the program's source holds them as text)


def test_a_reason_with_osc_and_csi_reaches_no_terminal(tmp_path: Path) -> None:
    spec = tmp_path / "esc.yaml"
    spec.write_text(yaml.safe_dump({"name": "esc", "settings": {
        "kind": "command", "steps": 2, "warmup_steps": 0, "metrics_format": "seed",
        "command": [sys.executable, "-c", PROGRAM, "\x1b]0;ARGV-TITLE\x07arg"]}}))  # fmt: skip
    env = {"DSTUI_HOME": str(tmp_path / "home"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    run = dstui("run", str(spec), env=env, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    printed = [run, dstui("run", "--dry-run", str(spec), env=env, timeout=300), dstui("status", "-v", env=env, timeout=120),
               dstui("list", str(spec), "--commands", env=env, timeout=300)]  # fmt: skip
    for i, proc in enumerate(printed):
        out = proc.stdout + proc.stderr
        assert [s for s in (*CONTROLS, *(INSIDE if i in (0, 2) else ())) if s in out] == [], (proc.args, out)
    assert "! FAILED base-r0: Python: RuntimeError: boom  red end" in run.stdout, run.stdout
    assert "base-r0: Python: RuntimeError: boom  red end" in printed[2].stdout
    assert "'arg'" in printed[1].stdout and "ARGV-TITLE" not in printed[1].stdout  # the argument, its OSC gone whole
    doc = json.loads(dstui("status", "--json", env=env, timeout=120).stdout)
    (got,) = [r["reason"] for b in doc["batches"] for r in b["runs"]]
    assert got == "Python: RuntimeError: boom \x1b]0;TITLE\x07 \x1b[31mred\x1b[0m \x9b2J\x07end"  # as the run said it
