"""A requeued Slurm run's attempts in one metrics file: each step once, the first attempt to log it wins.

The rule (dstui.core.attempt_steps) on its own, through the records reader, through the
supervisor's ingestion into a real SQLite MLflow store (written in arbitrary pieces, with
supervisor crashes between reading and sending), and the job script line that opens an
attempt, run by bash. The same on a real Slurm cluster: tests/e2e/test_slurm_nodes.py.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import sink_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.core.attempt_steps import AttemptSteps
from dstui.core.record_file import read_records
from dstui.core.records import seed_line
from dstui.core.rundir import RunDir, merge_status, write_json_atomic
from dstui.execute import ingest
from dstui.execute.backends.slurm_script import attempt_line, job_script
from dstui.execute.follow import RunFollower
from dstui.execute.ingest import Tracked
from dstui.spec.experiment import RunSpec, SlurmOptions
from dstui.spec.settings import Settings

EXAMPLES = settings(max_examples=int(os.environ.get("FUZZ_N", "100")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
STORE_EXAMPLES = settings(EXAMPLES, max_examples=int(os.environ.get("FUZZ_N", "15")))  # each one a real MLflow run


@st.composite
def attempts(draw: st.DrawFn) -> list[list[tuple[int, float, str]]]:
    """Each attempt's (step, value, metric) records in order: it restarts from step 1, or resumes from a
    checkpoint at or before where the last one got; a step's loss record may be followed by an lr record."""
    out: list[list[tuple[int, float]]] = []
    top = 0
    for _ in range(draw(st.integers(1, 4))):
        start = draw(st.sampled_from([1, max(1, top - draw(st.integers(0, 3))), top + 1]))
        end = start + draw(st.integers(0, 8))
        recs = []
        for s in range(start, end):
            for key in ("loss", "lr")[: draw(st.integers(1, 2))]:
                recs.append((s, draw(st.integers(-4000, 4000)) / 4, key))  # exact in a seed line too
        out.append(recs)
        top = max([top, *(s for s, _, _ in recs)])
    return out


def only(runs: list, fmt: str) -> list:
    """The records a format can carry: a seed line is one loss."""
    return [[r for r in recs if fmt == "jsonl" or r[2] == "loss"] for recs in runs]


def expected(runs: list, key: str = "loss") -> list[tuple[int, float]]:
    """What MLflow must hold: every step any attempt logged, with the values of the first attempt that logged it."""
    first: dict[int, int] = {}
    for i, recs in enumerate(runs):
        for s, _, _ in recs:
            first.setdefault(s, i)
    return sorted((s, v) for i, recs in enumerate(runs) for s, v, k in recs if first[s] == i and k == key)


def repeats(runs: list) -> int:
    """Step records of a later attempt at or below the highest step of the attempts before it."""
    n, top = 0, None
    for recs in runs:
        floor = top
        for s, _, _ in recs:
            if floor is not None and s <= floor:
                n += 1
            else:
                top = s if top is None else max(top, s)
    return n


def file_of(runs: list, fmt: str) -> bytes:
    """The metrics source a requeued job leaves: an attempt record (as job.sh writes it) before each attempt."""
    out = []
    for n, recs in enumerate(runs):
        out.append(json.dumps({"type": "attempt", "job_id": "7", "restarts": n, "node": "node1", "time": 1}))
        if fmt == "jsonl":
            out.append(json.dumps({"type": "header", "hostname": "node1"}))
        for s, v, key in recs:
            out.append(seed_line(1, s, v, 0.01, 1, 2) if fmt == "seed" else json.dumps({"type": "step", "step": s, key: v}))
        if fmt == "seed":
            out.append("ordinary output between attempts")
    return ("\n".join(out) + "\n").encode()


def loss_steps(recs: list[dict]) -> list[tuple[int, float]]:
    return sorted((r["step"], r["loss"]) for r in recs if r.get("type") == "step" and "loss" in r)


@EXAMPLES
@given(runs=attempts())
def test_the_rule_keeps_each_step_once_with_the_first_attempts_value(runs: list, tmp_path_factory: pytest.TempPathFactory) -> None:
    a = AttemptSteps()
    kept = []
    for n, recs in enumerate(runs):
        assert not a.keep({"type": "attempt"})
        kept += [(s, v, k) for s, v, k in recs if a.keep({"type": "step", "step": s, k: v})]
        assert a.starts == n + 1
    for key in ("loss", "lr"):
        assert sorted((s, v) for s, v, k in kept if k == key) == expected(runs, key)
    assert len({s for s, _, _ in kept}) == len({s for recs in runs for s, _, _ in recs})  # none lost
    assert a.requeues == len(runs) - 1
    assert a.repeated == repeats(runs) == sum(len(r) for r in runs) - len(kept)
    assert AttemptSteps.from_json(json.loads(json.dumps(a.to_json()))) == a
    # a finished file read by reports and imports: the same view
    for fmt in ("jsonl", "seed"):
        p = tmp_path_factory.mktemp("f") / "m"
        p.write_bytes(file_of(only(runs, fmt), fmt))
        assert loss_steps(read_records(p, fmt)) == expected(runs)


def test_odd_saved_state_starts_afresh() -> None:
    for bad in (None, [], {"starts": "2"}, {"floor": True}, {"top": 1.5}):
        assert AttemptSteps.from_json(bad) == AttemptSteps()
    assert AttemptSteps.from_json({"starts": 2, "floor": 9, "top": 12, "repeated": 9}) == AttemptSteps(2, 9, 12, 9)


