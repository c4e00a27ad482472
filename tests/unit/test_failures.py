"""Every death by a signal is explained (issue 11 item 3): real faulthandler dumps, parsed.

Fast: each case is a tiny Python process that faults for real (no supervisor, no DeepSpeed);
its stderr is what a rank writes into stdout.log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstui.core import failures
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


# ---- which rank: any number of ranks (issue 20) ----

# Rank 2 of 3 dies by a signal; the others then fail the way gloo makes them (an exception over the
# lost peer, exit 1) as soon as rank 2 is dead, so the starter may find several ranks dead at once.
RANK_DEATH = """\
import os, signal, sys, time
rank, here = int(os.environ["RANK"]), os.path.dirname(os.path.abspath(__file__))
mine = os.path.join(here, f"pid{rank}")
open(mine + ".tmp", "w").write(str(os.getpid()))
os.replace(mine + ".tmp", mine)  # whole or absent: a peer must never read an empty pid
def crash():
    os.kill(os.getpid(), getattr(signal, sys.argv[-1]))
if rank == 2:
    time.sleep(0.5)
    crash()
victim = os.path.join(here, "pid2")
while not os.path.exists(victim):
    time.sleep(0.01)
pid = open(victim).read()
while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split(") ")[1][0] not in "ZX":
    time.sleep(0.01)
raise RuntimeError(f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer (rank {rank})")
"""


@pytest.mark.parametrize(
    ("sig", "expected"),
    [("SIGSEGV", "rank 2: SIGSEGV in "), ("SIGKILL", "rank 2: SIGKILL (killed from outside: the kernel's OOM killer")],
)
def test_the_rank_that_died_is_named_among_three(tmp_path: Path, sig: str, expected: str) -> None:
    script = tmp_path / "r.py"
    script.write_text(RANK_DEATH)
    proc = subprocess.run(
        [sys.executable, "-m", "dstui.execute.injob.ranks", "--nproc", "3", "--master-port", "1", "--", sys.executable, str(script), sig],
        env={**os.environ, "PYTHONFAULTHANDLER": "1"}, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert f"dstui ranks: rank 2 failed ({sig}); stopping the others" in log
    reason = classify(log, proc.returncode)
    assert reason.startswith(expected), (reason, log[-3000:])
    if sig == "SIGSEGV":
        assert reason.endswith("r.py:crash")
    for rank in range(3):  # every rank is gone (stopped and reaped by the starter)
        assert not Path(f"/proc/{(tmp_path / f'pid{rank}').read_text()}").exists()


def test_a_death_by_signal_wins_over_the_exits_it_caused() -> None:
    from dstui.execute.injob.ranks import first_failure

    assert first_failure([(0, 1), (1, 1), (2, -9)]) == (2, -9)  # zombies come back in start order
    assert first_failure([(0, -6), (3, -11)]) == (3, -11)  # gloo's abort is a consequence
    assert first_failure([(1, 1), (2, 1)]) == (1, 1)
    log = "dstui ranks: rank 3 failed (SIGSEGV); stopping the others\ndstui ranks: rank 0 also failed (SIGABRT)\n"
    assert signal_death(log, 139) == "rank 3: SIGSEGV"


def test_deepspeeds_launcher_line_is_not_trusted_for_the_rank_with_several_ranks() -> None:
    """Its 'exits with return code' line prints the last started rank's command whichever rank failed."""
    launcher = (
        "[INFO] [launch.py:164:main] nnodes=1, num_local_procs=3, node_rank=0\n"
        "[ERROR] [launch.py:325:sigkill_handler] ['python', '-u', 'train.py', '--local_rank=2'] exits with return code = -9\n"
    )
    assert signal_death(launcher, 247) == "killed by SIGKILL (killed from outside: the kernel's OOM killer when host memory ran out, or a kill -9)"
    one = launcher.replace("num_local_procs=3", "num_local_procs=1").replace("local_rank=2", "local_rank=0")
    assert signal_death(one, 247).startswith("rank 0: SIGKILL")


# ---- reasons from a program's own last error line, whatever it is called (#27.4, #33.8) ----


def _stderr_of(code: str, *args: str) -> tuple[str, int]:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    return p.stderr, p.returncode


def test_argparse_refusal_of_a_dash_c_program_is_the_reason() -> None:
    tail, code = _stderr_of("import argparse; p = argparse.ArgumentParser(); p.add_argument('--seed', type=int); p.parse_args()", "--seed", "abc")
    assert code == 2
    assert failures.classify(tail, code) == "-c: error: argument --seed: invalid int value: 'abc'"


def test_argparse_refusal_of_a_program_named_by_prog_is_the_reason() -> None:
    tail, code = _stderr_of("import argparse; p = argparse.ArgumentParser(prog='mytrainer'); p.add_argument('--lr', required=True); p.parse_args()")
    assert failures.classify(tail, code) == "mytrainer: error: the following arguments are required: --lr"


def test_the_bundled_runners_refusal_by_its_absolute_path_is_the_reason() -> None:
    tail = ("usage: train.py [-h] [--seed SEED]\n"
            "/home/u/dstui/runners/train.py: error: argument --seed: invalid int value: 'x'\n"
            "dstui ranks: rank 0 failed (exit code 2); stopping the others\n")  # fmt: skip
    assert failures.classify(tail, 2) == "train.py: error: argument --seed: invalid int value: 'x'"


def test_an_error_line_without_usage_or_py_name_is_the_reason_only_as_the_last_words() -> None:
    # somewhere in the output (a compiler the program ran, say), not the program's own refusal
    assert failures.classify("gcc: error: unrecognized option\nbuilding without it\n", 1) == "exit code 1"
    # the last line before the exit: the program's own words, e.g. sys.exit("mytrainer: error: ...")
    tail, code = _stderr_of("import sys; print('Epoch 1, Step 1, Loss: 2.0'); sys.exit('mytrainer: error: the data ran out')")
    assert code == 1
    assert failures.classify(tail, code) == "mytrainer: error: the data ran out"


def test_exception_lines_are_the_reason_kept_whole() -> None:
    long_msg = "shape mismatch " + "x" * 600 + " (see the docs)"
    assert failures.classify(f"[rank1]: RuntimeError: {long_msg}\n", 1) == f"Python: RuntimeError: {long_msg}"
    tb = "Traceback (most recent call last):\n  File \"t.py\", line 1\nmymod.ConfigError: no such model 'x'\n"
    assert failures.classify(tb, 1) == "Python: mymod.ConfigError: no such model 'x'"


def test_cuda_and_nccl_errors_are_named_with_their_own_line() -> None:
    cuda = "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
    assert failures.classify(cuda, 1) == "CUDA error: RuntimeError: CUDA error: an illegal memory access was encountered"
    nccl = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5\n"
    assert failures.classify(nccl, 1) == "NCCL error: " + nccl.strip()
