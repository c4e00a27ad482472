"""What a new user's review of `dstui report` / `dstui compare` found, over real MLflow stores.

The spec's description comes from the batch, not from a child run's note; a
missing experiment, batch or baseline exits 3 and an unusable ``-o`` one line
with exit 2, neither leaving a folder behind; the bad-lines table lists only
runs that had bad lines; the appendix shows the ds_config.json each run ran
with, grouped when identical.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_report import BATCH, EXP, STEPS, log_run, store  # noqa: F401

from dstui.cli import main
from dstui.execute.mlflow_runs import batch_note, run_note
from dstui.usecases.report import export_report

NOTE = "mlflow.note.content"
DESCRIPTION = "ZeRO stages 0-3 on tiny-llama: which is fastest at equal loss?"


def _parent(client: Any, exp_id: str, description: str = DESCRIPTION) -> str:
    """A batch parent run with the note the supervisor gives it (dstui.execute.mlflow_runs.batch_note)."""
    info = {"id": BATCH, "spec_path": "configs/experiments/zero.yaml", "runs": ["z0-r0", "z1-r0"],
            "spec": {"description": description, "axes": {"zero_stage": [0, 1]}, "baseline": "z0"}}
    run = client.create_run(exp_id, run_name=BATCH, tags={
        "dstui.role": "batch", "dstui.batch": BATCH, "dstui.spec": "zero.yaml", NOTE: batch_note(info)})
    return run.info.run_id


def _child(client: Any, exp_id: str, parent: str, condition: str, **kw: Any) -> str:
    note = run_note(f"{condition}-r0", {"condition": condition, "revision": "installed", "repeat": 0}, BATCH, exp_id, parent)
    tags = {NOTE: note, **kw.pop("tags", {})}
    return log_run(client, exp_id, parent, condition=condition, tags=tags,
                   history={"iter_time": [(s, 0.1) for s in STEPS], "loss": [(s, 3.0 - 0.1 * s) for s in STEPS]}, **kw)


def test_description_is_the_specs_not_a_child_runs_note(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = _parent(client, exp_id)
    _child(client, exp_id, parent, "z0")
    _child(client, exp_id, parent, "z1")
    md = export_report(EXP, tmp_path / "r", log_artifact=False).read_text()
    assert f"**Description** (from the spec): {DESCRIPTION}\n" in md, md[:1500]
    assert "Run \\`z0-r0\\`" not in md and "of batch" not in md.split("## Summary")[0]
    assert "Batch \\`" not in md.split("## Summary")[0]  # dstui's own lines of the parent's note are not the spec's


def test_no_description_when_the_spec_has_none(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = _parent(client, exp_id, description="")
    _child(client, exp_id, parent, "z0")
    md = export_report(EXP, tmp_path / "r", batch=BATCH, log_artifact=False).read_text()
    assert "**Description**" not in md


def test_nothing_found_exits_3_and_leaves_no_folder(
    store: tuple[Any, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    client, exp_id, _ = store
    parent = _parent(client, exp_id)
    _child(client, exp_id, parent, "z0")
    out = tmp_path / "new" / "report"
    cases = [
        ["report", "-e", "nosuch", "-o", str(out)],
        ["report", "-e", EXP, "--batch", "nosuch", "-o", str(out)],
        ["report", "-e", EXP, "--baseline", "nosuch", "-o", str(out)],
        ["report", "-e", EXP, "--runs", "0123456789abcdef0123456789abcdef", "-o", str(out)],
        ["compare", "--experiment", "nosuch", "--baseline", "stable"],
        ["compare", "--experiment", EXP, "--batch", "nosuch", "--baseline", "installed"],
        ["compare", "--experiment", EXP, "--baseline", "nosuch"],
    ]
    for argv in cases:
        assert main(argv) == 3, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("dstui: error:") == 1, (argv, err)
        assert not (tmp_path / "new").exists(), argv
    assert main(["report", "-e", "nosuch", "-o", str(out), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["exit_code"] == 3


def test_output_that_is_a_file_is_one_line_exit_2(
    store: tuple[Any, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    client, exp_id, _ = store
    _child(client, exp_id, _parent(client, exp_id), "z0")
    afile = tmp_path / "passwd"
    afile.write_text("root:x:0:0\n")
    for target in (afile, afile / "sub"):
        assert main(["report", "-e", EXP, "-o", str(target), "--no-mlflow-artifact", "-q"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "FileExistsError" not in err, err
        assert [line for line in err.splitlines() if line.strip()] == [
            f"dstui: error: cannot write the report into '{target}': "
            + ("it" if target == afile else f"'{afile}'") + " is a file, not a folder"
        ], err
    assert afile.read_text() == "root:x:0:0\n"
    # the same store and a folder that can be made: the report is written there
    assert main(["report", "-e", EXP, "-o", str(tmp_path / "ok"), "--no-mlflow-artifact", "-q"]) == 0
    assert (tmp_path / "ok" / "report.md").is_file()


def test_bad_lines_table_lists_only_runs_with_bad_lines(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = _parent(client, exp_id)
    _child(client, exp_id, parent, "z0", tags={"dstui.bad_metric_lines": "0"})
    _child(client, exp_id, parent, "z1", tags={"dstui.bad_metric_lines": "2",
                                               "dstui.first_bad_line": "not a number: Epoch 1, Step 3, Loss: abc"})
    md = export_report(EXP, tmp_path / "r", log_artifact=False).read_text()
    table = md.split("could not read as metrics")[1].split("\n\n")[1]
    assert "| z1-r0 | 2 | `not a number: Epoch 1, Step 3, Loss: abc` |" in table, table
    assert "z0-r0" not in table and "`0`" not in md


def test_no_bad_lines_table_when_every_count_is_zero(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = _parent(client, exp_id)
    for c in ("z0", "z1"):
        _child(client, exp_id, parent, c, tags={"dstui.bad_metric_lines": "0"})
    md = export_report(EXP, tmp_path / "r", log_artifact=False).read_text()
    assert "could not read as metrics" not in md and "`0`" not in md


def _log_json(client: Any, rid: str, cfg: dict[str, Any], artifact_path: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ds_config.json").write_text(json.dumps(cfg))
        client.log_artifact(rid, str(Path(tmp) / "ds_config.json"), artifact_path=artifact_path)


def test_appendix_shows_the_ds_config_each_run_ran_with(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = _parent(client, exp_id)

    def cfg(stage: int) -> dict[str, Any]:
        return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
                "zero_optimization": {"stage": stage, "overlap_comm": stage > 0}}

    _child(client, exp_id, parent, "z0", ds_config=cfg(0))
    _child(client, exp_id, parent, "z1", ds_config=cfg(0))  # the same file as z0's: one block for both
    z2 = _child(client, exp_id, parent, "z2")
    _log_json(client, z2, cfg(2), artifact_path="run")  # only inside the run folder's artifact
    folder = tmp_path / "runs" / BATCH / "z3-r0"
    folder.mkdir(parents=True)
    (folder / "ds_config.json").write_text(json.dumps(cfg(3)))  # only in the run folder on this machine
    _child(client, exp_id, parent, "z3", tags={"dstui.run_dir": f"{folder}#1"})
    _child(client, exp_id, parent, "imported")  # nothing recorded
    md = export_report(EXP, tmp_path / "r", log_artifact=False).read_text()
    appendix = md.split("### DeepSpeed configs")[1]

    def block(stage: int) -> str:
        return "```json\n" + json.dumps(cfg(stage), indent=2, sort_keys=True) + "\n```"

    assert f"Used by: z0, z1\n\n{block(0)}" in appendix, appendix
    assert f"Used by: z2\n\n{block(2)}" in appendix
    assert f"Used by: z3\n\n{block(3)}" in appendix
    assert appendix.count("Used by:") == 3
    assert "No `ds_config.json` was recorded for: imported-r0." in appendix
    # not the config rebuilt from the ds.* params (stage 1, micro batch 2, nothing else), which no run used
    rebuilt = json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}, indent=2, sort_keys=True)
    assert rebuilt not in md
