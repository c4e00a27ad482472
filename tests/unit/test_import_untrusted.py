"""`dstui import` on untrusted input: unreadable files, interrupted imports, restarted logs,
nan losses and run-folder numbering. Real files, a real SQLite MLflow store, the real CLI.

Permissions are real: as root (CI containers) a mode-000 file is still readable, so the
CLI runs in a subprocess under ``setpriv`` without the capabilities that override file
modes; in-process, a file whose read really fails is a link to a write-only sysctl
(EACCES even for root) or to ``/proc/self/mem`` (EIO at offset 0).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import HEAVY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.importer import reading
from dstui.importer.parse import parse_log
from dstui.importer.seedlogs import ImportError_, ImportInterrupted, import_dir

ROOT = Path(__file__).resolve().parents[2]
SETPRIV = shutil.which("setpriv")
WRITE_ONLY = Path("/proc/sys/vm/compact_memory")  # mode 0200: open for reading is EACCES, root or not


def line(step: int, loss: Any = 2.5, t: Any = 0.1, mem: bool = True) -> str:
    tail = " alloc_mem: 100 peak_mem: 200" if mem else ""
    return f"Epoch 1, Step {step}, Loss: {loss} sync: True time: {t}{tail}"


def good_log(path: Path, n: int = 5) -> None:
    path.write_text("\n".join(line(s, 1.0 + 1 / s) for s in range(1, n + 1)) + "\n")


def client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(uri)


def unprivileged() -> list[str]:
    """The command prefix under which file modes apply (nothing when not root)."""
    if os.geteuid() != 0:
        return []
    if not SETPRIV:
        pytest.skip("root without setpriv: mode 000 cannot be made to apply")
    return [SETPRIV, "--bounding-set", "-dac_override,-dac_read_search", "--"]


def cli(args: list[str], env_uri: str, tmp_path: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": env_uri, "DSTUI_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    return subprocess.run([*unprivileged(), sys.executable, "-m", "dstui", "import", *args],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path, **kw)  # fmt: skip


def unreadable_link(path: Path, target: Path) -> None:
    if not target.exists():
        pytest.skip(f"{target} is not here")
    path.symlink_to(target)


# ---- 1. unreadable input --------------------------------------------------------------------


@pytest.mark.e2e  # the CLI in a subprocess: the fast loop leaves it to the full suite
def test_cli_skips_mode_000_files_and_folders_and_imports_the_rest(uri: str, tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    good_log(root / "a.log")
    good_log(root / "b.log", 7)
    good_log(root / "locked.log")
    sub = root / "sub"
    sub.mkdir()
    good_log(sub / "c.log")
    (root / "locked.log").chmod(0)
    sub.chmod(0)
    try:
        done = cli([str(root), "-e", "perm"], uri, tmp_path)
    finally:
        sub.chmod(stat.S_IRWXU)
    assert "Traceback" not in done.stderr + done.stdout
    assert done.returncode == 0, done.stderr
    assert "imported 2 run(s), 12 steps" in done.stdout
    assert "skipped locked.log: permission denied" in done.stdout
    assert "skipped sub: permission denied" in done.stdout


@pytest.mark.e2e  # the CLI in a subprocess: the fast loop leaves it to the full suite
def test_cli_with_nothing_readable_says_so_in_one_line_exit_2(uri: str, tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    good_log(root / "locked.log")
    (root / "locked.log").chmod(0)
    locked_dir = tmp_path / "closed"
    locked_dir.mkdir()
    locked_dir.chmod(0)
    try:
        for target in (root, locked_dir, root / "locked.log"):
            done = cli([str(target), "-e", "perm"], uri, tmp_path)
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1 and "permission denied" in done.stderr, done.stderr
    finally:
        locked_dir.chmod(stat.S_IRWXU)


def test_open_and_read_errors_skip_the_file_with_why(uri: str, tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    good_log(root / "a.log")
    unreadable_link(root / "denied.log", WRITE_ONLY)  # PermissionError from open()
    unreadable_link(root / "eio.log", Path("/proc/self/mem"))  # OSError(EIO) from the first read
    result = import_dir(root, "perm")
    assert [r.source for r in result.runs] == ["a.log"]
    assert ("denied.log", "permission denied") in result.skipped
    assert ("eio.log", "input/output error") in result.skipped
    assert result.unreadable == 2
    text = result.summary_text()
    assert "skipped denied.log: permission denied" in text and "skipped eio.log: input/output error" in text

    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    unreadable_link(only_bad / "denied.log", WRITE_ONLY)
    with pytest.raises(ImportError_, match="nothing readable.*permission denied"):
        import_dir(only_bad, "perm")
    assert not client(uri).search_runs([client(uri).get_experiment_by_name("perm").experiment_id],
                                       filter_string="tags.`dstui.imported_from` LIKE '%bad%'")  # fmt: skip


# ---- 2. interrupted imports -----------------------------------------------------------------


def big_log(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for s in range(1, n + 1):
            fh.write(line(s, 2.0 + 1 / s) + "\n")


@HEAVY
def test_interrupted_import_is_marked_partial_and_rerun_replaces_it(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "big"
    root.mkdir()
    big_log(root / "train.log", 6000)
    monkeypatch.setattr(reading, "PROGRESS_EVERY_S", 0.0)  # a progress line every 2000 lines

    def ctrl_c(text: str) -> None:
        if "sending" in text:
            raise KeyboardInterrupt

    with pytest.raises(ImportInterrupted, match="run the same `dstui import .*` again"):
        import_dir(root, "big", progress=ctrl_c)
    c = client(uri)
    exp = c.get_experiment_by_name("big").experiment_id
    (child,) = c.search_runs([exp], filter_string="tags.`dstui.role` = 'run'")
    (parent,) = c.search_runs([exp], filter_string="tags.`dstui.role` = 'batch'")
    points = len(c.get_metric_history(child.info.run_id, "loss"))
    assert 0 < points < 6000
    assert child.info.status == "KILLED" and child.data.tags["dstui.status"] == "killed"
    assert child.data.tags["dstui.reason"] == "import interrupted"
    assert child.data.params["steps"] == str(points) == child.data.tags["dstui.imported_steps"]
    assert parent.info.status == "KILLED" and parent.data.tags["dstui.reason"] == "import interrupted"

    from dstui.analysis.rundata import run_from_mlflow

    assert run_from_mlflow(child).status == "killed"  # what `dstui report` shows

    again = import_dir(root, "big")  # no --force
    assert again.batch == parent.data.tags["dstui.batch"]
    assert "interrupted import" in again.summary_text() and parent.info.run_id in again.replaced
    assert c.get_run(parent.info.run_id).info.lifecycle_stage == "deleted"
    run = c.get_run(again.runs[0].run_id)
    assert run.data.params["steps"] == "6000" and run.data.tags["dstui.status"] == "done"
    assert len(c.get_metric_history(run.info.run_id, "loss")) == 6000
    with pytest.raises(ImportError_, match="already imported"):
        import_dir(root, "big")  # a finished import is still protected


@pytest.mark.e2e  # the CLI in a subprocess: the fast loop leaves it to the full suite
def test_sigint_to_the_cli_says_what_to_run(uri: str, tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    big_log(root / "train.log", 20000)
    # The import holds after its first 'sending' line until the test's SIGINT comes (at most 120 s):
    # unheld, under load 10-16 it sent all 20,000 lines before the signal arrived and exited 0.
    # SIGINT is set to Python's handler first, as in a terminal's foreground job: a suite started in the
    # background of a shell without job control (`pytest ... &`) has SIGINT ignored, children inherit
    # that, and Python then leaves it ignored (the ctrl+c never arrived; the test hung until its timeout)
    code = textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import dstui.importer.reading as s
        s.PROGRESS_EVERY_S = 0.0
        said = s.Progress.pass_of
        def pass_of(self, what):
            report = said(self, what)
            def held(done, lines):
                report(done, lines)
                if what == "sending":
                    time.sleep(120)  # mid-import: where a person's ctrl+c comes
            return held
        s.Progress.pass_of = pass_of
        from dstui.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "DSTUI_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, "import", str(root), "-e", "sig"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.stderr is not None
    deadline = time.monotonic() + 240
    for text in proc.stderr:
        if "sending" in text or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    # quiet: it ends in ~1 s; under a suite at load 10+ once not within 120 s (its runs' ends go
    # through the store's retries): a bound for a hang, not a measure of the ctrl+c's speed
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "import interrupted" in err and "no --force needed" in err
    c = client(uri)
    (child,) = c.search_runs([c.get_experiment_by_name("sig").experiment_id], filter_string="tags.`dstui.role` = 'run'")
    assert child.data.tags["dstui.status"] == "killed" and int(child.data.params["steps"]) < 20000


# ---- 3. steps going backwards, repeated steps -----------------------------------------------


def test_restarted_log_keeps_the_first_attempt_and_counts_repeats(uri: str, tmp_path: Path) -> None:
    f = tmp_path / "restarted.log"
    first = [line(s, 10 + s) for s in range(1, 6)]
    second = [line(s, 20 + s) for s in range(1, 9)]
    truncated = "Epoch 1, Step 8, Loss: 2.1 sync: True time: 0.1"  # the same step, cut short
    f.write_text("\n".join([*first, *second, truncated]) + "\n")
    result = import_dir(f, "restart")
    (run,) = result.runs
    assert run.steps == 8 and run.repeated == 6 and run.restarts == 1
    hist = [(m.step, m.value) for m in client(uri).get_metric_history(run.run_id, "loss")]
    assert sorted(hist) == [(s, 10 + s) for s in range(1, 6)] + [(s, 20 + s) for s in (6, 7, 8)]
    tags = client(uri).get_run(run.run_id).data.tags
    assert tags["dstui.repeated_steps"] == "6" and "first attempt" in tags["dstui.note"]
    assert "6 repeated step line(s) left out" in result.summary_text()
    assert result.malformed_lines == 0


def first_wins(steps: list[int]) -> tuple[list[int], int]:
    """The rule, written plainly: (steps kept, in order; step lines left out)."""
    kept: list[int] = []
    floor = top = last = None
    for s in steps:
        if last is not None and s == last:
            continue
        if last is not None and s < last:
            floor = top
        last = s
        if floor is not None and s <= floor:
            continue
        kept.append(s)
        top = s if top is None else max(top, s)
    return kept, len(steps) - len(kept)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.integers(0, 30), max_size=40))
def test_any_step_order_keeps_each_step_once_first_attempt_wins(tmp_path: Path, steps: list[int]) -> None:
    f = tmp_path / "x.log"
    f.write_text("".join(line(s, s / 10) + "\n" for s in steps))
    seen: list[int] = []
    parsed = parse_log(f, keep_steps=False, on_step=lambda i, rec: seen.append(rec["step"]))
    kept, left_out = first_wins(steps)
    assert seen == kept and parsed.repeated == left_out
    assert len(set(seen)) == len(seen)  # never a step twice: MLflow cannot replace a value


# ---- 4. nan / inf losses --------------------------------------------------------------------


def test_nan_losses_are_imported_without_the_loss_and_the_run_is_not_done(uri: str, tmp_path: Path) -> None:
    f = tmp_path / "diverged.log"
    f.write_text(line(1, "nan", 0.5) + "\n" + line(2, "inf", 0.6) + "\n")
    result = import_dir(f, "nan")
    (run,) = result.runs
    assert result.malformed_lines == 0 and result.partial_lines == 2 and run.steps == 2
    assert run.status == "failed" and "no usable loss" in run.reason
    mlrun = client(uri).get_run(run.run_id)
    assert mlrun.info.status == "FAILED" and mlrun.data.tags["dstui.status"] == "failed"
    assert "no usable loss" in mlrun.data.tags["dstui.reason"]
    assert "loss" not in mlrun.data.metrics and mlrun.data.metrics["iter_time"] == 0.6
    text = result.summary_text()
    assert "1 with no usable loss" in text.splitlines()[0]
    assert "0 malformed line(s)" in text and "2 step line(s) imported without a nan/inf value" in text


values = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(["nan", "inf", "-inf", "1e999", "abc"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(1, 10**6), values, values, st.booleans()), max_size=30))
def test_every_step_line_is_imported_or_counted_never_both(tmp_path: Path, rows: list[tuple]) -> None:
    f = tmp_path / "x.log"
    f.write_text("".join(line(s, loss, t, mem) + "\n" for s, loss, t, mem in rows))
    recs: list[dict[str, Any]] = []
    parsed = parse_log(f, keep_steps=False, on_step=lambda i, rec: recs.append(rec))
    assert len(recs) + parsed.malformed + parsed.repeated == len(rows)
    assert parsed.partial <= len(recs)
    assert all(math.isfinite(v) for r in recs for k, v in r.items() if k not in ("type", "step", "epoch"))
    assert sum(s.no_loss for s in parsed.segments) == sum("loss" not in r for r in recs)


# ---- 5. logs_<rev>_runN ---------------------------------------------------------------------


def test_run_folders_give_non_negative_repeats_numbered_per_revision(uri: str, tmp_path: Path) -> None:
    root = tmp_path / "revision_comparison"
    for rev, ns in (("main", (0, 1, 2)), ("v0.12.0", (1, 2, 3))):  # the seed's compare_revisions.sh: run1..
        for n in ns:
            (root / f"logs_{rev}_run{n}").mkdir(parents=True)
            good_log(root / f"logs_{rev}_run{n}" / "debug_n0_M_deepspeed_np2z3c0dc0E0b1seq512g1a1pALL.log", 3 + n)
    result = import_dir(root, "revs")
    got = sorted((r.revision, r.repeat, r.source.split("/")[0]) for r in result.runs)
    assert got == [("main", 0, "logs_main_run0"), ("main", 1, "logs_main_run1"), ("main", 2, "logs_main_run2"),
                   ("v0.12.0", 0, "logs_v0.12.0_run1"), ("v0.12.0", 1, "logs_v0.12.0_run2"),
                   ("v0.12.0", 2, "logs_v0.12.0_run3")]  # fmt: skip
    c = client(uri)
    for r in result.runs:
        tags = c.get_run(r.run_id).data.tags
        assert tags["dstui.revision"] == r.revision and tags["dstui.repeat"] == str(r.repeat)
    text = result.summary_text()
    assert "revision main: folders run0..run2 taken as numbered from 0 (repeats 0..2)" in text
    assert "revision v0.12.0: folders run1..run3 taken as numbered from 1 (repeats 0..2)" in text
    assert "[revision v0.12.0, repeat 0]" in text
