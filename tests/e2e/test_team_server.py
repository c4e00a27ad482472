"""A team's tracking server: `mlflow server` on a real PostgreSQL, fed and read by dstui.

One real CPU smoke batch streams into the server. The same batch (its run
folders, copied) is then ingested a second time into a local SQLite store by a
supervisor, so both stores hold exactly the same points. The report from the
server must equal the report from SQLite, and the report's direct-SQL fast path
must read the same values from PostgreSQL as from SQLite.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from cluster_fixtures import TeamServer, team_server_fixture  # noqa: F401 - the `team_server` fixture
from helpers import SPECS, dstui, mlflow_client

from dstui.core.rundir import BatchDir, list_batches

# one xdist worker runs the module in order: one PostgreSQL + mlflow server (a session fixture) for the module
pytestmark = pytest.mark.xdist_group("team-server")


def reingest_into(batch: BatchDir, runs_root: Path, tracking_uri: str) -> BatchDir:
    """A copy of a finished batch whose supervisor sends everything again, to another store."""
    copy = BatchDir(runs_root / batch.id)
    shutil.copytree(batch.path, copy.path, ignore=shutil.ignore_patterns("supervisor.lock", "supervisor.log"))
    info = copy.info()
    for key in ("mlflow_parent_run_id", "finalized", "ended"):
        info.pop(key, None)
    info["tracking_uri"] = tracking_uri
    copy.batch_file.write_text(json.dumps(info))
    for rd in copy.runs():
        st = rd.status()
        st.pop("mlflow_run_id", None)
        rd.status_file.write_text(json.dumps(st))
        rd.ingest_file.unlink()
    return copy


def normalised(report: str, *uris: str) -> str:
    """Report text without what names the store (its URI, MLflow's run ids, how histories were read) and the clock."""
    for uri in uris:
        report = report.replace(uri, "<store>")
    report = re.sub(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d UTC", "Generated <time>", report)
    report = re.sub(r"Metric histories read [^;]*;", "Metric histories read <how>;", report)
    return re.sub(r"\b[0-9a-f]{32}\b", "<run-id>", report)


@pytest.mark.e2e
def test_smoke_batch_on_postgres_server_reports_like_sqlite(home: Path, team_server: TeamServer) -> None:
    data = yaml.safe_load((SPECS / "smoke.yaml").read_text())
    data["name"] = "team"
    data["settings"].update(steps=4, warmup_steps=1)
    data["axes"] = {"zero_stage": [0, 1]}
    spec = home / "team.yaml"
    spec.write_text(yaml.safe_dump(data))
    server = {"MLFLOW_TRACKING_URI": team_server.uri}
    out = dstui("run", "--quiet", str(spec), env=server, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    (batch,) = list_batches(home / "runs")
    assert batch.info()["tracking_uri"] == team_server.uri

    sqlite_uri = f"sqlite:///{home}/mlruns/mlflow.db"
    copy = reingest_into(batch, home / "copy", sqlite_uri)
    assert dstui("supervise", str(copy.path), timeout=300).returncode == 0
    assert copy.info().get("finalized")

    srv, local = mlflow_client(team_server.uri), mlflow_client(sqlite_uri)
    for rd in batch.runs():  # every point in both stores
        a = srv.get_metric_history(rd.status()["mlflow_run_id"], "loss")
        b = local.get_metric_history(json.loads((copy.path / rd.name / "status.json").read_text())["mlflow_run_id"], "loss")
        assert [(m.step, m.value, m.timestamp) for m in a] == [(m.step, m.value, m.timestamp) for m in b]
        assert [m.step for m in a] == [1, 2, 3, 4]

    reports = {}
    for name, uri in (("server", team_server.uri), ("sqlite", sqlite_uri)):
        folder = home / f"report-{name}"
        r = dstui("report", "-e", "team", "-b", batch.id, "-o", str(folder), "--no-mlflow-artifact", env={"MLFLOW_TRACKING_URI": uri})
        assert r.returncode == 0, r.stdout + r.stderr
        reports[name] = normalised((folder / "report.md").read_text(), team_server.uri, sqlite_uri)
    assert "z0" in reports["server"] and "z1" in reports["server"]
    assert reports["server"] == reports["sqlite"]


@pytest.mark.e2e
def test_report_fast_path_reads_postgres_like_sqlite(home: Path, team_server: TeamServer) -> None:
    """fetch_histories: plain SQL on PostgreSQL, the API through the server; same values as SQLite."""
    from dstui.analysis.fetch import fetch_histories, fetch_runs

    sqlite_uri = f"sqlite:///{home}/mlruns/mlflow.db"
    points = [(f"k{i}", float(step) / (i + 1), 1_700_000_000_000 + step, step) for i in range(3) for step in range(1, 51)]
    points.append(("loss", float("nan"), 1_700_000_000_051, 51))
    from dstui.tracking import client as tracking

    for uri in (team_server.uri, sqlite_uri):
        c = mlflow_client(uri)
        exp = tracking.ensure_experiment(c, "fastpath")
        if not c.search_runs([exp], "tags.`dstui.role` = 'run'"):
            rid = tracking.create_run(c, exp, "r", tags={"dstui.role": "run", "dstui.batch": "b1"})
            tracking.log_metrics(c, rid, points)
    got = {}
    for uri, method in ((team_server.db_uri, "sql"), (team_server.uri, "api"), (sqlite_uri, "sqlite")):
        c = mlflow_client(team_server.uri if uri == team_server.db_uri else uri)
        _, runs = fetch_runs(c, "fastpath")
        assert fetch_histories(c, uri, runs) == method
        got[method] = {k: (s.tolist(), [repr(x) for x in v.tolist()]) for k, (s, v) in runs[0].history.items()}
    assert got["sql"] == got["api"] == got["sqlite"]
    assert got["sql"]["loss"] == ([51], ["nan"])


@pytest.mark.e2e
def test_import_into_the_server_keeps_every_step(home: Path, team_server: TeamServer) -> None:
    """`dstui import` of seed-format logs into the server, read back exactly; a report from it."""
    logs = home / "seed-logs"
    logs.mkdir()
    steps = [(s, 11.0 / s + s * 1e-7, 0.25 + s / 1000) for s in range(1, 31)]
    (logs / "z2_run.log").write_text("".join(
        f"Epoch 1, Step {s}, Loss: {loss!r} sync: True time: {t!r} alloc_mem: {s * 1000} peak_mem: {s * 2000}\n"
        for s, loss, t in steps
    ))  # fmt: skip
    server = {"MLFLOW_TRACKING_URI": team_server.uri}
    out = dstui("import", str(logs), "--experiment", "seed-import", env=server)
    assert out.returncode == 0 and "imported 1 run(s), 30 steps" in out.stdout, out.stdout + out.stderr
    c = mlflow_client(team_server.uri)
    (run,) = c.search_runs([c.get_experiment_by_name("seed-import").experiment_id], "tags.`dstui.role` = 'run'")
    assert [(m.step, m.value) for m in sorted(c.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)] == [
        (s, loss) for s, loss, _ in steps
    ]
    r = dstui("report", "-e", "seed-import", "-o", str(home / "rep"), "--no-mlflow-artifact", env=server)
    assert r.returncode == 0 and (home / "rep" / "report.md").is_file(), r.stdout + r.stderr
