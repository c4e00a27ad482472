"""dstui's MLflow layout on a real SQLite store: names and units, ends after starts, the experiment's view.

The writer (dstui.tracking.layout, metric_names, chart_view) puts memory in GiB under
``*_gib`` names and a run's phases under ``time.*``; readers (analysis) get bytes and
``time/*`` back, from runs written either way. A run is never ended before MLflow has
it starting, and the experiment's "dstui" view is MLflow's saved-view envelope.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dstui.analysis import fetch
from dstui.analysis.rundata import run_from_mlflow
from dstui.tracking import chart_view, layout, metric_names
from dstui.tracking import tags as tag_keys

EXP = "layout"


@pytest.fixture
def store(tmp_path: Path, empty_db: Path) -> tuple[Any, str, str]:
    from dstui.tracking import client as tracking

    shutil.copy(empty_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = tracking.client(uri)
    return c, c.create_experiment(EXP, artifact_location=(tmp_path / "artifacts").as_uri()), uri


keys = st.one_of(
    st.sampled_from(["loss", "iter_time", "mem_peak", "mem_alloc", "summary.mem_peak_max", "summary.iter_time_mean",
                     "time/launch", "time/wall", "system/cpu_utilization_percentage", "lr"]),  # fmt: skip
    st.from_regex(r"(summary\.)?(mem_|time/)?[a-z_]{1,12}", fullmatch=True),
)


@given(key=keys, value=st.floats(min_value=0, max_value=1e15, allow_nan=False))
def test_a_metric_comes_back_as_it_was_recorded(key: str, value: float) -> None:
    name, scaled = metric_names.to_mlflow(key, value)
    if key.startswith("time/"):
        assert name.startswith("time.") and "/" not in name  # inside "Model metrics", not a section above it
    back, unscaled = metric_names.from_mlflow(name, scaled)
    assert back == key and unscaled == pytest.approx(value, rel=1e-12, abs=1e-9)


def test_memory_is_gib_and_old_names_pass_through() -> None:
    assert metric_names.to_mlflow("mem_peak", 520_000_000) == ("mem_peak_gib", pytest.approx(0.4843, abs=1e-4))
    assert metric_names.to_mlflow("summary.mem_peak_max", 2**31) == ("summary.mem_peak_max_gib", 2.0)
    assert metric_names.to_mlflow("system/system_memory_usage_megabytes", 5.0)[0] == "system/system_memory_usage_megabytes"
    # a run written before: bytes under mem_peak, phases under time/; both beside a new twin: the new one counts
    assert metric_names.metrics_from_mlflow({"mem_peak": 7.0, "time/init": 2.0}) == {"mem_peak": 7.0, "time/init": 2.0}
    assert metric_names.metrics_from_mlflow({"mem_peak_gib": 1.0, "mem_peak": 7.0}) == {"mem_peak": 2.0**30}


def _run(c: Any, exp: str, name: str, start_s: float | None = None, **kw: Any) -> str:
    return layout.open_child(c, exp, layout.ChildRun(name=name, batch="b1", condition=name, **kw), start_s=start_s)


def test_readers_get_bytes_and_time_slash_from_either_layout(store: tuple[Any, str, str]) -> None:
    c, exp, uri = store
    new = _run(c, exp, "new")
    t = int(time.time() * 1000)
    layout.log_points(c, new, [("mem_peak", 3 * 2**30, t, 1), ("mem_peak", 5 * 2**30, t, 2), ("loss", 2.0, t, 1),
                               ("summary.mem_peak_max", 5 * 2**30, t, 0), ("time/init", 4.5, t, 0)])  # fmt: skip
    old = _run(c, exp, "old")  # as dstui logged before: no translation
    from dstui.tracking import client as tracking

    tracking.log_metrics(c, old, [("mem_peak", 7.0, t, 1), ("time/init", 1.5, t, 0)])
    assert set(c.get_run(new).data.metrics) == {"mem_peak_gib", "loss", "summary.mem_peak_max_gib", "time.init"}
    for method in ("sqlite", "api"):
        runs = {r.run_name: r for r in (run_from_mlflow(x) for x in c.search_runs([exp]))}
        if method == "api":
            fetch._histories_api(c, list(runs.values()), progress=None)
        else:
            assert fetch.fetch_histories(c, uri, list(runs.values())) == "sqlite"
        n, o = runs["new"], runs["old"]
        assert n.metrics["summary.mem_peak_max"] == 5 * 2**30 and n.metrics["time/init"] == 4.5
        assert n.history["mem_peak"][1].tolist() == [3 * 2**30, 5 * 2**30], method
        assert "mem_peak_gib" not in n.history and o.history["mem_peak"][1].tolist() == [7.0]
        assert o.metrics["time/init"] == 1.5


def test_a_run_never_ends_before_it_starts(store: tuple[Any, str, str]) -> None:
    c, exp, _ = store
    start = time.time()
    rid = _run(c, exp, "late", start_s=start)
    layout.end_run(c, rid, "killed", ended_s=start - 0.508)  # the cancel came first: -508 ms before
    info = c.get_run(rid).info
    assert info.end_time == info.start_time and info.status == "KILLED"
    rid = _run(c, exp, "skipped", start_s=start)
    layout.end_run(c, rid, "skipped", ended_s=start)
    assert c.get_run(rid).info.status == "KILLED"  # never launched: not a failure


def test_batch_status_says_how_its_runs_went() -> None:
    assert layout.batch_status(["done", "skipped"]) == "FINISHED"
    assert layout.batch_status(["done", "killed", "failed"]) == "FAILED"
    assert layout.batch_status(["done", "killed"]) == "KILLED"


def test_an_attempt_is_found_by_its_tags_and_by_the_older_folder_hash(store: tuple[Any, str, str]) -> None:
    c, exp, _ = store
    rid = _run(c, exp, "r", run_dir="/runs/b1/r-r0", attempt=2)
    tags = c.get_run(rid).data.tags
    assert tags[tag_keys.RUN_DIR] == "/runs/b1/r-r0" and tags[tag_keys.ATTEMPT] == "2"
    assert layout.find_child(c, exp, "/runs/b1/r-r0", 2).info.run_id == rid
    assert layout.find_child(c, exp, "/runs/b1/r-r0", 1) is None
    old = c.create_run(exp, run_name="r", tags={tag_keys.RUN_DIR: "/runs/b1/r-r0#1", tag_keys.ROLE: "run"}).info.run_id
    assert layout.find_child(c, exp, "/runs/b1/r-r0", 1).info.run_id == old
    assert tag_keys.run_attempt(tags) == ("/runs/b1/r-r0", 2)
    assert tag_keys.run_attempt({tag_keys.RUN_DIR: "/runs/b1/r-r0#3"}) == ("/runs/b1/r-r0", 3)


def test_the_dstui_view_is_mlflows_saved_view_and_an_edited_one_is_kept(store: tuple[Any, str, str]) -> None:
    c, exp, _ = store
    chart_view.describe(c, exp, description="ZeRO 1 vs 2", axes=["zero_stage", "lr"])
    tags = c.get_experiment(exp).tags
    envelope = json.loads(tags[chart_view.VIEW_TAG])
    assert envelope["name"] == chart_view.VIEW_NAME and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["searchFilter"] == "tags.`dstui.role` = 'run'"  # the batch run in no chart
    sections = [s["name"] for s in state["compareRunSections"]]
    assert sections[:3] == ["Training", "Summary", "Time"] and state["isAccordionReordered"] is True
    training = [ch["metricKey"] for ch in state["compareRunCharts"] if ch["metricSectionId"] == "dstui-training"]
    assert training[:2] == ["loss", "iter_time"] and "mem_peak_gib" in training
    (lr,) = [ch for ch in state["compareRunCharts"] if ch.get("metricKey") == "lr"]
    assert lr["scaleType"] == "log"
    (parallel,) = [ch for ch in state["compareRunCharts"] if ch["type"] == "PARALLEL"]
    assert parallel["selectedParams"] == ["zero_stage", "lr"] and parallel["selectedMetrics"] == ["summary.iter_time_mean"]
    assert tags[tag_keys.DESCRIPTION] == "ZeRO 1 vs 2"
    chart_view.describe(c, exp)  # an import into it does not know the axes: the view stays as the batch wrote it
    assert c.get_experiment(exp).tags[chart_view.VIEW_TAG] == tags[chart_view.VIEW_TAG]
    # someone saves the view again from MLflow's UI ("Overwrite view"): dstui leaves theirs alone
    edited = json.dumps({"name": "mine", "createdAt": 1, "updatedAt": 2, "state": envelope["state"]})
    c.set_experiment_tag(exp, chart_view.VIEW_TAG, edited)
    chart_view.describe(c, exp, axes=["zero_stage"])
    assert c.get_experiment(exp).tags[chart_view.VIEW_TAG] == edited


def test_a_long_view_is_deflated_as_mlflow_reads_it() -> None:
    import base64
    import zlib

    value = json.loads(chart_view.view_tag_value([f"setting_{i}_{'x' * 200}" for i in range(100)]))
    assert value["state"].startswith(chart_view.COMPRESSED)
    state = json.loads(zlib.decompress(base64.b64decode(value["state"][len(chart_view.COMPRESSED) :])))
    assert len(state["compareRunCharts"]) > 20 and len(json.dumps(value)) < chart_view.TAG_LIMIT


def test_varied_settings_are_the_axes_and_what_conditions_set() -> None:
    spec = {"axes": {"zero_stage": [1, 2]}, "conditions": [{"name": "a", "lr": 1e-4, "env": {"X": "1"}}, {"name": "b", "lr": 1e-3}]}
    assert chart_view.varied_settings(spec) == ["zero_stage", "lr"]


def test_a_dataset_input_names_what_a_train_run_read(store: tuple[Any, str, str]) -> None:
    c, exp, _ = store
    rid = _run(c, exp, "ds")
    settings = {"kind": "train", "dataset": "tiny-corpus", "dataset_percent": 100.0, "seq_length": 64}
    assert layout.log_dataset(c, rid, settings) == "tiny-corpus"
    (inp,) = c.get_run(rid).inputs.dataset_inputs
    assert inp.dataset.name == "tiny-corpus" and inp.dataset.source_type == "local"
    assert [(t.key, t.value) for t in inp.tags] == [("mlflow.data.context", "training")]
    assert layout.dataset_of({**settings, "seq_length": 128})["digest"] != inp.dataset.digest  # other tokens
    assert layout.dataset_of({"kind": "command", "dataset": "x"}) is None  # a command does not say what it read
    assert layout.dataset_of({"kind": "verify", "dataset": "tiny-corpus"}) is None  # makes its own batches
    hf = layout.dataset_of({"dataset": "wikitext", "dataset_config": "wikitext-2-raw-v1"})
    assert hf is not None and hf["name"] == "wikitext/wikitext-2-raw-v1" and hf["source_type"] == "hugging_face"


def test_tags_are_text_mlflow_keeps(store: tuple[Any, str, str]) -> None:
    c, exp, _ = store
    rid = _run(c, exp, "long", extra={tag_keys.CMD: "x" * 20000, tag_keys.HOSTNAME: None, "dstui.flag": True})
    tags = c.get_run(rid).data.tags
    assert len(tags[tag_keys.CMD]) == layout.DESCRIPTION_MAX and tags["dstui.flag"] == "true"
    assert tag_keys.HOSTNAME not in tags  # None: not known, so not this machine's name either
