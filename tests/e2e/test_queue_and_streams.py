"""Issue 40, item 7 (what was only partly right), with real processes, a real store and a real server.

- a supervisor killed between one run's end and the next start: the queue goes on, nobody runs dstui;
- a SIGSTOP'd supervisor: `dstui status` says so;
- an MLflow server failing every third request, and one down for half a minute: every point arrives once;
- two ranks printing the seed's line: each step once, none torn (each rank's output read apart);
- exit.json, metrics.jsonl, phase.json: 0600 (tests/e2e/test_argv_secrets.py, a real DeepSpeed run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cluster_fixtures import free_port
from helpers import REPO, dstui, first_batch, mlflow_client, wait_until

from dstui.core.rundir import BatchDir, RunDir

pytestmark = pytest.mark.e2e

FAKE = str(REPO / "tests" / "programs" / "fake_runner.py")
PROXY = str(REPO / "tests" / "programs" / "flaky_proxy.py")
RANK_SEED = str(REPO / "tests" / "programs" / "rank_seed.py")


def fake(name: str, steps: int, interval: float = 0.05) -> dict:
    return {"name": name, "command": [sys.executable, FAKE, "--metrics-file", "{metrics_file}", "--steps", str(steps),
                                      "--interval", str(interval)]}  # fmt: skip


def write_spec(home: Path, name: str, conditions: list[dict], **settings) -> Path:
    data = {"name": name, "settings": {"kind": "command", "metrics_format": "jsonl", "steps": 10, "warmup_steps": 0, **settings},
            "conditions": conditions}  # fmt: skip
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def wait_for(pred, timeout: float = 180, every: float = 0.1, what: str = "condition"):  # noqa: ANN001, ANN201
    return wait_until(pred, timeout, every, what)


def the_batch(home: Path) -> BatchDir:
    return first_batch(home)  # type: ignore[return-value]


def supervisor_pid(b: BatchDir) -> int:
    return int(b.lock_file.read_text().split()[1])


def steps_of(client, rd: RunDir, key: str = "loss") -> list[int]:
    return [m.step for m in sorted(client.get_metric_history(rd.status()["mlflow_run_id"], key), key=lambda m: m.step)]


# ---- the queue after a supervisor's death -----------------------------------------------------


def test_the_queue_advances_when_the_supervisor_dies_between_two_runs(home: Path) -> None:
    """The supervisor is frozen while the first run ends (its wrapper finds it alive), then killed before it
    starts the second: nobody runs dstui, and the second run must start anyway."""
    spec = write_spec(home, "gap", [fake("first", 12, 0.25), fake("second", 3)], steps=12)
    mlflow_client().search_experiments()
    dstui("run", "--detach", str(spec), check=True)
    b = the_batch(home)
    first = wait_for(lambda: b.runs() and b.runs()[0].state == "running" and b.runs()[0], what="first running")
    second = b.runs()[1]
    sup = supervisor_pid(b)
    os.kill(sup, signal.SIGSTOP)  # alive, holding the lock, doing nothing
    try:
        wait_for(lambda: first.exit_file.exists(), what="first job ended")
        time.sleep(1.0)  # its wrapper has looked and found the batch supervised
        assert second.state == "queued"
    finally:
        os.kill(sup, signal.SIGKILL)  # now it dies in the gap: the first run ended, the second not started
    killed = time.time()
    wait_for(lambda: second.state in ("starting", "running", "done"), timeout=60, what="the second run started")
    started_after = time.time() - killed
    wait_for(lambda: b.info().get("finalized"), what="batch finalized without anyone calling dstui")
    assert [r.state for r in b.runs()] == ["done", "done"]
    client = mlflow_client()
    assert steps_of(client, first) == list(range(1, 13)) and steps_of(client, second) == [1, 2, 3]
    assert "starting one" in b.log_file.read_text()  # the batch's standby took over
    print(f"\nsecond run started {started_after:.1f} s after the supervisor was killed in the gap")


def test_a_stopped_supervisor_is_shown_as_stopped(home: Path) -> None:
    spec = write_spec(home, "frozen", [fake("long", 400, 0.2)], steps=400)
    dstui("run", "--detach", str(spec), check=True)
    b = the_batch(home)
    wait_for(lambda: b.runs() and b.runs()[0].state == "running", what="running")
    sup = supervisor_pid(b)
    os.kill(sup, signal.SIGSTOP)
    try:
        out = dstui("status")
        assert f"the supervisor (pid {sup}) is stopped" in out.stdout and f"kill -CONT {sup}" in out.stdout, out.stdout
        doc = json.loads(dstui("status", "--json").stdout)
        assert any("is stopped" in n for n in doc["batches"][0]["notes"]), doc["batches"][0]
    finally:
        os.kill(sup, signal.SIGCONT)
    assert "is stopped" not in dstui("status").stdout
    dstui("cancel", b.id)
    wait_for(lambda: b.info().get("finalized"), what="finalized")


# ---- a tracking server that keeps failing -----------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, empty_db: Path) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("flaky-server")
    shutil.copy(empty_db, root / "mlflow.db")
    port = free_port()
    with open(root / "server.log", "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "MLFLOW_TRACKING_URI": ""},
        )  # fmt: skip
    try:
        import urllib.request

        def up() -> bool:
            assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(up, timeout=180, every=0.3, what="mlflow server")
        yield {"root": root, "port": port}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.fixture
def proxy(server: dict, tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> dict:
        port = free_port()
        stats = tmp_path / f"proxy-{port}.json"
        procs.append(subprocess.Popen([sys.executable, PROXY, "--target", f"127.0.0.1:{server['port']}", "--port", str(port),
                                       "--stats", str(stats), *args]))  # fmt: skip
        time.sleep(0.5)
        return {"uri": f"http://127.0.0.1:{port}", "stats": stats}

    yield start
    for p in procs:
        p.kill()
        p.wait()


def counts(stats: Path) -> dict:
    return json.loads(stats.read_text()) if stats.exists() else {"requests": 0, "failed": 0}


def every_point_once(client, rd: RunDir, steps: int) -> None:
    for key in ("loss", "iter_time", "mem_peak_gib"):  # memory in GiB in MLflow (tracking/metric_names.py)
        got = sorted(client.get_metric_history(rd.status()["mlflow_run_id"], key), key=lambda m: m.step)
        assert [m.step for m in got] == list(range(1, steps + 1)), key


def test_a_server_failing_every_third_request_gets_every_point_once(home: Path, proxy, server: dict) -> None:
    p = proxy("--fail-every", "3")
    spec = write_spec(home, "third", [fake("a", 100)], steps=100)
    started = time.time()
    dstui("run", "--detach", str(spec), env={"MLFLOW_TRACKING_URI": p["uri"]}, check=True)
    b = the_batch(home)
    wait_for(lambda: b.info().get("finalized"), timeout=240, what="batch finalized through the flaky server")
    took = time.time() - started
    rd = b.runs()[0]
    direct = mlflow_client(f"http://127.0.0.1:{server['port']}")  # read past the proxy
    every_point_once(direct, rd, 100)
    assert direct.get_run(rd.status()["mlflow_run_id"]).info.status == "FINISHED"
    c = counts(p["stats"])
    assert c["failed"] >= 5  # the server did fail along the way
    print(f"\nevery third request failing: 300 step points once each, batch finalized in {took:.0f} s; "
          f"{c['requests']} requests, {c['failed']} failed")


def test_a_server_down_for_a_while_gets_every_point_once_after_it_answers(home: Path, proxy, server: dict, tmp_path: Path) -> None:
    outage = tmp_path / "outage"
    outage.touch()
    p = proxy("--fail-every", "1000000", "--down-while", str(outage))
    spec = write_spec(home, "outage", [fake("a", 60)], steps=60)
    dstui("run", "--detach", str(spec), env={"MLFLOW_TRACKING_URI": p["uri"]}, check=True)
    b = the_batch(home)
    rd = wait_for(lambda: b.runs() and b.runs()[0], what="run folder")
    wait_for(lambda: rd.state == "done", what="run done while the server fails")
    time.sleep(40)  # a sustained outage
    seen = counts(p["stats"])
    outage.unlink()
    answered = time.time()
    wait_for(lambda: b.info().get("finalized"), timeout=180, what="finalized once the server answers")
    delivered_after = time.time() - answered
    every_point_once(mlflow_client(f"http://127.0.0.1:{server['port']}"), rd, 60)
    # backing off: the supervisor's tries (a request and its immediate retry: failures within 2 s) come
    # further and further apart (5 s, 10 s, 20 s, ... +-20%), not every 5 s for as long as it lasts
    tries = [t for i, t in enumerate(seen["failed_at"]) if i == 0 or t - seen["failed_at"][i - 1] > 2.0]
    gaps = [round(b - a, 1) for a, b in zip(tries, tries[1:], strict=False)]
    assert len(gaps) >= 2 and max(gaps) >= 12.0 and gaps[-1] > gaps[0], gaps
    print(f"\n40 s outage: {seen['failed']} failed requests in {len(tries)} tries, gaps {gaps} s; every point "
          f"delivered {delivered_after:.0f} s after the server answered again")


# ---- ranks sharing one stream -----------------------------------------------------------------


def test_two_ranks_printing_seed_lines_give_each_step_once(home: Path) -> None:
    steps = 150
    cond = {"name": "ranks", "metrics_format": "seed",
            "command": [sys.executable, "-m", "dstui.execute.injob.ranks", "--nproc", "2", "--master-port", str(free_port()),
                        "--", sys.executable, RANK_SEED, str(steps)]}  # fmt: skip
    spec = write_spec(home, "twoseed", [cond], steps=steps)
    assert dstui("run", str(spec), timeout=300).returncode == 0
    rd = the_batch(home).runs()[0]
    log = rd.log_file.read_text()
    whole = [ln for ln in log.splitlines() if ln.startswith("Epoch 1, Step ") and ln.endswith("alloc_mem: 1 peak_mem: 2")]
    assert len(whole) == 2 * steps, "a rank's line was torn"
    client = mlflow_client()
    assert steps_of(client, rd) == list(range(1, steps + 1))  # none lost, none twice
    st = rd.status()
    assert st["repeated_steps"] == steps and not st.get("bad_lines"), st  # the other rank's copy of each step