def test_a_run_without_attempt_records_is_read_as_before() -> None:
    """A local run (no attempt record) that logs a step twice keeps both: nothing is a repeat within an attempt."""
    a = AttemptSteps()
    assert all(a.keep({"type": "step", "step": s}) for s in (1, 2, 2, 1, 3))
    assert a.repeated == 0 and a.requeues == 0


# ---- through the supervisor's ingestion, into a real MLflow store ----

@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, empty_db: Path) -> Iterator[dict]:
    with sink_store(tmp_path_factory.mktemp("requeue"), empty_db, "rq") as store_:
        yield store_


_names = itertools.count()


@STORE_EXAMPLES
@given(runs=attempts(), fmt=st.sampled_from(["jsonl", "seed"]), cuts=st.lists(st.integers(0, 10**6), max_size=6),
       crashes=st.lists(st.booleans(), max_size=8))  # fmt: skip
def test_mlflow_gets_each_step_once_across_attempts_and_supervisor_crashes(
    store: dict, runs: list, fmt: str, cuts: list[int], crashes: list[bool]
) -> None:
    """The file arrives in arbitrary pieces; after some reads the supervisor dies before sending (a new one
    starts from ingest.json). MLflow ends with every step once, the file keeps every record of every attempt."""
    client = store["client"]
    rd = RunDir(store["batch"].path / f"r{next(_names)}")
    rd.path.mkdir()
    write_json_atomic(rd.spec_file, {"condition": "c", "settings": {"kind": "command", "metrics_format": fmt}})
    run_id = client.create_run(store["sink"].experiment_id, run_name=rd.name).info.run_id
    merge_status(rd, dict(name=rd.name, state="running", started=time.time(), mlflow_run_id=run_id))
    source = rd.log_file if fmt == "seed" else rd.metrics_file
    runs = only(runs, fmt)
    data = file_of(runs, fmt)
    t = Tracked.load(rd, fmt)
    pieces = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for i, (a, b) in enumerate(itertools.pairwise(pieces)):
        with open(source, "ab") as fh:
            fh.write(data[a:b])
        t.pending.extend(ingest.read_points(t, on_header=lambda rec: None))
        if i < len(crashes) and crashes[i]:
            t = Tracked.load(rd, fmt)  # died before sending: the next supervisor reads from the saved offsets
        else:
            store["sink"].flush(t, force=True)
    follower = RunFollower(store["batch"], store["sink"], None, system_interval_s=3600)
    follower.tracked[rd.name] = t
    follower.attempts[rd.name] = 1
    merge_status(rd, dict(state="done", ended=time.time(), exit_code=0))
    follower.follow(rd)  # drain, send, finalize: the real pass
    assert t.finalized, store["sink"].error
    for key in ("loss", "lr"):
        assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) == expected(runs, key)
    st_ = rd.status()
    assert st_.get("requeues", 0) == len(runs) - 1
    assert st_.get("repeated_steps", 0) == repeats(only(runs, fmt))
    assert source.read_bytes() == data  # nothing of any attempt lost from the file


# ---- the job script's side ----

def test_job_script_requeues_only_when_asked_and_opens_each_attempt(tmp_path: Path) -> None:
    """requeue > 0: --requeue (Slurm may requeue the job); 0: --no-requeue. Every start of the script appends
    one attempt record to the metrics file, ending a line the killed attempt left unfinished first."""
    run = RunSpec(experiment="x", condition="c", settings=Settings())
    rd = RunDir(tmp_path / "c-r0")
    rd.path.mkdir()
    assert "#SBATCH --requeue" in job_script(run, rd, SlurmOptions(), port=1).splitlines()
    assert "#SBATCH --no-requeue" in job_script(run, rd, SlurmOptions(requeue=0), port=1).splitlines()
    line = attempt_line(run, rd)
    assert line in job_script(run, rd, SlurmOptions(), port=1).splitlines()
    env = {**os.environ, "SLURM_JOB_ID": "42"}
    subprocess.run(["bash", "-c", line], check=True, env=env)  # first start: no SLURM_RESTART_COUNT
    rd.metrics_file.open("a").write('{"type": "step", "step": 1, "loss": 2.0}\n{"type": "step", "step": 2, "lo')  # killed mid-line
    subprocess.run(["bash", "-c", line], check=True, env={**env, "SLURM_RESTART_COUNT": "1"})
    lines = rd.metrics_file.read_text().splitlines()
    assert [json.loads(ln)["restarts"] for ln in lines if '"attempt"' in ln] == [0, 1]
    assert json.loads(lines[-1]) == {"type": "attempt", "job_id": "42", "restarts": 1, "node": os.uname().nodename,
                                     "time": json.loads(lines[-1])["time"]}  # fmt: skip
    assert lines[-2] == '{"type": "step", "step": 2, "lo'  # the torn line stays a bad line of its own
    seed = RunSpec(experiment="x", condition="c", settings=Settings(kind="command", command=["prog"], metrics_format="seed"))
    out = subprocess.run(["bash", "-c", attempt_line(seed, rd)], check=True, env=env, capture_output=True, text=True).stdout
    assert json.loads(out)["type"] == "attempt"  # the job's output is a seed run's metrics source
