"""Names never decide where files land (issue 18): one rule, refused early, checked again at every join.

Unit tests of :mod:`dstui.core.names` and of spec validation, plus a property
test that throws hostile text at every name field of a spec and of the CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from helpers import dstui
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.core import names
from dstui.core.errors import SpecError
from dstui.spec.expand import expand
from dstui.spec.loading import parse_spec

HOSTILE = [
    "../../escaped",
    "../../../../victim",
    "..",
    ".",
    "a/b",
    "a\\b",
    "/abs",
    "-rf",
    ".hidden",
    "a\0b",
    "$(touch pwned)",
    "`id`",
    "a;b",
    "a b",
    "naïve",
    "x" * 101,
    "",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused_with_one_line(name: str) -> None:
    why = names.problem(name)
    assert why and "\n" not in why
    with pytest.raises(SpecError) as e:
        names.check(name, file="s.yaml", condition="c", field="conditions.0.name")
    assert str(e.value).startswith("s.yaml: condition 'c': field 'conditions.0.name': name ")


@pytest.mark.parametrize("name", ["z3", "z3-offcpu", "llama-1.5b", "a_b+c=d", "x" * 100, "0"])
def test_ordinary_names_pass(name: str) -> None:
    assert names.problem(name) is None
    assert names.check(name) == name


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_make_safe_always_obeys_the_rule_and_is_stable(text: str) -> None:
    safe = names.make_safe(text)
    assert names.problem(safe) is None
    assert names.make_safe(text) == safe
    if names.problem(text) is None:
        assert safe == text  # good names are kept as they are


def test_make_safe_keeps_distinct_values_distinct() -> None:
    assert names.make_safe("a/b") != names.make_safe("a_b")
    assert names.make_safe("a/b") != names.make_safe("a\\b")


def test_child_path_refuses_escapes_and_symlinks(tmp_path: Path) -> None:
    assert names.child_path(tmp_path, "run-r0") == tmp_path.resolve() / "run-r0"
    for bad in ("..", "../x", "a/b", ""):
        with pytest.raises(names.UnsafePath):
            names.child_path(tmp_path, bad)
    outside = tmp_path / "outside"
    outside.mkdir()
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "link").symlink_to(outside)
    with pytest.raises(names.UnsafePath, match="not inside"):
        names.child_path(parent, "link")
    assert names.inside(parent, parent / "x") and not names.inside(parent, outside) and not names.inside(parent, parent)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "../x"}, "field 'name'"),
        ({"name": "ok", "conditions": [{"name": "../../escaped", "zero_stage": 1}]}, "field 'conditions.0.name'"),
        ({"name": "ok", "revisions": [{"name": "v/1", "installed": True}]}, "field 'revisions.0.name'"),
    ],
)
def test_spec_names_are_refused_at_validation(data: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        expand(parse_spec(data, file="spec.yaml"), file="spec.yaml")
    msg = str(e.value)
    assert msg.startswith("spec.yaml: ") and field in msg and "\n" not in msg


def test_axis_values_become_safe_names() -> None:
    spec = parse_spec({"name": "ax", "axes": {"dataset": ["../../evil", "a/b", "a_b", "plain"], "zero_stage": [1]}})
    runs = expand(spec)
    assert [names.problem(r.name) for r in runs] == [None] * 4
    conds = [r.condition for r in runs]
    assert conds[3] == "datasetplain" and conds[2] == "dataseta_b"  # safe values keep their name
    assert conds[1].startswith("dataseta_b-") and conds[0].startswith("dataset.._.._evil-")
    assert len(set(conds)) == 4


def test_duplicate_condition_names_are_refused() -> None:
    data = {"name": "dup", "conditions": [{"name": "a"}, {"name": "a"}, {"name": "a-1"}]}
    with pytest.raises(SpecError, match="conditions.1.name.*'a' is used twice"):
        expand(parse_spec(data, file="s.yaml"), file="s.yaml")


def test_colliding_run_names_are_refused() -> None:
    # condition 'a-v2' under the default revision and condition 'a' under revision 'v2' both make 'a-v2-r0'
    data = {
        "name": "clash",
        "conditions": [{"name": "a"}, {"name": "a-v2"}],
        "revisions": [{"name": "installed", "installed": True}, {"name": "v2", "pypi": "0.18.0"}],
    }
    with pytest.raises(SpecError, match="run name 'a-v2-r0'"):
        expand(parse_spec(data, file="s.yaml"), file="s.yaml")


# -- the property test over every name field, through the CLI ---------------

hostile_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=40),
    st.text(alphabet="./\\\0$`;|&<>'\" -", max_size=12),
    st.just("y" * 400),
)


def _tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.e2e  # the CLI in subprocesses
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec_name=hostile_text, cond=hostile_text, rev=hostile_text, axis=hostile_text, experiment=hostile_text)
def test_every_cli_name_field_is_refused_or_stays_inside(
    tmp_path_factory: pytest.TempPathFactory, spec_name: str, cond: str, rev: str, axis: str, experiment: str
) -> None:
    home = tmp_path_factory.mktemp("home")
    specs = tmp_path_factory.mktemp("specs")
    before = _tree(home.parent)
    data = {
        "name": spec_name,
        "settings": {"kind": "command", "command": [sys.executable, "-c", "pass"], "steps": 2, "warmup_steps": 0},
        "axes": {"model": [axis, "m"]},
        "conditions": [{"name": cond}],
        "revisions": [{"name": rev, "installed": True}],
    }
    path = specs / "spec.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    env = {"DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlruns/m.db"}
    for args in (["run", "--dry-run", str(path)], ["list", str(path)]):
        proc = dstui(*args, env=env, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 2), proc.stderr
        if proc.returncode == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # nothing outside the home and spec folders appeared
    after = _tree(home.parent)
    new = {p for p in after - before if not (p.is_relative_to(home) or p.is_relative_to(specs))}
    assert new == set()
    assert all(p.is_relative_to(home / "runs") or p.is_relative_to(home / "mlruns") for p in _tree(home))
    assert not os.path.exists(home.parent / "escaped")


def test_batch_folders_are_claimed_race_free(tmp_path: Path) -> None:
    import tempfile
    import threading

    from dstui.core.rundir import BatchDir
    from dstui.execute.creation import TEMP_PREFIX, claim

    made: list[Path] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            tmp = BatchDir(Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=tmp_path)))
            made.append(claim(tmp, tmp_path, "same", lambda bid: {"id": bid}).path)
        except BaseException as e:  # noqa: BLE001 - the test counts every failure
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(made) == len(set(made)) == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in made)


def test_long_run_names_are_still_listed(tmp_path: Path) -> None:
    from dstui.core.rundir import BatchDir

    long_name = f"{'c' * 100}-{'v' * 100}-r0"
    (tmp_path / long_name).mkdir()
    (tmp_path / "outside").mkdir()
    b = BatchDir(tmp_path)
    b.update_info(runs=[long_name, "../outside", ".."])
    assert [r.name for r in b.runs()] == [long_name]  # tampered entries are ignored
