"""The CLI for scripts and for people, from run folders (nothing launched; the real CLI in-process).

`status --json/--jsonl` hold every run's state, step and reason; exit statuses are the
documented ones (core/exit_codes); the table fits 80 columns and `-v` shows a long reason
whole; the runs home is found from any folder; references with patterns name batches and runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import fuzz_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dstui import cli
from dstui.commands._select import select_runs
from dstui.core import exit_codes, paths
from dstui.core.errors import NotFound
from dstui.core.rundir import BatchDir, write_json_atomic

pytestmark = pytest.mark.no_store  # nothing here reads MLflow

LONG_REASON = (
    "Python: RuntimeError: the data loader could not open /data/shards/shard-00001.parquet; check that the "
    "dataset was downloaded and that --data-dir points at it (see docs/DATA.md, section 'first run')"
)
CONTROL_REASON = "boom \x1b[31mred\x1b[0m\nsecond line"


def make_batch(runs_root: Path, batch_id: str, runs: list[tuple[str, str, int, str | None]], created: float) -> BatchDir:
    """A batch folder as the supervisor leaves it: (name, state, steps done, reason) per run."""
    path = runs_root / batch_id
    for order, (name, state, done, reason) in enumerate(runs):
        rd = path / name
        rd.mkdir(parents=True)
        write_json_atomic(rd / "spec.json", {"name": name, "order": order, "settings": {"kind": "command"}})
        write_json_atomic(rd / "status.json", {
            "name": name, "state": state, "steps_done": done, "steps_total": 20, "reason": reason,
            "started": created, "last": {"loss": 1.5, "iter_time": 0.04, "mem_peak": 150_000} if done else {},
        })  # fmt: skip
    write_json_atomic(path / "batch.json", {"id": batch_id, "experiment": batch_id.split("-")[0],
                                            "runs": [r[0] for r in runs], "created": created, "finalized": True})  # fmt: skip
    return BatchDir(path)


@pytest.fixture(autouse=True)
def _library_logs_restored():
    """cli.main routes library warnings for the process: undo it for the tests after these."""
    import logging

    from dstui.core import library_logs

    yield
    logging.captureWarnings(False)
    for name in library_logs.LIBRARY_LOGGERS:
        if library_logs._installed is not None:  # noqa: SLF001 - the filter this module put there
            logging.getLogger(name).removeFilter(library_logs._installed)  # noqa: SLF001
    library_logs._installed = None  # noqa: SLF001


@pytest.fixture
def batches(home: Path) -> tuple[BatchDir, BatchDir]:
    old = make_batch(home / "runs", "alpha-20260101-000000", [("a-r0", "done", 20, None), ("b-r0", "done", 20, None)], 1.0e9)
    new = make_batch(home / "runs", "beta-20260102-000000", [
        ("a-r0", "done", 20, None),
        ("z2-r0", "failed", 7, LONG_REASON),
        ("z3-r0", "killed", 3, "cancelled"),
        ("z4-r0", "queued", 0, CONTROL_REASON),
    ], 2.0e9)  # fmt: skip
    return old, new


def cli_run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_json_holds_every_run(batches, capsys) -> None:
    code, out, _ = cli_run(capsys, "status", "--json", "--no-takeover")
    doc = json.loads(out)  # stdout is only the document
    assert code == exit_codes.RUN_FAILED == doc["exit_code"]  # a failed and a killed run are shown
    assert doc["runs_dir"] == str(paths.runs_dir()) and doc["home_source"] == "DSTUI_HOME"
    assert [b["batch"] for b in doc["batches"]] == ["beta-20260102-000000", "alpha-20260101-000000"]
    runs = {r["run"]: r for r in doc["batches"][0]["runs"]}
    assert {k: (r["state"], r["step"], r["reason"]) for k, r in runs.items()} == {
        "a-r0": ("done", 20, None),
        "z2-r0": ("failed", 7, LONG_REASON),  # whole
        "z3-r0": ("killed", 3, "cancelled"),
        "z4-r0": ("queued", 0, CONTROL_REASON),
    }
    assert all(r["batch"] == "beta-20260102-000000" and "phase" in r for r in runs.values())
    assert doc["batches"][0]["counts"] == {"done": 1, "failed": 1, "killed": 1, "queued": 1}


def test_status_jsonl_and_exit_zero_without_failures(batches, capsys) -> None:
    code, out, _ = cli_run(capsys, "status", "--jsonl", "--no-takeover", "alpha-*")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == exit_codes.OK
    assert [(d["batch"], [r["state"] for r in d["runs"]]) for d in lines] == [("alpha-20260101-000000", ["done", "done"])]


def test_status_human_fits_80_columns_and_v_shows_reason_whole(batches, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = cli_run(capsys, "status", "--no-takeover", "-n", "1")
    assert code == exit_codes.RUN_FAILED
    table = out.splitlines()
    header = next(line for line in table if line.startswith("run "))
    assert header.split()[-1] == "reason"  # on screen at 80 columns
    assert all(len(line) <= 80 for line in table if not line.startswith("runs: ")), out
    assert "\x1b" not in out  # run output never reaches the terminal raw
    row = next(line for line in table if line.startswith("z2-r0"))
    assert row.endswith("…") and "docs/DATA.md" not in out and "-v shows them whole" in out
    code, out, _ = cli_run(capsys, "status", "--no-takeover", "-n", "1", "-v")
    assert " ".join(out.split()).count(LONG_REASON) == 1  # wrapped, whole


def test_status_says_where_it_looked(home, capsys) -> None:
    code, out, _ = cli_run(capsys, "status")
    assert code == exit_codes.NOT_FOUND
    assert f"no batches under {home / 'runs'} (set by DSTUI_HOME)" in out
    code, out, _ = cli_run(capsys, "status", "--json")
    assert code == exit_codes.NOT_FOUND and json.loads(out)["batches"] == []
    code, _, err = cli_run(capsys, "status", "nosuch-batch")
    assert code == exit_codes.NOT_FOUND and "no batch 'nosuch-batch'" in err


def test_runs_home_from_any_folder(tmp_path, monkeypatch) -> None:
    """DSTUI_HOME, else a project's runs/ found upward (one with a batch), else ~/.local/share/dstui."""
    monkeypatch.delenv("DSTUI_HOME", raising=False)
    monkeypatch.delenv("DSTUI_RUNS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "runs").mkdir(parents=True)  # a runs/ without batches (TensorBoard's, say) is not a home
    monkeypatch.chdir(elsewhere)
    assert paths.home_choice() == paths.HomeChoice(tmp_path / "xdg" / "dstui", "default")
    assert paths.mlruns_dir() == tmp_path / "xdg" / "dstui" / "mlruns"  # the store beside the runs
    project = tmp_path / "proj"
    make_batch(project / "runs", "p-20260101-000000", [("a-r0", "done", 20, None)], 1.0e9)
    (project / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(project / "src" / "deep")
    assert paths.home_choice() == paths.HomeChoice(project, "project")
    assert paths.runs_dir() == project / "runs" and paths.mlruns_dir() == project / "mlruns"
    monkeypatch.setenv("DSTUI_HOME", str(elsewhere))
    assert paths.home_choice().source == "DSTUI_HOME" and paths.home_label() == "runs: $DSTUI_HOME/runs"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.delenv("DSTUI_HOME")
    monkeypatch.chdir(elsewhere)
    assert paths.default_home() == Path.home() / ".local" / "share" / "dstui"


def test_references_name_batches_runs_and_patterns(batches) -> None:
    old, new = batches

    def names(*refs: str) -> list[str]:
        return [f"{rd.batch.id}/{rd.name}" for rd in select_runs(list(refs))]

    assert names("beta-20260102-000000") == [f"{new.id}/{n}" for n in ("a-r0", "z2-r0", "z3-r0", "z4-r0")]
    assert names("a-r0") == [f"{new.id}/a-r0"]  # a bare run name: the newest batch that has it
    assert names(f"{old.id}/a-r0") == [f"{old.id}/a-r0"]  # any batch, not only the newest
    assert names("*/a-r0") == [f"{new.id}/a-r0", f"{old.id}/a-r0"]
    assert names("alpha-*") == [f"{old.id}/a-r0", f"{old.id}/b-r0"]
    assert names("z[23]-*") == [f"{new.id}/z2-r0", f"{new.id}/z3-r0"]
    assert names(str(old.path), "alpha-*/b-r0") == [f"{old.id}/a-r0", f"{old.id}/b-r0"]  # once each
    with pytest.raises(NotFound):
        select_runs(["gamma-*"])


def test_cancel_of_a_batch_and_unknown_refs(batches, capsys) -> None:
    """Queued runs of an unsupervised batch end at once; ended runs are left; nothing found is exit 3."""
    _, new = batches
    code, out, err = cli_run(capsys, "cancel", new.id, "--json")
    doc = json.loads(out)
    assert code == exit_codes.OK
    assert [r["run"] for r in doc["cancelled"]] == ["z4-r0"]
    assert sorted(r["run"] for r in doc["already_ended"]) == ["a-r0", "z2-r0", "z3-r0"]
    st = (new.path / "z4-r0" / "status.json").read_text()
    assert json.loads(st)["state"] == "killed"
    code, _, err = cli_run(capsys, "cancel", "nosuch")
    assert code == exit_codes.NOT_FOUND and "no batch or run matches 'nosuch'" in err


def test_retry_of_a_whole_batch_needs_failed(batches, capsys) -> None:
    _, new = batches
    code, _, err = cli_run(capsys, "retry", new.id)
    assert code == exit_codes.BAD_INPUT and "--failed" in err
    code, _, err = cli_run(capsys, "retry", "alpha-*", "--failed")
    assert code == exit_codes.NOT_FOUND and "no failed or killed runs" in err


def test_retry_of_a_done_run_needs_force_and_touches_nothing_without(batches, capsys) -> None:
    """All or nothing: a done run among failed ones refuses the lot (exit 2, the way out named)."""
    _, new = batches
    before = {rd.name: rd.status() for rd in new.runs()}
    code, out, err = cli_run(capsys, "retry", f"{new.id}/a-r0", f"{new.id}/z2-r0")
    assert code == exit_codes.BAD_INPUT and out == ""
    assert f"{new.id}/a-r0: is done" in err and "--force" in err and "z2-r0" not in err
    assert {rd.name: rd.status() for rd in new.runs()} == before
    assert not any((rd.path / "attempts").exists() for rd in new.runs())


def test_exit_codes_in_every_help(capsys) -> None:
    for argv in (["--help"], ["status", "--help"], ["run", "--help"], ["cancel", "--help"], ["list", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert re.sub(r"\s+", " ", exit_codes.HELP) in re.sub(r"\s+", " ", out), argv


def test_progress_lines_have_a_header_and_aligned_columns(batches) -> None:
    """`dstui run`'s progress: a header once, then lines whose cells sit under it (80 columns: the reason stays)."""
    from dstui.commands._tables import ProgressLines

    _, new = batches
    progress = ProgressLines(new, width=80)
    first = progress.lines(new.runs()[1])
    assert len(first) == 2 and progress.lines(new.runs()[0]) == [progress.line(new.runs()[0])]  # the header once
    header, line = first
    assert header.split()[:3] == ["run", "state", "step"] and header.split()[-1] == "reason"
    assert line.startswith("z2-r0") and line[header.index("step"):].startswith("7/20")
    assert line[header.index("reason"):].startswith("Python: RuntimeError") and len(line) <= 80


def test_library_warnings_go_to_the_log(home, capsys) -> None:
    """As DeepSpeed does on import: a logger with its own stdout handler, added after dstui routed it."""
    import logging
    import sys
    import warnings

    from dstui.core import library_logs

    with warnings.catch_warnings():  # routed once already, inside a block that puts the old showwarning
        library_logs.route()  # back on exit (pytest's per-test one, a library's)
    path = library_logs.route()
    ds = logging.getLogger("DeepSpeed")
    handler = logging.StreamHandler(sys.stdout)
    ds.addHandler(handler)
    try:
        ds.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        with warnings.catch_warnings():  # an earlier test's import (transformers) may have filtered this text out
            warnings.simplefilter("always")
            warnings.warn("torch says: TypedStorage is deprecated", UserWarning, stacklevel=1)
    finally:
        ds.removeHandler(handler)
    out, err = capsys.readouterr()
    assert "Setting accelerator" not in out + err and "TypedStorage" not in out + err
    assert path == home / "logs" / "libraries.log"
    text = path.read_text()
    assert "DeepSpeed WARNING Setting accelerator to CPU" in text and "TypedStorage is deprecated" in text


def test_list_fits_80_columns_and_names_what_cannot_work_here(home, capsys, monkeypatch) -> None:
    """A wrapped table puts half a value on the next line; "valid" must not read as "can run here"."""
    from dstui.execute import feasibility

    monkeypatch.setenv("COLUMNS", "80")
    spec = Path(__file__).resolve().parents[2] / "configs" / "experiments" / "zero_stages.yaml"
    code, out, _ = cli_run(capsys, "list", str(spec), "--no-history")
    assert code == exit_codes.OK
    assert max(map(len, out.splitlines())) <= 80, out
    assert "the same for every run: revision installed, kind train, model llama-125m" in re.sub(r"\s+", " ", out)
    assert "validated: True" not in out and "the spec and each run's ds_config valid" in out
    for name in ("z1-r0", "z1-dc-r0", "z3-dc-r0"):  # every run still has its row
        assert re.search(rf"^\d+\s+{re.escape(name)}\s", out, re.M), out
    if not feasibility.this_machine().gpus:  # DeepCompile needs a GPU: dstui run refuses these three
        assert "3 cannot work on this machine" in out
        assert re.findall(r"^  run (\S+): deepcompile=true", out, re.M) == ["z1-dc-r0", "z2-dc-r0", "z3-dc-r0"]


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(
    rows=st.integers(1, 6).flatmap(lambda n: st.lists(
        st.lists(st.text(alphabet="abcxyz019.-", min_size=1, max_size=14), min_size=n, max_size=n),
        min_size=1, max_size=6)),
    width=st.integers(30, 140),
)  # fmt: skip
def test_fitted_table_keeps_every_value_or_names_where_it_went(rows: list[list[str]], width: int) -> None:
    from dstui.commands._common import fitted_table, table

    header = ["#", "run", *(f"c{i}" for i in range(len(rows[0]) - 2))][: len(rows[0])]
    droppable = header[2:]
    out = fitted_table(rows, header, width, drop_first=droppable)
    shown_header = out.split("\n")[0].split()
    for i, name in enumerate(header):
        same = len({r[i] for r in rows}) == 1
        if name in shown_header:
            continue
        # a column not in the table is either one value for all (given once) or named as left out
        flat = re.sub(r"\s+", " ", out)
        assert (same and f"{name} {rows[0][i]}" in flat) or (name in flat.split("left out to fit")[-1]), (name, out)
    if max(map(len, table([r[:2] for r in rows], header[:2]).split("\n"))) <= width:
        # what must stay (# and run) fits: then so does everything printed
        assert max(map(len, out.split("\n"))) <= width, out


@pytest.mark.parametrize("argv", [
    ["compare", "--experiment", "x", "--baseline", "y", "--loss-tol", "-1"],
    ["compare", "--experiment", "x", "--baseline", "y", "--loss-tol", "nan"],
    ["report", "-e", "x", "-o", "out", "--tolerance", "inf"],
    ["import", "logs", "--warmup", "-1"],
    ["bisect", "--good", "a", "--bad", "b", "--metric", "loss", "--repeats", "0"],
    ["run", "spec.yaml", "--parallel", "-2"],
    ["status", "-n", "0"],
    ["ui", "--port", "70000"],
    ["cancel", ""],
])  # fmt: skip
def test_out_of_range_numbers_and_empty_refs_are_refused_before_anything_runs(argv, capsys) -> None:
    """`--loss-tol -1` used to run and print '|diff| 0 > -1'; `--loss-tol nan` turned the loss check off."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == exit_codes.BAD_INPUT and "Traceback" not in err
    assert re.search(rf"error: argument {re.escape(argv[-2]) if argv[-1] != '' else 'REF'}", err), err


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8)))
def test_a_tolerance_is_taken_exactly_when_it_is_a_finite_number_at_least_zero(text: str) -> None:
    import argparse
    import math

    from dstui.commands._argtypes import tolerance

    try:
        value = float(text)
        good = math.isfinite(value) and value >= 0
    except ValueError:
        good = False
    if good:
        assert tolerance(text) == float(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            tolerance(text)


def test_bisect_names_its_own_options_and_refuses_a_bare_relative_threshold_of_one_or_more(home, capsys) -> None:
    """'--threshold 5' for iter_time was taken as 500%; a missing condition was blamed on '--only'."""
    spec = str(Path(__file__).resolve().parents[2] / "configs" / "experiments" / "smoke.yaml")
    base = ["bisect", spec, "--good", "a", "--bad", "b", "--repo", str(home), "--no-validate"]
    code, _, err = cli_run(capsys, *base, "--condition", "zz", "--metric", "loss")
    assert code == exit_codes.BAD_INPUT and "field '--condition': no condition matches 'zz'" in err and "--only" not in err
    code, _, err = cli_run(capsys, *base, "--condition", "z1", "--metric", "iter_time", "--threshold", "5")
    assert code == exit_codes.BAD_INPUT and "5 means 500%; write 5% (or 0.05)" in err
