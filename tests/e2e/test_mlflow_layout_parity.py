"""The importer and the supervisor write one MLflow layout (dstui.tracking.layout).

A real batch (a ``kind: command`` run printing the seed's step lines, followed by a
real supervisor) and an import of that very run's log land in one experiment. The
two runs carry the layout's tags, the same metric names and values (memory in GiB),
params under dstui's own names, and neither is nested under its batch's run; the two
batch runs carry the layout's batch tags and no metrics.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from helpers import SPECS, dstui, mlflow_client

from dstui.core.rundir import list_batches
from dstui.execute import mlflow_params
from dstui.spec.settings import Settings
from dstui.tracking import layout
from dstui.tracking import tags as tag_keys

pytestmark = pytest.mark.e2e


def steps_of(client, run) -> dict[str, list[tuple[int, float]]]:  # noqa: ANN001 - MLflow's objects
    keys = [k for k in run.data.metrics if not k.startswith(("system/", "summary.", "time."))]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)) for k in keys}


def test_the_importer_and_the_supervisor_write_one_layout(home: Path) -> None:
    data = yaml.safe_load((SPECS / "seed_format_command.yaml").read_text())
    data["name"] = "parity"
    spec = home / "parity.yaml"
    spec.write_text(yaml.safe_dump(data))
    proc = dstui("run", "--quiet", str(spec), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (batch,) = list_batches(home / "runs")
    (rd,) = batch.runs()
    old = home / "old-results"
    old.mkdir()
    shutil.copy(rd.log_file, old / "echo-steps.log")  # the same seed lines, as an old result folder holds them
    imported = dstui("import", str(old), "--experiment", "parity", timeout=300)
    assert imported.returncode == 0, imported.stdout + imported.stderr

    client = mlflow_client()
    exp = client.get_experiment_by_name("parity").experiment_id
    runs = client.search_runs([exp], filter_string=tag_keys.RUN_FILTER)
    (launched,) = [r for r in runs if tag_keys.RUN_DIR in r.data.tags]
    (from_log,) = [r for r in runs if tag_keys.IMPORTED_FROM in r.data.tags]
    for r in (launched, from_log):
        tags = r.data.tags
        assert set(layout.RUN_TAGS) <= set(tags), set(layout.RUN_TAGS) - set(tags)
        assert tag_keys.PARENT not in tags and tags[tag_keys.STATUS] == "done" and r.info.status == "FINISHED"
        assert r.info.end_time >= r.info.start_time
    # the same lines give the same names, steps and values (memory in GiB under *_gib)
    a, b = steps_of(client, launched), steps_of(client, from_log)
    assert set(a) == set(b) == {"loss", "iter_time", "mem_alloc_gib", "mem_peak_gib"}, (set(a), set(b))
    for key in a:
        assert [s for s, _ in a[key]] == [s for s, _ in b[key]] == [1, 2, 3, 4, 5]
        assert [v for _, v in a[key]] == pytest.approx([v for _, v in b[key]])
    # params: both say how many steps and which are warm-up; the importer's under dstui's names only
    known = {*Settings.model_fields, *mlflow_params.HEADER_PARAMS.values(), *(f"model.{k}" for k in mlflow_params.MODEL_SHAPE)}
    assert {"steps", "warmup_steps"} <= set(launched.data.params) & set(from_log.data.params)
    assert set(from_log.data.params) <= known, set(from_log.data.params) - known
    batch_runs = client.search_runs([exp], filter_string=tag_keys.BATCH_FILTER)
    assert len(batch_runs) == 2
    for r in batch_runs:
        assert set(layout.BATCH_TAGS) <= set(r.data.tags), set(layout.BATCH_TAGS) - set(r.data.tags)
        assert not r.data.metrics and r.info.status == "FINISHED"  # no metrics: in no chart's legend
    assert {r.data.tags[tag_keys.BATCH] for r in batch_runs} == {launched.data.tags[tag_keys.BATCH],
                                                                 from_log.data.tags[tag_keys.BATCH]}  # fmt: skip
