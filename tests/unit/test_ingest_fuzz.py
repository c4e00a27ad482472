"""Property-based fuzz of ingestion (issue 33.1): no run output and no old log can break it.

Against one real SQLite MLflow store per module: hostile lines (arbitrary bytes, lines
longer than the read size, steps beyond 64 bits, ``Loss: abc``, NaN and numbers too large
for a float, metric names MLflow refuses, deeply nested JSON) between valid steps, written
in arbitrary pieces while the supervisor's follower reads. Nothing raises, every valid step
reaches MLflow exactly once, bad lines are counted, and the run ends FINISHED. The same
hostile logs through `dstui import`'s parser and importer: no traceback, every valid step
once, no empty parent and no run left RUNNING.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import HEAVY, fuzz_examples, sink_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.core.records import parse_seed_line, seed_line
from dstui.core.rundir import RunDir, merge_status, write_json_atomic
from dstui.execute import ingest
from dstui.execute.follow import RunFollower
from dstui.execute.ingest import Tracked
from dstui.importer.parse import parse_log
from dstui.importer.seedlogs import import_dir

FUZZ = settings(max_examples=fuzz_examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SMALL_LINE = 4096  # the follower's read size here: oversize lines without writing megabytes
_steps = itertools.count(1)  # step numbers never repeat across examples: each example's steps are its own


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, empty_db: Path) -> Iterator[dict]:
    """One real MLflow store for the module, a batch folder, and one MLflow child run the examples share."""
    with sink_store(tmp_path_factory.mktemp("fuzz"), empty_db, "fuzz") as store_:
        client, sink = store_["client"], store_["sink"]
        run_id = client.create_run(sink.experiment_id, run_name="shared", tags={"dstui.role": "run"}).info.run_id
        yield {**store_, "run_id": run_id}


# ---- what a run writes ----

def _valid(fmt: str, step: int, loss: float) -> tuple[bytes, float]:
    """A valid step line and the loss MLflow must then hold at that step."""
    if fmt == "seed":
        line = seed_line(1, step, loss, 0.01, 100, 200)
        return (line + "\n").encode(), parse_seed_line(line)["loss"]
    return (json.dumps({"type": "step", "time": time.time(), "step": step, "loss": loss, "iter_time": 0.01}) + "\n").encode(), loss


HOSTILE_KINDS = ("letters", "huge_step", "negative_huge_step", "nan", "too_large", "bad_name", "nested", "oversize")


def _hostile(fmt: str, kind: str, step: int, filler: str) -> bytes:
    """One line that looks like a record and cannot be one: every kind must be counted as a bad line."""
    if fmt == "seed":
        text = {
            "letters": f"Epoch 1, Step {step}, Loss: abc{filler[:5]} sync: True",
            "huge_step": f"Epoch 1, Step {10**30}, Loss: 1.5",
            "negative_huge_step": f"Epoch 1, Step {10**19}, Loss: 1.5 time: x",
            "nan": f"Epoch 1, Step {step}, Loss: nan",
            "too_large": f"Epoch 1, Step {step}, Loss: 1e999",
            "bad_name": f"Epoch 1, Step {step}, Loss: -inf",
            "nested": f"Epoch 1, Step {step}, Loss: {'9' * 5000}e5000",
            "oversize": "Epoch 1, Step 1, Loss: 1.0 " + (filler or "x") * (3 * SMALL_LINE // max(1, len(filler or "x"))),
        }[kind]
    else:
        text = {
            "letters": json.dumps({"type": "step", "step": step, "loss": "abc" + filler[:5]}),
            "huge_step": f'{{"type": "step", "step": {10**30}, "loss": 1.5}}',
            "negative_huge_step": f'{{"type": "step", "step": {-(2**63 + 1)}, "loss": 1.5}}',
            "nan": f'{{"type": "step", "step": {step}, "loss": NaN}}',
            "too_large": f'{{"type": "step", "step": {step}, "loss": {10**400}}}',
            "bad_name": json.dumps({"type": "step", "step": step, "../" + filler[:8]: 1.0}),
            "nested": f'{{"type": "step", "step": {step}, "loss": {"[" * 1500}1{"]" * 1500}}}',
            "oversize": json.dumps({"type": "step", "step": step, "loss": 1.0, "pad": (filler or "x") * (3 * SMALL_LINE)}),
        }[kind]
    return (text.replace("\n", " ") + "\n").encode("utf-8", "replace")


@st.composite
def run_outputs(draw: st.DrawFn) -> tuple[str, bytes, dict[int, float], int, int]:
    """(format, everything the run writes, {step: loss} MLflow must hold, how many bad lines at least,
    the first step number this example uses)."""
    fmt = draw(st.sampled_from(["jsonl", "seed"]))
    first = next(_steps)
    out = bytearray()
    expected: dict[int, float] = {}
    bad = 0
    for _ in range(draw(st.integers(0, 12))):
        what = draw(st.sampled_from(["valid", "valid", "hostile", "bytes"]))
        if what == "valid":
            step = next(_steps)
            loss = draw(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))
            line, expected[step] = _valid(fmt, step, loss)
            out += line
        elif what == "hostile":
            filler = draw(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8))
            out += _hostile(fmt, draw(st.sampled_from(HOSTILE_KINDS)), next(_steps), filler)
            bad += 1
        else:  # arbitrary bytes: ordinary output in a log, bad lines in a metrics file; never a step
            out += draw(st.binary(max_size=64)).replace(b"Epoch", b"E") + b"\n"
    return fmt, bytes(out), expected, bad, first


def _new_run(store: dict, fmt: str) -> RunDir:
    rd = RunDir(store["batch"].path / f"r{next(_steps)}")
    rd.path.mkdir()
    write_json_atomic(rd.spec_file, {"condition": "c", "settings": {"kind": "command", "metrics_format": fmt}})
    merge_status(rd, dict(name=rd.name, state="running", started=time.time(), mlflow_run_id=store["run_id"]))
    store["client"].update_run(store["run_id"], status="RUNNING")
    return rd


@FUZZ
@given(output=run_outputs(), cuts=st.lists(st.integers(0, 10**6), max_size=6))
@HEAVY
def test_no_run_output_breaks_the_follower_the_parsers_or_the_mlflow_sink(store: dict, output: tuple, cuts: list[int]) -> None:
    fmt, data, expected, bad, first = output
    rd = _new_run(store, fmt)
    source = rd.log_file if fmt == "seed" else rd.metrics_file
    t = Tracked.load(rd, fmt)
    t.metrics.max_line = SMALL_LINE
    follower = RunFollower(store["batch"], store["sink"], None, system_interval_s=3600)
    follower.tracked[rd.name] = t
    follower.attempts[rd.name] = rd.status().get("attempt", 1)  # this attempt's state: the follower keeps it
    # the run writes in arbitrary pieces (a line may be cut anywhere); the supervisor reads between them
    pieces = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in itertools.pairwise(pieces):
        with open(source, "ab") as fh:
            fh.write(data[a:b])
        t.pending.extend(ingest.read_points(t, on_header=lambda rec: None))
    merge_status(rd, dict(state="done", ended=time.time(), exit_code=0))
    follower.follow(rd)  # send, drain, finalize: the real pass
    assert t.finalized, store["sink"].error
    client = store["client"]
    got = [(m.step, m.value) for m in client.get_metric_history(store["run_id"], "loss") if m.step >= first]
    assert sorted(got) == sorted(expected.items())  # every valid step once; nothing of a hostile line
    assert t.metrics.bad_lines >= bad
    assert (rd.status().get("bad_lines") or 0) == t.metrics.bad_lines
    if bad:
        assert t.metrics.first_bad and len(t.metrics.first_bad) < 200
    run = client.get_run(store["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["dstui.bad_metric_lines"] == str(t.metrics.bad_lines)


def test_a_line_longer_than_the_read_size_is_skipped_counted_and_the_reader_moves_on(tmp_path: Path) -> None:
    """The real size: a 9 MiB line with no newline in a full 8 MiB read (it used to be re-read forever)."""
    from dstui.core.records import Follower

    p = tmp_path / "m.jsonl"
    p.write_bytes(b'{"type": "step", "step": 1}\n' + b"y" * (9 << 20) + b'\n{"type": "step", "step": 2}\n')
    f = Follower(p)
    lines = []
    for _ in range(5):
        lines += [line for line, _ in f.read_lines()]
    assert lines == ['{"type": "step", "step": 1}', '{"type": "step", "step": 2}']
    assert f.offset == p.stat().st_size and f.bad_lines == 1 and f.first_bad.startswith("line longer than")
    # a reader restarted inside the long line (offset and flag from ingest.json) does not hand out its rest
    g = Follower(p, offset=(8 << 20) + 100, skipping=True)
    assert [line for line, _ in g.read_lines()] + [line for line, _ in g.read_lines()] == ['{"type": "step", "step": 2}']


def test_json_nested_past_the_recursion_limit_is_a_bad_line_not_a_crash() -> None:
    from dstui.core.records import parse_record

    line = '{"type": "step", "step": 1, "loss": ' + "[" * 200_000 + "1" + "]" * 200_000 + "}"
    rec, problem = parse_record(line, "jsonl")
    assert rec is None and problem.startswith("broken JSON")


# ---- dstui import ----

@st.composite
def old_logs(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, float]], int]:
    """(a seed-format log, the (step, loss) an import keeps, in order; how many malformed lines at least).

    Steps come in any order. A step at or below the highest one so far is a restarted job's
    repeat, which the first attempt wins (dstui.core.attempt_steps): not kept, counted.
    """
    out = bytearray()
    valid: list[tuple[int, float]] = []
    bad = 0
    top = -1
    for _ in range(draw(st.integers(0, 10))):
        what = draw(st.sampled_from(["valid", "valid", "hostile", "bytes"]))
        if what == "valid":
            step = draw(st.integers(0, 2**63 - 1))
            loss = draw(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))
            line, value = _valid("seed", step, loss)
            out += line
            if step > top:
                valid.append((step, value))
                top = step
        elif what == "hostile":
            kind = draw(st.sampled_from([k for k in HOSTILE_KINDS if k != "oversize"]))
            out += _hostile("seed", kind, draw(st.integers(0, 1000)), draw(st.text(max_size=8)))
            bad += 1
        else:
            out += draw(st.binary(max_size=64)).replace(b"Epoch", b"E").replace(b"=", b"-").replace(b"Loss", b"L") + b"\n"
    return bytes(out), valid, bad


@FUZZ
@given(log=old_logs())
def test_import_parser_never_raises_and_hands_out_every_valid_step_once(tmp_path: Path, log: tuple) -> None:
    data, valid, bad = log
    f = tmp_path / "fuzz.log"
    f.write_bytes(data)
    seen: list[tuple[int, float]] = []
    parsed = parse_log(f, keep_steps=False, on_step=lambda i, rec: seen.append((rec["step"], rec.get("loss"))))
    assert seen == valid  # a step with nothing storable (a NaN loss alone) is counted, not imported
    assert parsed.malformed >= bad and parsed.step_count == len(valid)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(log=old_logs())
@HEAVY
def test_import_makes_runs_only_for_what_it_imports_and_leaves_none_running(store: dict, tmp_path_factory: pytest.TempPathFactory, log: tuple) -> None:
    data, valid, _bad = log
    folder = tmp_path_factory.mktemp("old")
    (folder / "train.log").write_bytes(data)
    client = store["client"]
    exp = client.get_experiment_by_name("imported")
    before = {r.info.run_id for r in client.search_runs([exp.experiment_id])} if exp else set()
    result = import_dir(folder, "imported", tracking_uri=store["uri"])
    exp = client.get_experiment_by_name("imported")
    new = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_id not in before] if exp else []
    assert all(r.info.status in ("FINISHED", "FAILED") for r in new)
    if not valid:
        assert not result.runs and not new and not result.parent_run_id  # no empty parent run
        return
    (child,) = [r for r in new if r.info.run_id != result.parent_run_id]
    got = sorted((m.step, m.value) for m in client.get_metric_history(child.info.run_id, "loss"))
    assert got == sorted(valid)
