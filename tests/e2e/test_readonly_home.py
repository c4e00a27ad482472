"""Issue 40.6: a read-only or full runs home is one line and exit 2 for every command, and nothing is written.

A home with a finished batch and its MLflow store is mounted read-only on itself (a bind
mount in a user namespace, `unshare -rm`: a real read-only file system, which root cannot
write either), then copied onto a tmpfs that is filled to its last byte. Every command that
writes the home (run, report, import, cancel, retry, compare, bisect, ui --start,
supervise, the TUI) answers with the same one line and exit 2, `--json` with that line as
its error document; no traceback; the home's files are the same before and after (on the
full disk not even an empty lock file appears). The commands that only print (list,
run --dry-run, ui) still work. `status` shows the batch first (on a full disk a person needs
to see the runs: tests/e2e/test_reliability.py), then says the same line, exit 2; its
`--json` document holds the batch and the error. A home not made yet under a read-only
folder is one line too.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import dstui

from dstui.core.rundir import list_batches
from dstui.execute.batch_lock import is_supervised

UNSHARE = shutil.which("unshare")


def _namespaces_work() -> bool:
    if not UNSHARE:
        return False
    probe = subprocess.run([UNSHARE, "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt && umount /mnt"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="needs unshare -rm with mount (user and mount namespaces)")


def in_namespace(setup: str, commands: list[list[str]], env: dict[str, str], out: Path, after: str = "") -> list[dict]:
    """Run ``setup`` (shell, as root of a new mount namespace), each dstui command, then ``after``; their rc/stdout/stderr."""
    lines = [setup]
    for i, args in enumerate(commands):
        argv = shlex.join([sys.executable, "-m", "dstui", *args])
        lines.append(f"rc=0; {argv} > {out}/{i}.out 2> {out}/{i}.err < /dev/null || rc=$?; echo $rc > {out}/{i}.rc")
    lines.append(after)
    proc = subprocess.run([UNSHARE, "-rm", "sh", "-ec", "\n".join(lines)], capture_output=True, text=True, timeout=900,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [{"args": args, "rc": int((out / f"{i}.rc").read_text()), "stdout": (out / f"{i}.out").read_text(),
             "stderr": (out / f"{i}.err").read_text()} for i, args in enumerate(commands)]  # fmt: skip


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("ro-home")
    home = root / "home"
    spec = root / "quick.yaml"
    program = "from dstui.core.records import seed_line\nfor s in (1, 2): print(seed_line(1, s, 1.0 / s, 0.01, 1, 2))\n"
    spec.write_text(yaml.safe_dump({"name": "quick", "settings": {"kind": "command", "steps": 2, "warmup_steps": 0,
                                    "metrics_format": "seed", "command": [sys.executable, "-c", program]}}))  # fmt: skip
    logs = root / "logs"
    logs.mkdir()
    (logs / "a.log").write_text("Epoch 1, Step 1, Loss: 2.0 sync: True time: 0.1\n")
    env = {"DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": "", "DSTUI_PRIVATE_DIR": str(root / "private")}
    assert dstui("run", str(spec), env=env, timeout=300).returncode == 0
    (b,) = list_batches(home / "runs")
    # its supervisor finishes with the store (its last checkpoint of the WAL) before the home is looked at
    supervisors = [p for p in psutil.process_iter(["cmdline"]) if str(b.path) in (p.info["cmdline"] or [])]
    psutil.wait_procs(supervisors, timeout=120)
    assert not is_supervised(b)
    commands = [
        ["run", str(spec)], ["report", "-e", "quick", "-o", str(root / "report")],
        ["import", str(logs), "--experiment", "imported"], ["cancel", b.id], ["retry", f"{b.id}/base-r0", "--force"],
        ["compare", "--experiment", "quick", "--baseline", "installed"], ["ui", "--start", "--port", "5099"],
        ["bisect", str(spec), "--condition", "base", "--good", "0.1.0", "--bad", "0.2.0", "--metric", "loss"],
        ["supervise", str(b.path)], ["tui"],
    ]  # fmt: skip
    printing = [["list", str(spec)], ["run", "--dry-run", str(spec)], ["ui"]]
    showing = [["status"], ["status", "--json"]]  # the batch as it is, then the same line
    return {"root": root, "home": home, "spec": spec, "env": {**env, "PATH": "/usr/bin:/bin"}, "commands": commands,
            "printing": printing, "showing": showing, "batch": b.id}  # fmt: skip


def _one_line_each(results: list[dict], what: str) -> None:
    for r in results:
        assert r["rc"] == 2, r
        lines = r["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dstui: error: the runs home ") and what in lines[0], r
        assert "Traceback" not in r["stdout"] + r["stderr"]
        if "--json" in r["args"]:
            assert json.loads(r["stdout"]) == {"error": lines[0].removeprefix("dstui: error: "), "exit_code": 2}


def _shown_then_one_line(results: list[dict], what: str, batch: str) -> None:
    """`status`: the batch shown (text, or the JSON document with the error in it), then the one line, exit 2."""
    _one_line_each([{**r, "args": []} for r in results], what)  # the line and the exit status; no traceback
    for r in results:
        line = r["stderr"].strip().removeprefix("dstui: error: ")
        if "--json" in r["args"]:
            doc = json.loads(r["stdout"])
            assert [b["batch"] for b in doc["batches"]] == [batch] and doc["batches"][0]["counts"] == {"done": 1}, doc
            assert (doc["error"], doc["exit_code"]) == (line, 2), doc
        else:
            assert batch in r["stdout"] and "base-r0" in r["stdout"] and "done" in r["stdout"], r


def test_a_read_only_home_is_one_line_exit_2_for_every_command(prepared: dict, tmp_path: Path) -> None:
    home = prepared["home"]
    before = tree(home)
    setup = f"mount --bind -o ro {shlex.quote(str(home))} {shlex.quote(str(home))}"
    n, m = len(prepared["commands"]), len(prepared["printing"])
    results = in_namespace(setup, prepared["commands"] + prepared["printing"] + prepared["showing"], prepared["env"], tmp_path)
    _one_line_each(results[:n], "is on a read-only file system")
    assert [r["rc"] for r in results[n : n + m]] == [0, 0, 0], results[n : n + m]
    _shown_then_one_line(results[n + m :], "is on a read-only file system", prepared["batch"])
    assert tree(home) == before


def test_a_home_not_made_yet_under_a_read_only_folder_is_one_line(prepared: dict, tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    env = {**prepared["env"], "DSTUI_HOME": str(parent / "dstui")}
    setup = f"mount --bind -o ro {shlex.quote(str(parent))} {shlex.quote(str(parent))}"
    (out := tmp_path / "out").mkdir()
    results = in_namespace(setup, [["status"], ["run", str(prepared["spec"])]], env, out)
    _one_line_each(results, "is on a read-only file system")
    assert list(parent.iterdir()) == [out] or list(parent.iterdir()) == []


def test_a_full_home_is_one_line_exit_2_and_nothing_is_written(prepared: dict, tmp_path: Path) -> None:
    home = shlex.quote(str(prepared["home"]))
    copy = tmp_path / "copy"
    shutil.copytree(prepared["home"], copy)
    listing = tmp_path / "listing"
    setup = "\n".join([
        f"mount -t tmpfs -o size=16m tmpfs {home}",
        f"cp -a {shlex.quote(str(copy))}/. {home}/",
        f"dd if=/dev/zero of={home}/filler bs=64k 2>/dev/null || true",  # to the last byte
        f"dd if=/dev/zero of={home}/filler2 bs=1 2>/dev/null || true",
        f"(cd {home} && find . -printf '%p %s %T@\\n' | sort) > {listing}.before",
    ])  # fmt: skip
    (out := tmp_path / "out").mkdir()
    after = f"(cd {home} && find . -printf '%p %s %T@\\n' | sort) > {listing}.after"
    results = in_namespace(setup, prepared["commands"] + prepared["showing"], prepared["env"], out, after)
    _one_line_each(results[: len(prepared["commands"])], "is full")
    _shown_then_one_line(results[len(prepared["commands"]) :], "is full", prepared["batch"])
    before = Path(f"{listing}.before").read_text()
    assert "./filler" in before and Path(f"{listing}.after").read_text() == before
