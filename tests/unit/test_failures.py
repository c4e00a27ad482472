"""Every death by a signal is explained (issue 11 item 3): real faulthandler dumps, parsed.

Fast: each case is a tiny Python process that faults for real (no supervisor, no DeepSpeed);
its stderr is what a rank writes into stdout.log.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from dstui.core.failures import classify, signal_death

FAULTS = {
    "SIGSEGV": "import os, signal\ndef crash():\n    os.kill(os.getpid(), signal.SIGSEGV)\ncrash()\n",
    "SIGABRT": "import os\ndef crash():\n    os.abort()\ncrash()\n",
    "SIGBUS": "import os, signal\ndef crash():\n    os.kill(os.getpid(), signal.SIGBUS)\ncrash()\n",
    "SIGSEGV-ctypes": "import ctypes\ndef crash():\n    ctypes.string_at(0)\ncrash()\n",
}


def _fault(code: str) -> tuple[str, int]:
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=60)
    return proc.stderr, proc.returncode


@pytest.mark.parametrize("case", sorted(FAULTS))
def test_real_fault_names_signal_and_innermost_frame(case: str) -> None:
    log, code = _fault(FAULTS[case])
    expected = case.split("-")[0]
    frame = "ctypes/__init__.py:string_at" if "ctypes" in case else "<string>:crash"  # the innermost frame
    assert code < 0
    assert classify(log, code) == f"{expected} in {frame}"


def test_launcher_line_names_the_rank_and_the_exit_code_245_is_a_segfault() -> None:
    log, _ = _fault(FAULTS["SIGSEGV"])
    log = log.replace('File "<string>"', 'File "/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py"')
    log = log.replace(" in crash", " in _initialize_deepcompile_native")
    launcher = (
        "[2026-11-23 10:00:00,000] [ERROR] [launch.py:325:sigkill_handler] "
        "['/usr/bin/python3', '-u', 'runners/train.py', '--local_rank=1', '--steps', '20'] exits with return code = -11\n"
    )
    gloo = "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer\nTraceback\n"
    reason = classify(log + gloo + launcher, 245)
    assert reason == "rank 1: SIGSEGV in deepspeed/runtime/engine.py:_initialize_deepcompile_native"


def test_sigkill_without_a_dump_says_who_may_have_sent_it() -> None:
    launcher = "['python', '--local_rank=0'] exits with return code = -9\n"
    assert signal_death(launcher, 247).startswith("rank 0: SIGKILL (killed from outside: the kernel's OOM killer")
    assert classify("", -9) == "killed by SIGKILL (killed from outside: the kernel's OOM killer when host memory ran out, or a kill -9)"


def test_no_signal_no_signal_reason() -> None:
    assert signal_death("plain output\n", 1) is None
    assert signal_death("", 0) is None
    assert classify("OSError: [Errno 28] No space left on device\n", 1) == "disk full (No space left on device)"
